"""Fold Transposes and scalar scales into the matrix multiply that consumes them.

``transpose_matmul_gemm``: rank-2 ``MatMul(Transpose(a), b)`` (or Transpose on ``b``, or both) →
``Gemm(a, b, transA=1)`` (C-less Gemm needs opset 11).

``transpose_matmul_fused``: the same for operands of other ranks when the Transpose swaps the last two
axes → ``com.microsoft::FusedMatMul(a, b, transA=1)`` (onnxscript's ``fused_matmul_rule_sets``), and a
scalar constant ``s`` multiplying or dividing the product or either operand →
``FusedMatMul(a, b, alpha=s)`` (or ``1 / s``). Since ``(s·A)·B = A·(s·B) = s·(A·B)``, every position
folds into the same alpha; ONNX Runtime's kernel is float32/double only.
"""

from __future__ import annotations

from typing import ClassVar

from onnxscript.rewriter import MatchResult, RewriteRuleClassBase
from onnxscript.rewriter.ort_fusions.fused_matmul_rule_sets import (
    TransposeFusedMatMul1,
    TransposeFusedMatMul2,
    TransposeMatMul1,
    TransposeMatMul2,
)

from flexdsa_core._libraries import get_numpy_value, has_rank
from flexdsa_core.fusions._dtypes import FLOAT32_OR_DOUBLE, dtype_refusal
from flexdsa_core.fusions.base import make_rule


class _TransposeToGemmBase(RewriteRuleClassBase):
    trans_a: ClassVar[bool] = False
    trans_b: ClassVar[bool] = False

    def pattern(self, op, a, b):
        left = op.Transpose(a, _outputs=["transposed_a"]) if self.trans_a else a
        right = op.Transpose(b, _outputs=["transposed_b"]) if self.trans_b else b
        return op.MatMul(left, right)

    def check(self, context, a, b, transposed_a=None, transposed_b=None) -> MatchResult:
        result = MatchResult()
        if context.model.opset_imports.get("", 1) < 11:
            return result.fail("Gemm without a C input needs opset 11 or later.")
        for value in (a, b):
            if not has_rank(value, 2):
                return result.fail(f"'{value.name}' is not known to be rank 2, which Gemm needs.")
        for transposed in (transposed_a, transposed_b):
            perm = transposed.producer().attributes.get_ints("perm") if transposed is not None else None
            if perm is not None and list(perm) != [1, 0]:
                return result.fail(f"Transpose perm {list(perm)} does not swap the two axes.")
        refusal = dtype_refusal("Gemm", FLOAT32_OR_DOUBLE, a, b)
        return result.fail(refusal) if refusal else result

    def rewrite(self, op, a, b, **_):
        attributes = {name: 1 for name, flag in (("transA", self.trans_a), ("transB", self.trans_b)) if flag}
        return op.Gemm(a, b, **attributes)


class TransposeAToGemm(_TransposeToGemmBase):
    """MatMul(Transpose(a), b) → Gemm(a, b, transA=1)"""

    trans_a = True


class TransposeBToGemm(_TransposeToGemmBase):
    """MatMul(a, Transpose(b)) → Gemm(a, b, transB=1)"""

    trans_b = True


class TransposeABToGemm(_TransposeToGemmBase):
    """MatMul(Transpose(a), Transpose(b)) → Gemm(a, b, transA=1, transB=1)"""

    trans_a = True
    trans_b = True


class _NotRank2:
    """Mixin over onnxscript's Transpose + MatMul → FusedMatMul: rank-2 products are Gemm's."""

    def check(self, context, x, y, transposed, **rest) -> MatchResult:
        if has_rank(x, 2) and has_rank(y, 2):
            return MatchResult().fail(
                "Rank-2 operands: the Transpose folds into Gemm (transpose_matmul_gemm)."
            )
        refusal = dtype_refusal("FusedMatMul", FLOAT32_OR_DOUBLE, x, y)
        if refusal:
            return MatchResult().fail(refusal)
        return super().check(context, x, y, transposed, **rest)


