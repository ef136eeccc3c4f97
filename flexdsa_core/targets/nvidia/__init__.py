"""The nvidia vendor: NVIDIA Jetson Orin Nano through TensorRT (no toolchain installs here).

In this folder: spec ``orin-nano.json``, adapter ``adapter.py``, the bundle's scripts in ``templates/``."""

from __future__ import annotations

from flexdsa_core.targets.nvidia.adapter import ADAPTER

__all__ = ["ADAPTER"]
