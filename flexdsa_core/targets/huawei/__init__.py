"""The huawei vendor: Huawei Ascend 310B through ATC, the CANN offline compiler.

In this folder: its spec ``ascend310b.json`` and the adapter with its legalisations (``adapter.py``); no toolchain installs here.
"""

from __future__ import annotations

from flexdsa_core.targets.huawei.adapter import ADAPTER

__all__ = ["ADAPTER"]
