"""The cpu_ort vendor: a generic CPU running ONNX Runtime's CPU execution provider (the calibrated target).

In this folder: its spec ``cpu-ort.json`` and the adapter with its legalisations (``adapter.py``).
"""

from __future__ import annotations

from flexdsa_core.vendors import lazy_exports

__all__ = ["ADAPTER"]
__getattr__ = lazy_exports(__name__, ADAPTER="adapter")
