"""skip_layer_norm / skip_rms_norm: a residual Add (± bias) feeding the normalisation → one skip-norm op."""

from __future__ import annotations

import pytest

from tests.core.fusions.harness import assert_fuses, assert_not_fused


def graph(
    body: str, *, norm: str = "LayerNormalization", outputs: str = "float[2, 4, 8] y", skip: str = "[2, 4, 8]"
):
    opset = 23 if norm == "RMSNormalization" else 17
    norm_inputs = "gamma" if norm == "RMSNormalization" else "gamma, beta"
    return f"""
<ir_version: 10, opset_import: ["" : {opset}]>
skip_norm (float[2, 4, 8] x, float{skip} skip) => ({outputs})
<float[8] gamma = {{1.5, 0.5, 1, 2, -1, 0.25, 3, 1}}, float[8] beta = {{0.1, 0.2, 0.3, 0.4, -0.5, 0, 1, -1}},
 float[8] bias = {{1, -1, 0.5, 0, 2, 0.25, -0.75, 0}}>
{{
{body.replace("NORM", f"{norm} <axis = -1, epsilon = 1e-5> ").replace("INPUTS", norm_inputs)}
}}"""


SKIP = "s = Add (x, skip)\n y = NORM (s, INPUTS)"
SKIP_SWAPPED = "s = Add (skip, x)\n y = NORM (s, INPUTS)"
SKIP_BIAS = "xs = Add (x, skip)\n s = Add (xs, bias)\n y = NORM (s, INPUTS)"
PRE_BIAS = "xb = Add (x, bias)\n s = Add (xb, skip)\n y = NORM (s, INPUTS)"
# TorchScript writes Linear's bias first: Add(bias, x @ W).
PRE_BIAS_FIRST = "xb = Add (bias, x)\n s = Add (skip, xb)\n y = NORM (s, INPUTS)"
SKIP_BIAS_FIRST = "xs = Add (x, skip)\n s = Add (bias, xs)\n y = NORM (s, INPUTS)"
# The transformer block: the sum also feeds the next residual Add, so the fused op's 4th output carries it.
RESIDUAL = "s = Add (x, skip)\n n = NORM (s, INPUTS)\n y = Add (s, n)"


@pytest.mark.parametrize(
    "body",
    [SKIP, SKIP_SWAPPED, SKIP_BIAS, PRE_BIAS, PRE_BIAS_FIRST, SKIP_BIAS_FIRST],
    ids=["x+skip", "skip+x", "bias-after", "bias-before", "bias-first-before", "bias-first-after"],
)
def test_skip_layer_norm_fuses(body):
    fused = assert_fuses("skip_layer_norm", graph(body), ["SkipLayerNormalization"])
    assert len([name for name in fused.graph.node[0].input if name]) == (5 if "bias" in body else 4)


def test_skip_layer_norm_keeps_the_sum_for_the_residual():
    fused = assert_fuses("skip_layer_norm", graph(RESIDUAL), ["SkipLayerNormalization", "Add"])
    sum_output = fused.graph.node[0].output[3]
    assert sum_output and sum_output in fused.graph.node[1].input


def test_skip_layer_norm_sum_as_a_graph_output():
    text = graph(SKIP, outputs="float[2, 4, 8] y, float[2, 4, 8] s")
    assert_fuses("skip_layer_norm", text, ["SkipLayerNormalization"])


@pytest.mark.parametrize(
    "body", [SKIP, SKIP_BIAS, PRE_BIAS_FIRST], ids=["x+skip", "bias-after", "bias-first-before"]
)
def test_skip_rms_norm_fuses(body):
    assert_fuses("skip_rms_norm", graph(body, norm="RMSNormalization"), ["SkipSimplifiedLayerNormalization"])


def test_skip_rms_norm_keeps_the_sum_for_the_residual():
    text = graph(RESIDUAL, norm="RMSNormalization")
    assert_fuses("skip_rms_norm", text, ["SkipSimplifiedLayerNormalization", "Add"])


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(graph(SKIP, skip="[1, 1, 8]"), id="skip-broadcast"),
        pytest.param(graph(SKIP).replace("axis = -1", "axis = 1"), id="not-the-last-axis"),
        pytest.param(graph("s = Add (x, skip)\n y = NORM (s, gamma)"), id="no-beta"),
    ],
)
def test_skip_layer_norm_refuses(text):
    assert_not_fused("skip_layer_norm", text)
