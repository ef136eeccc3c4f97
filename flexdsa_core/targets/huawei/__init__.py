"""The huawei vendor: Huawei Ascend 310B through ATC, the CANN offline compiler.

In this folder: its spec ``ascend310b.json`` and the adapter with its legalisations (``adapter.py``); no toolchain installs here.
"""

from __future__ import annotations

from flexdsa_core.vendors import lazy_exports

__all__ = ["ADAPTER"]
__getattr__ = lazy_exports(__name__, ADAPTER="adapter")
