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
        pytest.param(('"" : 18]', '"" : 17]'), id="opset-17-reduce-mean-changes-at-18"),
        pytest.param(
            ("float[8] scale = {1.5, 0.5, 1, 2, -1, 0.25, 3, 1}", "float[2, 4, 8] scale = {}"),
            id="scale-not-1d",
        ),
    ],
)
def test_refuses(change):
    old, new = change
    text = RMS.replace(old, new)
    if "float[2, 4, 8] scale" in text:  # a full-shaped scale comes in as an input
        text = text.replace("float[2, 4, 8] scale = {}, ", "").replace(
            "(float[2, 4, 8] x)", "(float[2, 4, 8] x, float[2, 4, 8] scale)"
        )
    if '"" : 17' in text:
        text = text.replace("<keepdims = 1> (x2, axes)", "<keepdims = 1, axes = [-1]> (x2)")
    assert_not_fused("rms_norm", text)


def test_refuses_a_cast_up_without_the_cast_back():
    text = RMS_FP16.replace("nh = Cast <to = 10> (n)\n    y = Mul (scale, nh)", "y = Mul (scale, n)").replace(
        "float16[8] scale", "float[8] scale"
    )
    text = text.replace("=> (float16[2, 4, 8] y)", "=> (float[2, 4, 8] y)")
    assert_not_fused("rms_norm", text)
