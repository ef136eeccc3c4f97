"""The rockchip vendor: Rockchip RK3588 NPU through rknn-toolkit2.

In this folder: spec ``rk3588.json``, adapter ``adapter.py``, toolchain ``toolchain.py`` and its ``driver.py``, the bundle's scripts in ``templates/``."""

from __future__ import annotations

from flexdsa_core.targets.rockchip.adapter import ADAPTER
from flexdsa_core.targets.rockchip.toolchain import TOOLCHAIN

__all__ = ["ADAPTER", "TOOLCHAIN"]
