"""The rockchip vendor: Rockchip RK3588 NPU through rknn-toolkit2.

In this folder: its spec ``rk3588.json``, the adapter and its legalisations (``adapter.py``), the toolchain (``toolchain.py``) and
its ``driver.py``, run in the toolchain's environment, ``rknn_hybrid.py`` (imported by the driver and shipped in
the bundle) and the bundle's ``templates/convert_rknn.py``.
"""

from __future__ import annotations

from flexdsa_core.vendors import lazy_exports

__all__ = ["ADAPTER", "TOOLCHAIN"]
__getattr__ = lazy_exports(__name__, ADAPTER="adapter", TOOLCHAIN="toolchain")
