"""conv_bn_fold and its ConvTranspose / Gemm siblings: BatchNormalization folded into the producer."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from flexdsa_core.fusions.walk import ReasonTracer
from tests.core.fusions.harness import apply_rule, assert_fuses, assert_not_fused, parse, rule

HEADER = '<ir_version: 9, opset_import: ["" : 17]>'

BN_PARAMS = """
    float[4] scale = {1.5, 0.5, -2.0, 1.0},
    float[4] shift = {0.1, -0.2, 0.3, 0.0},
    float[4] mean = {0.5, -1.0, 0.25, 2.0},
    float[4] var = {1.0, 0.25, 4.0, 0.5}
"""

CONV_BN = f"""
{HEADER}
agraph (float[1, 3, 6, 6] x, float[4, 3, 3, 3] w) => (float[1, 4, 4, 4] y)
<{BN_PARAMS}, float[4] b = {{0.2, -0.1, 0.0, 1.0}}>
{{
    c = Conv(x, w, b)
    y = BatchNormalization <epsilon: float = 0.001> (c, scale, shift, mean, var)
}}
"""


def conv_bn_with_weight_initializer(extra_outputs: str = "", extra_nodes: str = "", bias: bool = True) -> str:
    weights = np.random.default_rng(1).standard_normal((4, 3, 3, 3)).round(3)
    values = ", ".join(str(v) for v in weights.ravel())
    bias_decl = ", float[4] b = {0.2, -0.1, 0.0, 1.0}" if bias else ""
    bias_arg = ", b" if bias else ""
    return f"""
{HEADER}
agraph (float[1, 3, 6, 6] x) => (float[1, 4, 4, 4] y{extra_outputs})
<{BN_PARAMS}, float[4, 3, 3, 3] w = {{{values}}}{bias_decl}>
{{
    c = Conv(x, w{bias_arg})
    y = BatchNormalization <epsilon: float = 0.001> (c, scale, shift, mean, var)
    {extra_nodes}
}}
"""


def test_folds_into_conv_with_bias():
    assert_fuses("conv_bn_fold", conv_bn_with_weight_initializer(), ["Conv"])


def test_folds_into_conv_without_bias():
    fused = assert_fuses("conv_bn_fold", conv_bn_with_weight_initializer(bias=False), ["Conv"])
    assert len(fused.graph.node[0].input) == 3


def test_grouped_conv():
    weights = ", ".join(str(v) for v in np.linspace(-1, 1, 4 * 1 * 3 * 3).round(3))
    text = f"""
{HEADER}
agraph (float[1, 4, 5, 5] x) => (float[1, 4, 3, 3] y)
<{BN_PARAMS}, float[4, 1, 3, 3] w = {{{weights}}}>
{{
    c = Conv <group: int = 4> (x, w)
    y = BatchNormalization (c, scale, shift, mean, var)
}}
"""
    assert_fuses("conv_bn_fold", text, ["Conv"])


def test_not_when_weights_are_graph_inputs():
    assert_not_fused("conv_bn_fold", CONV_BN)


def test_not_when_bn_params_are_not_constant():
    text = (
        conv_bn_with_weight_initializer()
        .replace("agraph (float[1, 3, 6, 6] x)", "agraph (float[1, 3, 6, 6] x, float[4] scale_in)")
        .replace("(c, scale, shift", "(c, scale_in, shift")
    )
    assert_not_fused("conv_bn_fold", text)


def test_not_when_conv_output_is_used_elsewhere():
    text = conv_bn_with_weight_initializer(extra_outputs=", float[1, 4, 4, 4] z", extra_nodes="z = Relu(c)")
    assert_not_fused("conv_bn_fold", text)


def test_not_when_weights_are_shared():
    text = conv_bn_with_weight_initializer(
        extra_outputs=", float[1, 4, 4, 4] z", extra_nodes="z = Conv(x, w, b)"
    )
    assert_not_fused("conv_bn_fold", text)


def test_refusal_says_why():
    model = ir.serde.deserialize_model(
        parse(
            conv_bn_with_weight_initializer(
                extra_outputs=", float[1, 4, 4, 4] z", extra_nodes="z = Conv(x, w, b)"
            )
        )
    )
    tracer = ReasonTracer()
    assert rule("conv_bn_fold").apply(model, tracer=tracer) == 0
    assert any("outside the matched pattern" in reason for reason in tracer.reasons), tracer.reasons


def test_not_in_training_mode():
    text = conv_bn_with_weight_initializer().replace(
        "BatchNormalization <epsilon: float = 0.001>",
        "BatchNormalization <epsilon: float = 0.001, training_mode: int = 1>",
    )
    fused, count = apply_rule("conv_bn_fold", parse(text))
    assert count == 0


def test_folds_into_conv_transpose():
    weights = ", ".join(str(v) for v in np.linspace(-1, 1, 3 * 4 * 2 * 2).round(3))
    text = f"""
{HEADER}
agraph (float[1, 3, 4, 4] x) => (float[1, 4, 5, 5] y)
<{BN_PARAMS}, float[3, 4, 2, 2] w = {{{weights}}}>
{{
    c = ConvTranspose(x, w)
    y = BatchNormalization (c, scale, shift, mean, var)
}}
"""
    assert_fuses("conv_transpose_bn_fold", text, ["ConvTranspose"])


def test_folds_into_gemm():
    weights = ", ".join(str(v) for v in np.linspace(-1, 1, 4 * 5).round(3))
    text = f"""
{HEADER}
agraph (float[2, 5] x) => (float[2, 4] y)
<{BN_PARAMS}, float[4, 5] w = {{{weights}}}, float[4] c0 = {{1.0, 2.0, 3.0, 4.0}}>
{{
    g = Gemm <transB: int = 1, beta: float = 0.5> (x, w, c0)
    y = BatchNormalization (g, scale, shift, mean, var)
}}
"""
    assert_fuses("gemm_bn_fold", text, ["Gemm"])
