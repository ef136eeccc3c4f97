"""The fusion rule library, found by discovery: every module here exporting ``RULES`` contributes, in
``rewrites.ordered`` order (each rule after those its ``after`` names; ties by module name, then as listed)."""

from __future__ import annotations

import importlib
import pkgutil
from functools import cache

from flexdsa_core.fusions.base import FusionRule, make_rule
from flexdsa_core.rewrites import ordered

__all__ = ["FusionRule", "discover_rules", "make_rule"]


@cache
def discover_rules() -> tuple[FusionRule, ...]:
    rules: dict[str, FusionRule] = {}
    for info in pkgutil.iter_modules(__path__):
        if info.name.startswith("_") or info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for rule in getattr(module, "RULES", ()):
            if rule.name in rules:
                raise RuntimeError(
                    f"fusion rule name {rule.name!r} defined twice (second in {module.__name__})"
                )
            rules[rule.name] = rule
    return ordered(rules.values())
