"""The qualcomm vendor: Qualcomm Snapdragon 8 Gen 3 Hexagon NPU through ONNX Runtime's QNN execution provider.

In this folder: its spec ``sm8650.json``, the adapter (``adapter.py``), the toolchain (``toolchain.py``) and its ``driver.py``, run
in the toolchain's environment, and the bundle's ``templates/compile_qnn.py`` and ``templates/run_qnn.py``.
"""

from __future__ import annotations

from flexdsa_core.vendors import lazy_exports

__all__ = ["ADAPTER", "TOOLCHAIN"]
__getattr__ = lazy_exports(__name__, ADAPTER="adapter", TOOLCHAIN="toolchain")
