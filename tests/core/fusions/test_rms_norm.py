"""rms_norm: the primitive RMSNorm (both spellings, both operand orders, with casts) → RMSNormalization."""

from __future__ import annotations

import onnx
import pytest

from tests.core.fusions.harness import assert_fuses, assert_not_fused

RMS = """
<ir_version: 10, opset_import: ["" : 18]>
rms (float[2, 4, 8] x) => (float[2, 4, 8] y)
<float[8] scale = {1.5, 0.5, 1, 2, -1, 0.25, 3, 1}, float eps = {1e-6}, float two = {2.0}, int64[1] axes = {-1}>
{
    x2 = Pow (x, two)
    ms = ReduceMean <keepdims = 1> (x2, axes)
    mse = Add (ms, eps)
    rms = Sqrt (mse)
    inv = Reciprocal (rms)
    n = Mul (x, inv)
    y = Mul (n, scale)
}"""

# LLaMA-style in half precision: cast up to float, normalise, cast back, then scale; Div spelling, scale first.
RMS_FP16 = """
<ir_version: 10, opset_import: ["" : 21]>
rms (float16[2, 4, 8] x, float16[8] scale) => (float16[2, 4, 8] y)
<float eps = {1e-6}, int64[1] axes = {2}>
{
    xf = Cast <to = 1> (x)
    x2 = Mul (xf, xf)
    ms = ReduceMean (x2, axes)
    mse = Add (eps, ms)
    rms = Sqrt (mse)
    n = Div (xf, rms)
    nh = Cast <to = 10> (n)
    y = Mul (scale, nh)
}"""


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain == "")


def test_fuses_and_raises_the_import_to_23():
    fused = assert_fuses("rms_norm", RMS, ["RMSNormalization"])
    assert _opset(fused) == 23


def test_fuses_torch_rsqrt_written_as_one_over_sqrt():
    text = RMS.replace("inv = Reciprocal (rms)", "inv = Div (one, rms)").replace(
        "float two = {2.0}", "float two = {2.0}, float one = {1.0}"
    )
    assert_fuses("rms_norm", text.replace("n = Mul (x, inv)", "n = Mul (inv, x)"), ["RMSNormalization"])


def test_fuses_half_precision_with_casts_and_swapped_operands():
    fused = assert_fuses("rms_norm", RMS_FP16, ["RMSNormalization"], atol=2e-3, rtol=2e-3)
    stash = next(a.i for a in fused.graph.node[0].attribute if a.name == "stash_type")
    assert stash == onnx.TensorProto.FLOAT


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(("axes = {-1}", "axes = {1}"), id="not-the-last-axis"),
        pytest.param(("float[2, 4, 8] y)", "float[2, 4, 8] y, float[2, 4, 1] ms)"), id="mean-used-outside"),
    ],
)
def test_refuses(change):
    old, new = change
    text = RMS.replace(old, new)
    assert_not_fused("rms_norm", text)


def test_refuses_a_cast_up_without_the_cast_back():
    text = RMS_FP16.replace("nh = Cast <to = 10> (n)\n    y = Mul (scale, nh)", "y = Mul (scale, n)").replace(
        "float16[8] scale", "float[8] scale"
    )
    text = text.replace("=> (float16[2, 4, 8] y)", "=> (float[2, 4, 8] y)")
    assert_not_fused("rms_norm", text)


# Opset 14, as the TorchScript exporter writes LLaMA: ReduceMean's axes are an attribute, Split has no sizes.
RMS_OPSET_14 = """
<ir_version: 10, opset_import: ["" : 14]>
rms (float[2, 4, 8] x) => (float[2, 4, 8] y, float[2, 4, 1] m, float[2, 4, 4] a, float[2, 4, 4] b)
<float[8] scale = {1.5, 0.5, 1, 2, -1, 0.25, 3, 1}, float eps = {1e-6}, float two = {2.0}>
{
    x2 = Pow (x, two)
    ms = ReduceMean <axes = [-1]> (x2)
    mse = Add (ms, eps)
    rms = Sqrt (mse)
    inv = Reciprocal (rms)
    n = Mul (x, inv)
    y = Mul (scale, n)
    m = ReduceMean <axes = [2]> (x)
    a, b = Split <axis = -1> (x)
}"""


def test_fuses_at_opset_14_adapting_the_ops_opset_18_changed():
    fused = assert_fuses("rms_norm", RMS_OPSET_14, ["RMSNormalization", "ReduceMean", "Split"])
    assert _opset(fused) == 23
    reduce_mean, split = fused.graph.node[1], fused.graph.node[2]
    assert len(reduce_mean.input) == 2 and not reduce_mean.attribute  # axes became an input
    assert [a.i for a in split.attribute if a.name == "num_outputs"] == [2]


def test_refuses_an_upgrade_over_an_op_that_changed_meaning():
    text = RMS.replace('"" : 18]', '"" : 17]').replace(
        "<keepdims = 1> (x2, axes)", "<keepdims = 1, axes = [-1]> (x2)"
    )
    text = text.replace(
        "(float[2, 4, 8] x)", "(float[2, 4, 8] x, float[1, 1, 4, 4] img, float[1, 2, 2, 2] grid)"
    )
    text = text.replace("=> (float[2, 4, 8] y)", "=> (float[2, 4, 8] y, float[1, 1, 2, 2] sampled)")
    text = text.replace(
        "    y = Mul (n, scale)", "    y = Mul (n, scale)\n    sampled = GridSample (img, grid)"
    )
    assert_not_fused("rms_norm", text)


def test_fuses_without_scale():
    """A scale of ones that the generic passes removed (x * 1), or none: the rule supplies the ones."""
    fused = assert_fuses(
        "rms_norm",
        RMS.replace("n = Mul (x, inv)\n    y = Mul (n, scale)", "y = Mul (x, inv)"),
        ["RMSNormalization"],
    )
    scale = next(init for init in fused.graph.initializer if init.name == fused.graph.node[0].input[1])
    assert list(onnx.numpy_helper.to_array(scale)) == [1.0] * 8


def test_a_full_shaped_scale_stays_a_mul_after_the_normalisation():
    text = RMS.replace("float[8] scale = {1.5, 0.5, 1, 2, -1, 0.25, 3, 1}, ", "")
    text = text.replace("(float[2, 4, 8] x)", "(float[2, 4, 8] x, float[2, 4, 8] scale)")
    assert_fuses("rms_norm", text, ["RMSNormalization", "Mul"])
