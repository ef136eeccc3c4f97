"""The xilinx vendor: AMD/Xilinx Kria KV260 DPU through Vitis AI (quantised by the amd toolchain).

In this folder: spec ``kv260.json``, adapter ``adapter.py``."""

from __future__ import annotations

from flexdsa_core.targets.xilinx.adapter import ADAPTER

__all__ = ["ADAPTER"]
