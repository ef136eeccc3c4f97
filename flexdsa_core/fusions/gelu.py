"""GELU written out in primitives → one fused op, in its two forms:

    erf:   gelu(x) = 0.5 * x * (1 + erf(x / sqrt(2)))                             → com.microsoft::Gelu
    tanh:  gelu(x) = 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))      → com.microsoft::FastGelu

Exporters group the three factors ``x``, ``0.5`` and ``(1 + ...)`` in any of three ways
(``(x*t)*0.5``, ``(0.5*x)*t``, ``x*(0.5*t)``) and either operand order in each product; ``x / sqrt(2)``
may be written ``x * (1/sqrt(2))`` and ``x^3`` as ``x * x * x``. Each grouping is one rule variant, either
operand order of a product or sum is an alternative inside the pattern. The contrib ops (not ONNX ``Gelu``, opset 20) keep the rule usable at any
opset; ONNX Runtime's CPU kernels for them take float32 only, so other dtypes are refused.
"""

from __future__ import annotations

import math

import onnx_ir as ir
from onnxscript.rewriter import pattern

from flexdsa_core.fusions.base import make_rule

_SQRT_2 = math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_GROUPINGS = ("x_times_t_then_half", "half_x_times_t", "x_times_half_t")


def either_order(make, a, b):
    """``make(a, b)`` or ``make(b, a)``: a commutative op inside a pattern, matched in both operand orders.
    (OrValue inside the pattern, not ``RewriteRule.commute()``, which multiplies the rules 2^n.)"""
    return pattern.OrValue([make(a, b), make(b, a)])


class _GeluBase(pattern.RewriteRuleClassBase):
    """Shared by both forms: the product 0.5 * x * (1 + inner(x)) in one of three groupings."""

    def __init__(self, grouping: str, swap_root: bool):
        super().__init__(f"{type(self).__name__}_{grouping}{'_swapped' if swap_root else ''}")
        self._grouping = grouping
        self._swap_root = swap_root

    def one_plus_inner(self, op, x):
        raise NotImplementedError

    def pattern(self, op, x):
        t = self.one_plus_inner(op, x)
        if self._grouping == "x_times_t_then_half":
            left, right = either_order(op.Mul, x, t), 0.5
        elif self._grouping == "half_x_times_t":
            left, right = either_order(op.Mul, x, 0.5), t
        else:
            left, right = x, either_order(op.Mul, t, 0.5)
        return op.Mul(right, left) if self._swap_root else op.Mul(left, right)

    def check(self, context, x, **_) -> pattern.MatchResult:
        if x.dtype != ir.DataType.FLOAT:
            return pattern.MatchResult().fail(
                f"Input '{x.name}' is {x.dtype}; the fused GELU kernels take float32.", x
            )
        return pattern.MatchResult()


class GeluErfFusion(_GeluBase):
    """Mul(Mul(x, Add(Erf(Div(x, sqrt(2))), 1)), 0.5) → com.microsoft::Gelu(x)"""

    def one_plus_inner(self, op, x):
        scaled = pattern.OrValue([op.Div(x, _SQRT_2), either_order(op.Mul, x, 1.0 / _SQRT_2)])
        return either_order(op.Add, op.Erf(scaled), 1.0)

    def rewrite(self, op, x, **_):
        return op.Gelu(x, _domain="com.microsoft")


class GeluTanhFusion(_GeluBase):
    """Mul(Mul(x, Add(Tanh(Mul(sqrt(2/pi), Add(x, Mul(0.044715, Pow(x, 3))))), 1)), 0.5) → com.microsoft::FastGelu(x)"""

    def one_plus_inner(self, op, x):
        cube = pattern.OrValue([op.Pow(x, 3.0), either_order(op.Mul, x, op.Mul(x, x))])
        inner = either_order(op.Add, x, either_order(op.Mul, cube, 0.044715))
        return either_order(op.Add, op.Tanh(either_order(op.Mul, inner, _SQRT_2_OVER_PI)), 1.0)

    def rewrite(self, op, x, **_):
        return op.FastGelu(x, _domain="com.microsoft")


def _variants(rule_class) -> list:
    return [rule_class.rule(grouping, swap_root) for grouping in _GROUPINGS for swap_root in (False, True)]


RULES = [
    make_rule(
        "gelu_erf",
        "GELU written as 0.5 * x * (1 + Erf(x / sqrt 2)) → com.microsoft::Gelu",
        ["com.microsoft::Gelu"],
        _variants(GeluErfFusion),
        opset_imports={"com.microsoft": 1},
        # norms first (the fixtures' node names depend on this order)
        after=("layer_norm", "rms_norm"),
    ),
    make_rule(
        "gelu_tanh",
        "GELU written as 0.5 * x * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 x^3))) → com.microsoft::FastGelu",
        ["com.microsoft::FastGelu"],
        _variants(GeluTanhFusion),
        opset_imports={"com.microsoft": 1},
        # norms first (the fixtures' node names depend on this order)
        after=("layer_norm", "rms_norm"),
    ),
]
