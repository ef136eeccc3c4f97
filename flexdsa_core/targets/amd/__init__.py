"""The amd vendor: AMD Ryzen AI XDNA 2 NPU through the Vitis AI EP; its toolchain (AMD Quark) serves xilinx-kv260 too.

In this folder: spec ``xdna2.json``, adapter ``adapter.py``, toolchain ``toolchain.py`` and its ``driver.py``, the bundle's scripts in ``templates/``."""

from __future__ import annotations

from flexdsa_core.targets.amd.adapter import ADAPTER
from flexdsa_core.targets.amd.toolchain import TOOLCHAIN

__all__ = ["ADAPTER", "TOOLCHAIN"]