class TransposeAToFusedMatMul(_NotRank2, TransposeMatMul1):
    """MatMul(Transpose(a), b) → FusedMatMul(a, b, transA=1)"""


class TransposeBToFusedMatMul(_NotRank2, TransposeMatMul2):
    """MatMul(a, Transpose(b)) → FusedMatMul(a, b, transB=1)"""


class _ScaledMatMulBase(RewriteRuleClassBase):
    """Shared by the scale variants: ``scaled`` says which value the Mul/Div scales."""

    scaled: ClassVar[str] = "output"  # "a", "b" or "output"
    divide: ClassVar[bool] = False
    on_fused: ClassVar[bool] = False  # the product is already a FusedMatMul

    def pattern(self, op, a, b, scale):
        def scale_op(value):
            return op.Div(value, scale) if self.divide else op.Mul(value, scale)

        left = scale_op(a) if self.scaled == "a" else a
        right = scale_op(b) if self.scaled == "b" else b
        if self.on_fused:
            product = op.FusedMatMul(left, right, _domain="com.microsoft", _outputs=["product"])
        else:
            product = op.MatMul(left, right, _outputs=["product"])
        return scale_op(product) if self.scaled == "output" else product

    def check(self, context, a, b, scale, product) -> MatchResult:
        result = MatchResult()
        value = get_numpy_value(scale)
        if value is None or value.size != 1:
            return result.fail(f"Scale '{scale.name}' is not a constant scalar.")
        if value.ndim > 1:
            return result.fail(f"Scale '{scale.name}' of shape {value.shape} could raise the output's rank.")
        if self.divide and value.item() == 0:
            return result.fail(f"Divisor '{scale.name}' is zero.")
        refusal = dtype_refusal("FusedMatMul", FLOAT32_OR_DOUBLE, a, b)
        return result.fail(refusal) if refusal else result

    def rewrite(self, op, a, b, scale, product):
        factor = float(get_numpy_value(scale).item())
        attributes = {name: attr.value for name, attr in product.producer().attributes.items()}
        alpha = attributes.get("alpha", 1.0) if self.on_fused else 1.0
        attributes["alpha"] = alpha / factor if self.divide else alpha * factor
        return op.FusedMatMul(a, b, _domain="com.microsoft", **attributes)


def _scale_variants():
    """One class per (scaled value, Mul or Div, MatMul or FusedMatMul)."""
    for scaled in ("output", "a", "b"):
        for divide in (False, True):
            for on_fused in (False, True):
                name = f"{'Div' if divide else 'Mul'}{scaled.capitalize()}{'FusedMatMul' if on_fused else 'MatMul'}"
                doc = f"{'Div' if divide else 'Mul'} by a scalar on {scaled} of {'Fused' if on_fused else ''}MatMul → FusedMatMul(alpha)"
                attrs = {"scaled": scaled, "divide": divide, "on_fused": on_fused, "__doc__": doc}
                yield type(name, (_ScaledMatMulBase,), attrs)


RULES = [
    make_rule(
        "transpose_matmul_gemm",
        "A Transpose feeding a rank-2 MatMul into Gemm's transA/transB.",
        ["Gemm"],
        [variant.rule() for variant in (TransposeABToGemm, TransposeAToGemm, TransposeBToGemm)],
        # a MatMul + Add keeps its bias in the Gemm
        after=("matmul_add_gemm",),
    ),
    make_rule(
        "transpose_matmul_fused",
        "Transposes of the last two axes and scalar scales into com.microsoft::FusedMatMul attributes.",
        ["com.microsoft::FusedMatMul"],
        [
            TransposeAToFusedMatMul.rule(),
            TransposeBToFusedMatMul.rule(),
            TransposeFusedMatMul1.rule(),
            TransposeFusedMatMul2.rule(),
            *(rewrite for variant in _scale_variants() for rewrite in variant.rule().commute()),
        ],
        # After the attention rules (order 50): they need the raw Q·Kᵀ Transpose and scale to match.
        opset_imports={"com.microsoft": 1},
        # what attention and the Gemm rules leave of the Transposes and scales
        after=("attention", "multihead_attention", "transpose_matmul_gemm", "weighted_sum"),
    ),
]
