"""The qualcomm vendor: Qualcomm Snapdragon 8 Gen 3 Hexagon NPU through ONNX Runtime's QNN execution provider.

In this folder: spec ``sm8650.json``, adapter ``adapter.py``, toolchain ``toolchain.py`` and its ``driver.py``, the bundle's scripts in ``templates/``."""

from __future__ import annotations

from flexdsa_core.targets.qualcomm.adapter import ADAPTER
from flexdsa_core.targets.qualcomm.toolchain import TOOLCHAIN

__all__ = ["ADAPTER", "TOOLCHAIN"]
