"""The cpu_ort vendor: a generic CPU running ONNX Runtime's CPU execution provider (the calibrated target).

In this folder: its spec ``cpu-ort.json`` and the adapter with its legalisations (``adapter.py``).
"""

from __future__ import annotations

from flexdsa_core.targets.cpu_ort.adapter import ADAPTER

__all__ = ["ADAPTER"]
