"""``FusionRule``: one named fusion the Fusion Switcher can take or refuse.

A rule module under ``fusions/`` exports ``RULES: list[FusionRule]``; discovery finds it (no central list).
The rewrite itself is one or more onnxscript ``RewriteRule``s (``pattern`` / ``check`` / ``rewrite``), and
``check`` answers a failed ``MatchResult`` carrying a sentence, never a bare False: those sentences are
what ``fusion_plan.json`` says about refused matches.

``produces`` lists the op keys the rewrite emits ('LayerNormalization', 'com.microsoft::BiasGelu'); the
rule is legal on a target only when the target supports all of them. ``after`` names the rules one builds on (SkipLayerNorm
after LayerNorm); the switcher takes rules in ``rewrites.ordered`` order. A rule is a ``rewrites.Rewrite`` of
kind "fusion", so ``disabled_rules``, bisection and the report know it as they know passes and legalisations. Rules sharing an ``alternatives`` group consume the same
nodes at different granularities; the switcher costs each (and "none") and keeps the cheapest.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import onnx_ir as ir
import onnx_ir.passes.common as ir_passes
import onnxscript.optimizer
from onnxscript.rewriter import RewriteRule

from flexdsa_core.fusions.walk import ReasonTracer, drive
from flexdsa_core.rewrites import Kind, Rewrite


@dataclass(frozen=True, kw_only=True)
class FusionRule(Rewrite):
    kind: Kind = "fusion"
    rewrite_rules: tuple[RewriteRule, ...]
    alternatives: str | None = None
    # Extra opsets the rewrite needs imported in the model (domain -> version).
    opset_imports: tuple[tuple[str, int], ...] = ()
    # Taken only where the switcher times kernels on this machine (cpu-ort): the gain depends on a kernel's
    # efficiency at the shape, which a roofline estimate does not model.
    measured_only: bool = False

    def apply(self, model: ir.Model, *, tracer: ReasonTracer | None = None) -> int:
        """Take every match in ``model``, in place, through the Fusion Switcher's own driver and clean-up
        (what the rule tests run); returns the number of rewrites. Failed checks' sentences go to ``tracer``."""
        onnxscript.optimizer.basic_constant_propagation(model.graph)
        decisions = drive(
            model, self.rewrite_rules, _take, rule_name=self.name, opset_imports=self.opset_imports, tracer=tracer
        )
        if decisions and any(not rewrite_rule.remove_nodes for rewrite_rule in self.rewrite_rules):
            onnxscript.optimizer.remove_unused_nodes(model)
        if decisions:
            ir_passes.NameFixPass()(model)
        return len(decisions)


class _Taken:
    taken = True


def _take(rewrite_rule: RewriteRule, delta) -> _Taken:
    return _Taken()


def make_rule(
    name: str,
    summary: str,
    produces: Sequence[str],
    rewrite_rules: Sequence[RewriteRule],
    *,
    after: Sequence[str] = (),
    alternatives: str | None = None,
    opset_imports: dict[str, int] | None = None,
    measured_only: bool = False,
) -> FusionRule:
    return FusionRule(
        name=name,
        summary=summary,
        produces=tuple(produces),
        rewrite_rules=tuple(rewrite_rules),
        after=tuple(after),
        alternatives=alternatives,
        opset_imports=tuple((opset_imports or {}).items()),
        measured_only=measured_only,
    )
