"""bias_gelu: Gelu(x + constant bias), with the contrib or the ONNX Gelu, bias on either side → BiasGelu."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.core.fusions.harness import apply_rule, assert_fuses, assert_not_fused, op_types, parse, run


def graph(add: str, gelu: str = "com.microsoft.Gelu", opset: int = 17, extra_in: str = "") -> str:
    return f"""
<ir_version: 10, opset_import: ["" : {opset}, "com.microsoft" : 1]>
bias_gelu (float[2, 3, 4] x{extra_in}) => (float[2, 3, 4] y)
<float[4] bias = {{0.5, -1.0, 0.25, 2.0}}>
{{
    a = {add}
    y = {gelu} (a)
}}"""


@pytest.mark.parametrize("add", ["Add (x, bias)", "Add (bias, x)"], ids=["x-first", "bias-first"])
def test_fuses_contrib_gelu(add):
    assert_fuses("bias_gelu", graph(add), ["BiasGelu"])


def test_fuses_onnx_gelu_at_opset_20():
    assert_fuses("bias_gelu", graph("Add (x, bias)", gelu="Gelu", opset=20), ["BiasGelu"])


def test_after_gelu_erf_on_the_written_out_form():
    """The two rules in their order on a shape-inferred graph (the pipeline infers shapes before fusing)."""

    text = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[2, 4] x) => (float[2, 4] y)
<float[4] bias = {0.5, -1.0, 0.25, 2.0}, float half = {0.5}, float one = {1.0}, float sqrt2 = {1.4142135}>
{
    a = Add (x, bias)
    s = Div (a, sqrt2)
    e = Erf (s)
    t = Add (e, one)
    at = Mul (a, t)
    y = Mul (at, half)
}"""
    original = onnx.shape_inference.infer_shapes(parse(text))
    model, _ = apply_rule("gelu_erf", original)
    model, count = apply_rule("bias_gelu", model)
    assert count == 1 and op_types(model) == ["BiasGelu"]
    onnx.checker.check_model(model)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)}
    np.testing.assert_allclose(run(model, feeds)[0], run(original, feeds)[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(graph("Add (x, b)", extra_in=", float[4] b"), id="bias-not-constant"),
        pytest.param(graph("Add (x, z)", extra_in=", float[2, 3, 4] z"), id="bias-not-1d"),
        pytest.param(graph("Add (x, bias)", gelu='Gelu <approximate = "tanh">', opset=20), id="tanh-gelu"),
    ],
)
def test_refuses(text):
    assert_not_fused("bias_gelu", text)


@pytest.mark.parametrize("add", ["Add (x, bias)", "Add (bias, x)"], ids=["x-first", "bias-first"])
def test_bias_fast_gelu_fuses(add):
    fused = assert_fuses("bias_fast_gelu", graph(add, gelu="com.microsoft.FastGelu"), ["FastGelu"])
    assert list(fused.graph.node[0].input) == ["x", "bias"]


def test_bias_fast_gelu_refuses_a_bias_that_is_an_input():
    assert_not_fused(
        "bias_fast_gelu", graph("Add (x, b)", gelu="com.microsoft.FastGelu", extra_in=", float[4] b")
    )
