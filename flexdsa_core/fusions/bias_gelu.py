"""A constant bias added just before a GELU → the fused op's bias input: ``gelu(x + bias)`` in one pass.

- ``bias_gelu``: ``Gelu(x + bias)`` → ``com.microsoft::BiasGelu(x, bias)``. Runs after ``gelu_erf`` (which
  makes the ``Gelu`` it consumes) and also takes ONNX's own ``Gelu`` (opset 20) in its exact (erf) form.
  The pattern and its operand orders are onnxscript's ``ort_fusions.bias_gelu``.
- ``bias_fast_gelu``: ``FastGelu(x + bias)`` → ``com.microsoft::FastGelu(x, bias)`` after ``gelu_tanh``.

Both add what ONNX Runtime's kernels need: the bias is a constant 1-D tensor as long as the input's last
axis, and the input is float32.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter.ort_fusions import bias_gelu as ort_bias_gelu

from flexdsa_core.fusions.base import make_rule


def _bias_refusal(input: ir.Value, bias: ir.Value) -> str | None:
    if bias.const_value is None or bias.is_graph_input():
        return f"The bias '{bias.name}' is not a constant."
    if bias.shape is None or bias.shape.rank() != 1:
        return f"The bias '{bias.name}' is not a 1-D tensor."
    if input.dtype != ir.DataType.FLOAT:
        return f"Input '{input.name}' is {input.dtype}; ONNX Runtime's GELU kernels take float32."
    if input.shape is not None and input.shape.rank() and input.shape[-1] != bias.shape[0]:
        return f"The bias has {bias.shape[0]} elements, the input's last axis {input.shape[-1]}."
    return None


class BiasGeluFusion(ort_bias_gelu.BiasGeluFusion):
    """Gelu(Add(x, bias)) → com.microsoft::BiasGelu(x, bias)"""

    def check(self, op, gelu, input, bias, **kwargs) -> pattern.MatchResult:
        result = super().check(op, gelu=gelu, input=input, bias=bias, **kwargs)
        if result and (reason := _bias_refusal(input, bias)) is not None:
            return result.fail(reason, bias)
        return result


class BiasFastGeluFusion(pattern.RewriteRuleClassBase):
    """FastGelu(Add(x, bias)) → com.microsoft::FastGelu(x, bias)"""

    def __init__(self, bias_first: bool):
        super().__init__(f"BiasFastGelu{'_bias_first' if bias_first else ''}")
        self._bias_first = bias_first

    def pattern(self, op, input, bias):
        biased = op.Add(bias, input) if self._bias_first else op.Add(input, bias)
        return op.FastGelu(biased, _domain="com.microsoft")

    def check(self, context, input, bias, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if (reason := _bias_refusal(input, bias)) is not None:
            return result.fail(reason, bias)
        return result

    def rewrite(self, op, input, bias, **_):
        return op.FastGelu(input, bias, _domain="com.microsoft")


RULES = [
    make_rule(
        "bias_gelu",
        "Gelu(x + constant 1-D bias) → com.microsoft::BiasGelu",
        ["com.microsoft::BiasGelu"],
        [
            *BiasGeluFusion.rule("BiasGelu_contrib_gelu", contrib_op=True).commute(),
            *BiasGeluFusion.rule("BiasGelu_onnx_gelu", contrib_op=False).commute(),
        ],
        opset_imports={"com.microsoft": 1},
        # takes gelu_erf's Gelu; a rank-2 MatMul + Add is a Gemm's first
        after=("gelu_erf", "matmul_add_gemm", "transpose_matmul_gemm"),
    ),
    make_rule(
        "bias_fast_gelu",
        "FastGelu(x + constant 1-D bias) → com.microsoft::FastGelu(x, bias)",
        ["com.microsoft::FastGelu"],
        [BiasFastGeluFusion.rule(bias_first) for bias_first in (False, True)],
        opset_imports={"com.microsoft": 1},
        # takes gelu_tanh's FastGelu; a rank-2 MatMul + Add is a Gemm's first
        after=("gelu_tanh", "matmul_add_gemm", "transpose_matmul_gemm"),
    ),
]
