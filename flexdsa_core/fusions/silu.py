"""SiLU (swish) written out → ``com.microsoft::QuickGelu``, which computes ``x * sigmoid(alpha * x)``.

    silu(x) = x * sigmoid(x)                 → QuickGelu(x, alpha=1.0)
    x * sigmoid(alpha * x), alpha constant   → QuickGelu(x, alpha)   (QuickGELU itself uses alpha = 1.702)

ONNX Runtime's CPU QuickGelu with alpha = 1 matches x * Sigmoid(x) to float32 rounding and runs one pass
over the tensor instead of two; its kernel takes float32 only, so other dtypes are refused.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from flexdsa_core._libraries import get_singleton_value
from flexdsa_core.fusions.base import make_rule


class SiluFusion(pattern.RewriteRuleClassBase):
    """Mul(x, Sigmoid(x)) → com.microsoft::QuickGelu(x, alpha=1.0); Mul(x, Sigmoid(Mul(x, a))) → QuickGelu(x, alpha=a)"""

    def __init__(self, swap_root: bool, scaled: bool, swap_scale: bool = False):
        flags = (
            ("_scaled" if scaled else "")
            + ("_alpha_first" if swap_scale else "")
            + ("_swapped" if swap_root else "")
        )
        super().__init__(f"SiluFusion{flags}")
        self._swap_root = swap_root
        self._scaled = scaled
        self._swap_scale = swap_scale

    def pattern(self, op, x, alpha):
        # Variants, not an OrValue, for Mul(x, alpha) vs Mul(alpha, x): with two plain variables the first
        # alternative always matches locally and the matcher does not come back to try the second.
        argument = x
        if self._scaled:
            argument = op.Mul(alpha, x) if self._swap_scale else op.Mul(x, alpha)
        gate = op.Sigmoid(argument)
        return op.Mul(gate, x) if self._swap_root else op.Mul(x, gate)

    def check(self, context, x, alpha=None, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if x.dtype != ir.DataType.FLOAT:
            return result.fail(f"Input '{x.name}' is {x.dtype}; ONNX Runtime's QuickGelu takes float32.", x)
        self._alpha = 1.0
        if self._scaled:
            value = get_singleton_value(alpha)
            if value is None:
                return result.fail(
                    f"The scale '{alpha.name}' inside the Sigmoid is not a constant scalar.", alpha
                )
            self._alpha = float(value)
        return result

    def rewrite(self, op, x, **_):
        return op.QuickGelu(x, alpha=self._alpha, _domain="com.microsoft")


RULES = [
    make_rule(
        "silu",
        "SiLU written as x * Sigmoid(x) (or x * Sigmoid(alpha x)) → com.microsoft::QuickGelu(alpha)",
        ["com.microsoft::QuickGelu"],
        [
            SiluFusion.rule(swap_root, scaled, swap_scale)
            for scaled, swap_scale in ((False, False), (True, False), (True, True))
            for swap_root in (False, True)
        ],
        opset_imports={"com.microsoft": 1},
    )
]
