"""``FusionRule``: one named fusion the Fusion Switcher can take or refuse.

A rule module under ``fusions/`` exports ``RULES: list[FusionRule]``; discovery finds it (no central list).
The rewrite itself is one or more onnxscript ``RewriteRule``s (``pattern`` / ``check`` / ``rewrite``), and
``check`` answers a failed ``MatchResult`` carrying a sentence, never a bare False: those sentences are
what ``fusion_plan.json`` says about refused matches.

``produces`` lists the op keys the rewrite emits ('LayerNormalization', 'com.microsoft::BiasGelu'); the
rule is legal on a target only when the target supports all of them. ``order`` sequences rules that build
on each other (LayerNorm before SkipLayerNorm). Rules sharing an ``alternatives`` group consume the same
nodes at different granularities; the switcher costs each (and "none") and keeps the cheapest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx_ir as ir
from onnxscript.rewriter import RewriteRule, RewriteRuleSet


@dataclass(frozen=True)
class FusionRule:
    name: str
    summary: str
    produces: tuple[str, ...]
    rewrite_rules: tuple[RewriteRule, ...]
    order: int = 100
    alternatives: str | None = None
    # Extra opsets the rewrite needs imported in the model (domain -> version).
    opset_imports: tuple[tuple[str, int], ...] = ()

    def rule_set(self) -> RewriteRuleSet:
        return RewriteRuleSet(list(self.rewrite_rules))

    def apply(self, model: ir.Model, **kwargs) -> int:
        """Apply every match in ``model`` in place; returns the number of rewrites."""
        for domain, version in self.opset_imports:
            model.opset_imports.setdefault(domain, version)
        count = self.rule_set().apply_to_model(model, **kwargs)
        return count


def make_rule(
    name: str,
    summary: str,
    produces: Sequence[str],
    rewrite_rules: Sequence[RewriteRule],
    *,
    order: int = 100,
    alternatives: str | None = None,
    opset_imports: dict[str, int] | None = None,
) -> FusionRule:
    return FusionRule(
        name=name,
        summary=summary,
        produces=tuple(produces),
        rewrite_rules=tuple(rewrite_rules),
        order=order,
        alternatives=alternatives,
        opset_imports=tuple((opset_imports or {}).items()),
    )
