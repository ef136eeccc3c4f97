"""The nvidia vendor: NVIDIA Jetson Orin Nano through TensorRT.

In this folder: its spec ``orin-nano.json``, the adapter with its legalisations (``adapter.py``) and the bundle's
``templates/build_engine.py``; no toolchain installs here.
"""

from __future__ import annotations

from flexdsa_core.vendors import lazy_exports

__all__ = ["ADAPTER"]
__getattr__ = lazy_exports(__name__, ADAPTER="adapter")
