"""``Add(MatMul(a, b), c)`` → ``Gemm(a, b, c)`` for rank-2 ``a`` and ``b``, Transposes of either folded
into ``transA`` / ``transB`` (onnxscript's ``_matmul_add_to_gemm`` family, with the checks Gemm needs).

Gemm only takes rank-2 operands and a ``c`` that broadcasts one way to ``[M, N]``: a 3-D activation
``a: [B, S, K]`` (a transformer's linear layer) stays MatMul + Add, and so does an Add whose other operand
would widen the result (``c: [B, M, N]``).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchResult

from flexdsa_core._libraries import (
    MatMulAddToGemm,
    TransABMatMulAddToGemm,
    TransAMatMulAddToGemm,
    TransBMatMulAddToGemm,
)
from flexdsa_core.fusions._dtypes import FLOAT_TYPES, dtype_refusal
from flexdsa_core.fusions.base import make_rule


def _broadcasts_to(c_shape: ir.Shape, m, n) -> bool:
    """``c`` broadcasts unidirectionally to ``[M, N]`` (Gemm's rule for its third input)."""
    if c_shape.rank() > 2:
        return False
    return all(dim == 1 or dim == want for dim, want in zip(reversed(list(c_shape)), (n, m), strict=False))


class _GemmChecks:
    """Mixin: the checks each onnxscript MatMul + Add → Gemm variant gets here."""

    def check(self, context, input_a, input_b, input_c, **_) -> MatchResult:
        result = MatchResult()
        for name, value in (("a", input_a), ("b", input_b)):
            if value.shape is None:
                return result.fail(f"MatMul input {name} '{value.name}' has unknown rank.")
            if value.shape.rank() != 2:
                return result.fail(
                    f"MatMul input {name} '{value.name}' has rank {value.shape.rank()}; Gemm takes rank 2 only."
                )
        refusal = dtype_refusal("Gemm", FLOAT_TYPES, input_a, input_b)
        if refusal:
            return result.fail(refusal)
        if input_c.shape is None:
            return result.fail(f"Addend '{input_c.name}' has an unknown shape.")
        m = input_a.shape[1 if self.trans_a else 0]
        n = input_b.shape[0 if self.trans_b else 1]
        if not _broadcasts_to(input_c.shape, m, n):
            return result.fail(
                f"Addend '{input_c.name}' of shape {input_c.shape} does not broadcast to [{m}, {n}]."
            )
        return result


class MatMulAdd(_GemmChecks, MatMulAddToGemm):
    """Add(MatMul(a, b), c) → Gemm(a, b, c)"""


class TransposeAMatMulAdd(_GemmChecks, TransAMatMulAddToGemm):
    """Add(MatMul(Transpose(a), b), c) → Gemm(a, b, c, transA=1)"""


class TransposeBMatMulAdd(_GemmChecks, TransBMatMulAddToGemm):
    """Add(MatMul(a, Transpose(b)), c) → Gemm(a, b, c, transB=1)"""


class TransposeABMatMulAdd(_GemmChecks, TransABMatMulAddToGemm):
    """Add(MatMul(Transpose(a), Transpose(b)), c) → Gemm(a, b, c, transA=1, transB=1)"""


RULES = [
    make_rule(
        "matmul_add_gemm",
        "Rank-2 MatMul + Add (Transposes of either operand folded) into Gemm.",
        ["Gemm"],
        [
            rewrite
            for variant in (TransposeABMatMulAdd, TransposeAMatMulAdd, TransposeBMatMulAdd, MatMulAdd)
            for rewrite in variant.rule().commute()
        ],
    ),
]
