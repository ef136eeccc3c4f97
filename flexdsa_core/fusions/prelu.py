"""Three spellings of a parametric ReLU → ``PRelu(x, slope)``, i.e. ``x`` where ``x >= 0``, ``slope * x`` elsewhere.

- ``Relu(x) - slope * Relu(-x)``
- ``Where(x < 0, x * slope, x)`` (also ``<=``, and ``Where(x > 0, x, x * slope)`` with ``>`` / ``>=``)
- ``Max(x, 0) + slope * Min(x, 0)``

PRelu broadcasts ``slope`` one way only (to ``x``'s shape), so a slope that would widen the result is refused.
"""

from __future__ import annotations

from typing import ClassVar

from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from flexdsa_core._libraries import is_singleton_value
from flexdsa_core.fusions._dtypes import FLOAT_TYPES, dtype_refusal
from flexdsa_core.fusions.base import make_rule


def _slope_refusal(x, slope) -> str | None:
    """A sentence when ``slope`` is not known to broadcast one way to ``x``."""
    if slope.shape is None:
        return f"Slope '{slope.name}' has an unknown shape."
    if x.shape is None:
        return f"Input '{x.name}' has an unknown shape."
    if slope.shape.rank() > x.shape.rank():
        return f"Slope '{slope.name}' has a higher rank than '{x.name}'."
    for slope_dim, x_dim in zip(reversed(list(slope.shape)), reversed(list(x.shape)), strict=False):
        if slope_dim != 1 and slope_dim != x_dim:
            return f"Slope '{slope.name}' of shape {slope.shape} does not broadcast to {x.shape}."
    return None


class _PReluBase(RewriteRuleClassBase):
    def check(self, context, x, slope, zero=None, **_) -> MatchResult:
        result = MatchResult()
        if zero is not None and not is_singleton_value(zero, 0.0, rtol=0.0):
            return result.fail(f"'{zero.name}' is not a constant zero.")
        refusal = dtype_refusal("PRelu", FLOAT_TYPES, x, slope) or _slope_refusal(x, slope)
        return result.fail(refusal) if refusal else result

    def rewrite(self, op, x, slope, **_):
        return op.PRelu(x, slope)


class ReluDifference(_PReluBase):
    """Relu(x) - slope * Relu(-x) → PRelu(x, slope)"""

    def pattern(self, op, x, slope):
        return op.Sub(op.Relu(x), op.Mul(slope, op.Relu(op.Neg(x))))


class MaxMinSum(_PReluBase):
    """Max(x, 0) + slope * Min(x, 0) → PRelu(x, slope)"""

    def pattern(self, op, x, slope, zero):
        return op.Add(op.Max(x, zero), op.Mul(slope, op.Min(x, zero)))


class _WhereBase(_PReluBase):
    compare: ClassVar[str]
    slope_when_true: ClassVar[bool]

    def pattern(self, op, x, slope, zero):
        condition = getattr(op, self.compare)(x, zero)
        scaled = op.Mul(x, slope)
        return op.Where(condition, scaled, x) if self.slope_when_true else op.Where(condition, x, scaled)


class WhereLess(_WhereBase):
    """Where(x < 0, x * slope, x) → PRelu(x, slope)"""

    compare, slope_when_true = "Less", True


class WhereLessOrEqual(_WhereBase):
    """Where(x <= 0, x * slope, x) → PRelu(x, slope)"""

    compare, slope_when_true = "LessOrEqual", True


class WhereGreater(_WhereBase):
    """Where(x > 0, x, x * slope) → PRelu(x, slope)"""

    compare, slope_when_true = "Greater", False


class WhereGreaterOrEqual(_WhereBase):
    """Where(x >= 0, x, x * slope) → PRelu(x, slope)"""

    compare, slope_when_true = "GreaterOrEqual", False


RULES = [
    make_rule(
        "prelu",
        "Relu/Where/Max-Min spellings of a parametric ReLU into PRelu.",
        ["PRelu"],
        [
            rewrite
            for variant in (
                ReluDifference,
                MaxMinSum,
                WhereLess,
                WhereLessOrEqual,
                WhereGreater,
                WhereGreaterOrEqual,
            )
            for rewrite in variant.rule().commute()
        ],
        # an attention mask's Where is attention's, not a PReLU spelling
        after=("attention", "multihead_attention"),
    ),
]
