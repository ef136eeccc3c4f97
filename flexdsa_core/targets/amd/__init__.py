"""The amd vendor: AMD Ryzen AI XDNA 2 NPU through ONNX Runtime's Vitis AI EP.

In this folder: its spec ``xdna2.json``, the adapter (``adapter.py``), the toolchain AMD Quark (``toolchain.py``, which quantises
for xilinx-kv260 too) and its ``driver.py``, and the bundle's ``templates/run_npu.py``. The quantise script
it shares with xilinx is ``targets/templates/quantize_vitis_ai.py``.
"""

from __future__ import annotations

from flexdsa_core.vendors import lazy_exports

__all__ = ["ADAPTER", "TOOLCHAIN"]
__getattr__ = lazy_exports(__name__, ADAPTER="adapter", TOOLCHAIN="toolchain")
