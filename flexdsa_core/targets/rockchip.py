"""Rockchip RK3588 (RKNN-Toolkit2): limits beyond the op table, parser legalisation, convert_rknn.py."""

from __future__ import annotations

from flexdsa_core.targets.accelerator import AcceleratorAdapter


class RockchipAdapter(AcceleratorAdapter):
    vendor = "Rockchip"


ADAPTER = RockchipAdapter()
