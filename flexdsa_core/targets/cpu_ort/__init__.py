"""The cpu_ort vendor: a generic CPU running ONNX Runtime's CPU execution provider.

In this folder: spec ``cpu-ort.json``, adapter ``adapter.py``."""

from __future__ import annotations

from flexdsa_core.targets.cpu_ort.adapter import ADAPTER

__all__ = ["ADAPTER"]
