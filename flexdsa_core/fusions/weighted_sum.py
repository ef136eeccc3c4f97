"""``Add(Mul(x1, b1), Mul(x2, b2))`` with scalar constants ``b1``, ``b2`` →
``flexdsa::WeightedSum(x1, b1, x2, b2)``: one element-wise pass computing ``b1 * x1 + b2 * x2``
(the Eltwise-with-coefficients operator of Caffe-lineage accelerator toolchains).

No runtime has such a kernel, so the op is legal only on a target whose op table lists
``flexdsa::WeightedSum`` (cpu-ort does not). The model also gets the op's definition as a model-local
ONNX function, ``WeightedSum(x1, b1, x2, b2) = Add(Mul(x1, b1), Mul(x2, b2))``, so that ONNX Runtime
(and the ONNX checker) can still run and validate the rewritten model; a target's converter maps the
call to its native operator.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from flexdsa_core._libraries import get_numpy_value
from flexdsa_core.fusions.base import make_rule

DOMAIN = "flexdsa"
OP_TYPE = "WeightedSum"
VERSION = 1


def weighted_sum_function(default_opset: int) -> ir.Function:
    """The op's ONNX definition: ``Add(Mul(x1, b1), Mul(x2, b2))``, for any element type."""
    x1, b1, x2, b2 = (ir.Value(name=name) for name in ("x1", "b1", "x2", "b2"))
    scaled1 = ir.Node("", "Mul", [x1, b1], name="scale_x1")
    scaled2 = ir.Node("", "Mul", [x2, b2], name="scale_x2")
    total = ir.Node("", "Add", [scaled1.outputs[0], scaled2.outputs[0]], name="sum")
    for node, name in ((scaled1, "x1_scaled"), (scaled2, "x2_scaled"), (total, "y")):
        node.outputs[0].name = name
    graph = ir.Graph(
        [x1, b1, x2, b2],
        total.outputs,
        nodes=[scaled1, scaled2, total],
        opset_imports={"": default_opset},
        name=OP_TYPE,
    )
    return ir.Function(DOMAIN, OP_TYPE, "", graph=graph, attributes=[])


class WeightedSum(RewriteRuleClassBase):
    """Add(Mul(x1, b1), Mul(x2, b2)) → flexdsa::WeightedSum(x1, b1, x2, b2)"""

    def pattern(self, op, x1, b1, x2, b2):
        return op.Add(op.Mul(x1, b1), op.Mul(x2, b2))

    def check(self, context, x1, b1, x2, b2) -> MatchResult:
        result = MatchResult()
        for x, coefficient in ((x1, b1), (x2, b2)):
            value = get_numpy_value(coefficient)
            if value is None:
                return result.fail(f"Coefficient '{coefficient.name}' is not a constant.")
            if value.size != 1:
                return result.fail(
                    f"Coefficient '{coefficient.name}' of shape {value.shape} is not a scalar."
                )
            if value.ndim > 1 and (x.shape is None or x.shape.rank() < value.ndim):
                return result.fail(
                    f"Coefficient '{coefficient.name}' of shape {value.shape} could raise the rank."
                )
        # The function definition is added once the graph is rewritten (``cleanup``), not here.
        self._model = context.model
        return result

    def rewrite(self, op, x1, b1, x2, b2):
        return op.WeightedSum(x1, b1, x2, b2, _domain=DOMAIN, _version=VERSION)

    def cleanup(self):
        """Give the model the op's definition when a rewrite left a call to it (once per model)."""
        model, self._model = getattr(self, "_model", None), None
        if model is None or (DOMAIN, OP_TYPE, "") in model.functions:
            return
        if any(
            node.domain == DOMAIN and node.op_type == OP_TYPE
            for node in ir.traversal.RecursiveGraphIterator(model.graph)
        ):
            function = weighted_sum_function(model.opset_imports.get("", 1))
            model.functions[function.identifier()] = function


RULES = [
    make_rule(
        "weighted_sum",
        "x1 * b1 + x2 * b2 with scalar constants into one flexdsa::WeightedSum (defined as a model-local function).",
        [f"{DOMAIN}::{OP_TYPE}"],
        WeightedSum.rule().commute(),
        opset_imports={DOMAIN: VERSION},
        # last of the element-wise rules: its Mul/Add pairs are any other rule's first
        after=(
            "gelu_erf",
            "gelu_tanh",
            "silu",
            "layer_norm",
            "rms_norm",
            "skip_layer_norm",
            "skip_rms_norm",
            "rotary",
            "bias_gelu",
            "bias_fast_gelu",
            "attention",
            "multihead_attention",
            "prelu",
            "conv_add_bias",
            "matmul_add_gemm",
        ),
    ),
]
