"""conv_add_bias and conv_bias_act: Conv (+ per-channel bias Add) (+ activation) into one node."""

from __future__ import annotations

import numpy as np
import pytest

from tests.core.fusions.harness import assert_fuses, assert_not_fused

WEIGHTS = ", ".join(str(v) for v in np.random.default_rng(3).standard_normal(4 * 3 * 3 * 3).round(3))


def conv_graph(body: str, *, bias_shape=(4, 1, 1), extra_outputs: str = "", opset: int = 17) -> str:
    bias = ", ".join(["0.3"] * int(np.prod(bias_shape)))
    return f"""
<ir_version: 9, opset_import: ["" : {opset}]>
agraph (float[1, 3, 6, 6] x, float[1] lo) => (float[1, 4, 4, 4] y{extra_outputs})
<float[4, 3, 3, 3] w = {{{WEIGHTS}}}, float[4] b0 = {{0.5, -0.5, 0.25, 0.0}},
 float{list(bias_shape) if bias_shape else ""} b = {{{bias}}},
 float zero = {{0.0}}, float six = {{6.0}}>
{{
    {body}
}}
"""


def test_add_folds_into_conv_bias():
    assert_fuses("conv_add_bias", conv_graph("c = Conv(x, w, b0)\n y = Add(c, b)"), ["Conv"])


@pytest.mark.parametrize("bias_shape", [(1, 4, 1, 1), (1,), ()])
def test_add_folds_for_every_per_channel_shape(bias_shape):
    assert_fuses(
        "conv_add_bias", conv_graph("c = Conv(x, w)\n y = Add(b, c)", bias_shape=bias_shape), ["Conv"]
    )


@pytest.mark.parametrize("bias_shape", [(4,), (4, 4, 4), (1, 1, 4, 4, 1)])
def test_add_not_folded_when_bias_is_not_per_channel(bias_shape):
    # A [4] vector broadcasts along the last (width) axis, not the channels.
    assert_not_fused("conv_add_bias", conv_graph("c = Conv(x, w)\n y = Add(c, b)", bias_shape=bias_shape))


def test_add_not_folded_when_bias_is_not_constant():
    text = conv_graph("c = Conv(x, w)\n y = Add(c, lo)")
    assert_not_fused("conv_add_bias", text)


@pytest.mark.parametrize(
    "activation",
    [
        "Relu(s)",
        "Sigmoid(s)",
        "Tanh(s)",
        "LeakyRelu <alpha: float = 0.2> (s)",
        "HardSigmoid <alpha: float = 0.3, beta: float = 0.4> (s)",
        "Clip(s, zero, six)",
        "Clip(s, zero)",
    ],
)
def test_conv_activation(activation):
    assert_fuses("conv_bias_act", conv_graph(f"s = Conv(x, w, b0)\n y = {activation}"), ["FusedConv"])


def test_conv_bias_add_relu6():
    text = conv_graph("c = Conv(x, w)\n s = Add(b, c)\n y = Clip(s, zero, six)")
    fused = assert_fuses("conv_bias_act", text, ["FusedConv"])
    attributes = {a.name: a for a in fused.graph.node[0].attribute}
    assert attributes["activation"].s == b"Clip"
    assert list(attributes["activation_params"].floats) == [0.0, 6.0]


def test_clip_with_attribute_bounds_before_opset_11():
    text = conv_graph("s = Conv(x, w)\n y = Clip <min: float = 0.0, max: float = 6.0> (s)", opset=10)
    assert_fuses("conv_bias_act", text, ["FusedConv"])


def test_not_when_conv_output_is_used_elsewhere():
    text = conv_graph("s = Conv(x, w)\n y = Relu(s)\n z = Neg(s)", extra_outputs=", float[1, 4, 4, 4] z")
    assert_not_fused("conv_bias_act", text)


def test_not_when_clip_bound_is_not_constant():
    assert_not_fused("conv_bias_act", conv_graph("s = Conv(x, w)\n y = Clip(s, lo, six)"))


def test_add_then_activation_not_fused_when_bias_not_per_channel():
    text = conv_graph("c = Conv(x, w)\n s = Add(c, b)\n y = Relu(s)", bias_shape=(4, 4, 4))
    assert_not_fused("conv_bias_act", text)


def test_conv_of_an_untyped_intermediate_takes_the_weight_type():
    text = conv_graph("h = Neg(x)\n s = Conv(h, w)\n y = Relu(s)")
    assert_fuses("conv_bias_act", text, ["Neg", "FusedConv"])


def test_conv_1d_with_strides_and_pads():
    text = """
<ir_version: 9, opset_import: ["" : 17]>
agraph (float[1, 2, 9] x) => (float[1, 3, 5] y)
<float[3, 2, 3] w = {1, -1, 0.5, 0.25, 2, -0.5, 1, 1, 1, -1, -1, 0, 0.3, 0.2, 0.1, 0, 1, 0}, float[3, 1] b = {1, 2, 3}>
{
    c = Conv <strides = [2], pads = [1, 1]> (x, w)
    s = Add(c, b)
    y = LeakyRelu <alpha: float = 0.3> (s)
}
"""
    assert_fuses("conv_bias_act", text, ["FusedConv"])
