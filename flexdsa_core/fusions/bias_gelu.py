"""A constant bias added just before a GELU → ``com.microsoft::BiasGelu``: ``gelu(x + bias)`` in one pass.

Runs after ``gelu_erf`` (which makes the ``Gelu`` this rule consumes) and also takes ONNX's own ``Gelu``
(opset 20) when it is the exact (erf) form. The pattern and its operand orders are onnxscript's
``ort_fusions.bias_gelu``; this rule adds what ONNX Runtime's kernel needs and that one leaves out: the bias
is a constant 1-D tensor as long as the input's last axis, and the input is float32.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter.ort_fusions import bias_gelu as ort_bias_gelu

from flexdsa_core.fusions.base import make_rule


class BiasGeluFusion(ort_bias_gelu.BiasGeluFusion):
    """Gelu(Add(x, bias)) → com.microsoft::BiasGelu(x, bias)"""

    def check(self, op, gelu, input, bias, **kwargs) -> pattern.MatchResult:
        result = super().check(op, gelu=gelu, input=input, bias=bias, **kwargs)
        if not result:
            return result
        if bias.const_value is None or bias.is_graph_input():
            return result.fail(f"The bias '{bias.name}' is not a constant.", bias)
        if input.dtype != ir.DataType.FLOAT:
            return result.fail(
                f"Input '{input.name}' is {input.dtype}; ONNX Runtime's BiasGelu takes float32.", input
            )
        if input.shape is not None and input.shape.rank() and input.shape[-1] != bias.shape[0]:
            return result.fail(
                f"The bias has {bias.shape[0]} elements, the input's last axis {input.shape[-1]}.", bias
            )
        return result


RULES = [
    make_rule(
        "bias_gelu",
        "Gelu(x + constant 1-D bias) → com.microsoft::BiasGelu",
        ["com.microsoft::BiasGelu"],
        [
            *BiasGeluFusion.rule("BiasGelu_contrib_gelu", contrib_op=True).commute(),
            *BiasGeluFusion.rule("BiasGelu_onnx_gelu", contrib_op=False).commute(),
        ],
        order=30,
        opset_imports={"com.microsoft": 1},
    )
]
