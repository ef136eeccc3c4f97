"""``Act(Gemm(a, b, c))`` → ``com.microsoft::FusedGemm(a, b, c, activation=Act)``.

Gemm keeps its alpha, beta, transA and transB. ONNX Runtime's CPU FusedGemm runs Relu, LeakyRelu
(``activation_alpha``), Sigmoid, Tanh and HardSigmoid (``activation_alpha``, ``activation_beta``) on
float32; it has no Clip, so ReLU6 after a Gemm stays two nodes.
"""

from __future__ import annotations

from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from flexdsa_core.fusions._activation import activation_pattern, read_activation
from flexdsa_core.fusions._dtypes import FLOAT32, dtype_refusal
from flexdsa_core.fusions.base import make_rule

ACTIVATIONS = ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "HardSigmoid")
_PARAM_ATTRIBUTES = ("activation_alpha", "activation_beta")


class GemmActivation(RewriteRuleClassBase):
    """Act(Gemm(a, b, c)) → FusedGemm(a, b, c, activation=Act)"""

    def __init__(self, activation: str):
        super().__init__(name=f"GemmActivation[{activation}]")
        self.activation = activation

    def pattern(self, op, a):
        return activation_pattern(
            op, self.activation, op.Gemm(a, _allow_other_inputs=True, _outputs=["gemm_out"])
        )

    def check(self, context, a, gemm_out, act_out) -> MatchResult:
        result = MatchResult()
        gemm = gemm_out.producer()
        refusal = dtype_refusal("FusedGemm", FLOAT32, a, gemm.inputs[1])
        return result.fail(refusal) if refusal else result

    def rewrite(self, op, a, gemm_out, act_out):
        gemm = gemm_out.producer()
        activation = read_activation(act_out.producer())
        attributes = dict(gemm.attributes.items())
        attributes.update(zip(_PARAM_ATTRIBUTES, activation.params, strict=False))
        return op.FusedGemm(
            *gemm.inputs, activation=activation.op_type, _domain="com.microsoft", **attributes
        )


RULES = [
    make_rule(
        "gemm_act",
        "Gemm + activation into com.microsoft::FusedGemm.",
        ["com.microsoft::FusedGemm"],
        [GemmActivation.rule(act) for act in ACTIVATIONS],
        opset_imports={"com.microsoft": 1},
        # fuses the activation into the Gemms those make
        after=("gemm_bn_fold", "matmul_add_gemm", "transpose_matmul_gemm"),
    ),
]
