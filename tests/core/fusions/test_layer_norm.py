"""layer_norm: the primitive LayerNorm (both ReduceMean forms, both operand orders) → LayerNormalization."""

from __future__ import annotations

import onnx
import pytest

from tests.core.fusions.harness import apply_rule, assert_fuses, assert_not_fused, parse

_HEADER = """
<ir_version: 10, opset_import: ["" : {opset}]>
ln (float[2, 4, 8] x) => (float[2, 4, 8] y)
<float[8] scale = {{1.5, 0.5, 1, 2, -1, 0.25, 3, 1}}, float[8] bias = {{0.1, 0.2, 0.3, 0.4, -0.5, 0, 1, -1}},
 float eps = {{1e-5}}, float two = {{2.0}}{extra}>
"""

# Opset < 18: ReduceMean takes its axes as an attribute (the TorchScript exporter at opset 13-17).
ATTR_AXES = (
    _HEADER.format(opset=13, extra="")
    + """{
    mean = ReduceMean <axes = [-1]> (x)
    d = Sub (x, mean)
    d2 = Pow (d, two)
    var = ReduceMean <axes = [-1]> (d2)
    ve = Add (var, eps)
    std = Sqrt (ve)
    n = Div (d, std)
    ns = Mul (n, scale)
    y = Add (ns, bias)
}"""
)

# Opset 18: axes as an input; the other operand orders and the Mul/Reciprocal spelling.
INPUT_AXES = (
    _HEADER.format(opset=18, extra=", int64[1] axes = {-1}")
    + """{
    mean = ReduceMean (x, axes)
    d = Sub (x, mean)
    d2 = Mul (d, d)
    var = ReduceMean (d2, axes)
    ve = Add (eps, var)
    std = Sqrt (ve)
    inv = Reciprocal (std)
    n = Mul (d, inv)
    ns = Mul (scale, n)
    y = Add (bias, ns)
}"""
)


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain == "")


def test_fuses_opset_13_and_raises_the_import_to_17():
    fused = assert_fuses("layer_norm", ATTR_AXES, ["LayerNormalization"])
    assert _opset(fused) == 17
    assert len(fused.graph.node[0].input) == 3  # the bias folded in


def test_fuses_axes_input_and_swapped_operands():
    fused = assert_fuses("layer_norm", INPUT_AXES, ["LayerNormalization"])
    assert _opset(fused) == 18


def test_fuses_without_bias():
    text = ATTR_AXES.replace("ns = Mul (n, scale)\n    y = Add (ns, bias)", "y = Mul (n, scale)")
    fused = assert_fuses("layer_norm", text.replace('"" : 13', '"" : 17'), ["LayerNormalization"])
    assert len(fused.graph.node[0].input) == 2


def test_positive_last_axis_is_the_last_axis():
    text = ATTR_AXES.replace("axes = [-1]", "axes = [2]")
    assert_fuses("layer_norm", text, ["LayerNormalization"])


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(("axes = [-1]", "axes = [1]"), id="not-the-last-axis"),
        pytest.param(('"" : 13', '"" : 12'), id="opset-below-13"),
        pytest.param(
            ("float[2, 4, 8] y)", "float[2, 4, 8] y, float[2, 4, 8] d)"), id="deviation-used-outside"
        ),
    ],
)
def test_refuses(change):
    old, new = change
    text = ATTR_AXES.replace(old, new)
    assert_not_fused("layer_norm", text)


def test_refuses_an_epsilon_that_is_not_constant():
    text = ATTR_AXES.replace("float eps = {1e-5}, ", "").replace(
        "(float[2, 4, 8] x)", "(float[2, 4, 8] x, float eps)"
    )
    assert_not_fused("layer_norm", text)


def test_refuses_opset_upgrade_over_an_op_that_changed_meaning():
    text = ATTR_AXES.replace(
        "ln (float[2, 4, 8] x) => (float[2, 4, 8] y)",
        "ln (float[2, 4, 8] x, float[1, 3, 4, 4] img, float[1, 4] rois, int64[1] idx) => (float[2, 4, 8] y, float[1, 3, 2, 2] pooled)",
    )
    text = text.replace(
        "    y = Add (ns, bias)",
        "    y = Add (ns, bias)\n    pooled = RoiAlign <output_height = 2, output_width = 2> (img, rois, idx)",
    )
    model = parse(text)
    fused, count = apply_rule("layer_norm", model)
    assert count == 0
    assert _opset(fused) == 13


def test_a_refused_match_leaves_the_opset_alone():
    """The Fusion Switcher builds the rewrite and then refuses it when it does not pay: nothing changed,
    so the import must not move either."""
    import onnx_ir as ir

    from flexdsa_core.fusions.walk import drive
    from tests.core.fusions.harness import rule

    class Refused:
        taken = False

    layer_norm = rule("layer_norm")
    model = ir.serde.deserialize_model(parse(ATTR_AXES))
    verdicts = drive(model, layer_norm.rewrite_rules, lambda *_: Refused(), rule_name=layer_norm.name)
    assert len(verdicts) == 1 and not verdicts[0].taken  # the match was built, then refused
    assert model.opset_imports[""] == 13
    assert [node.op_type for node in model.graph] == [node.op_type for node in parse(ATTR_AXES).graph.node]


def test_fuses_one_over_sqrt():
    text = INPUT_AXES.replace("inv = Reciprocal (std)", "inv = Div (one, std)")
    text = text.replace("int64[1] axes = {-1}", "int64[1] axes = {-1}, float one = {1.0}")
    assert_fuses("layer_norm", text, ["LayerNormalization"])


def test_fuses_without_scale_or_bias():
    """LayerNorm(elementwise_affine=False): the rule supplies a scale of ones."""
    text = ATTR_AXES.replace(
        "n = Div (d, std)\n    ns = Mul (n, scale)\n    y = Add (ns, bias)", "y = Div (d, std)"
    )
    fused = assert_fuses("layer_norm", text, ["LayerNormalization"])
    scale = next(init for init in fused.graph.initializer if init.name == fused.graph.node[0].input[1])
    assert list(onnx.numpy_helper.to_array(scale)) == [1.0] * 8


def test_fuses_without_scale_then_a_gate_that_is_not_a_scale():
    text = INPUT_AXES.replace("ns = Mul (scale, n)\n    y = Add (bias, ns)", "y = Mul (n, gate)")
    text = text.replace("(float[2, 4, 8] x)", "(float[2, 4, 8] x, float[2, 4, 1] gate)")
    assert_fuses("layer_norm", text, ["LayerNormalization", "Mul"])
