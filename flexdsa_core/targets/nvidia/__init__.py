"""The nvidia vendor: NVIDIA Jetson Orin Nano through TensorRT.

In this folder: its spec ``orin-nano.json``, the adapter with its legalisations (``adapter.py``) and the bundle's
``templates/build_engine.py``; no toolchain installs here.
"""

from __future__ import annotations

from flexdsa_core.targets.nvidia.adapter import ADAPTER

__all__ = ["ADAPTER"]
