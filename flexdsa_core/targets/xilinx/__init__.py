"""The xilinx vendor: AMD/Xilinx Kria KV260 DPU through Vitis AI.

In this folder: its spec ``kv260.json`` and the adapter (``adapter.py``); quantised by the amd toolchain (it lists this
target), with the quantise script shared with amd (``targets/templates/quantize_vitis_ai.py``).
"""

from __future__ import annotations

from flexdsa_core.vendors import lazy_exports

__all__ = ["ADAPTER"]
__getattr__ = lazy_exports(__name__, ADAPTER="adapter")
