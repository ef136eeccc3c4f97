"""The huawei vendor: Huawei Ascend 310B through ATC (no toolchain installs here).

In this folder: spec ``ascend310b.json``, adapter ``adapter.py``."""

from __future__ import annotations

from flexdsa_core.targets.huawei.adapter import ADAPTER

__all__ = ["ADAPTER"]
