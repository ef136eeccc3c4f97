"""``bounded_attention_mask``: in each mask form exporters write, the minus-infinity constant becomes the bounded
one measured on the samples, the op types stay, and ONNX Runtime's outputs are bit for bit the original's (every
masked softmax term still underflows to 0); it refuses, with its reason, a constant that reaches anything but a
Softmax's input, and a multiplier that is not a 0/1 mask."""

import numpy as np
import onnx_ir as ir
import pytest

from flexdsa_core.targets.forms import discover_forms
from flexdsa_core.targets.forms.bounded_mask import LN_SMALLEST, MARGIN
from tests.core.fusions.harness import parse, run

FORM = discover_forms()["bounded_attention_mask"]

# (1 - Cast(mask)) * finfo.min, unsqueezed and added to the scores (HF BERT's extended attention mask).
MUL_MASK = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 2, 6, 6] scores, int64[1, 6] mask) => (float[1, 2, 6, 6] probs)
{
  one = Constant <value = float {1.0}> ()
  big = Constant <value = float {-3.4028234663852886e38}> ()
  axes = Constant <value = int64[2] {1, 2}> ()
  m = Cast <to = 1> (mask)
  inverted = Sub (one, m)
  wide = Unsqueeze (inverted, axes)
  additive = Mul (wide, big)
  masked = Add (scores, additive)
  probs = Softmax <axis = -1> (masked)
}
"""

# masked_fill of the scores: Where(mask, scores, -inf).
WHERE_MASK = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 2, 6, 6] scores, bool[1, 1, 1, 6] keep) => (float[1, 2, 6, 6] probs)
{
  big = Constant <value = float {-10000.0}> ()
  masked = Where (keep, scores, big)
  probs = Softmax <axis = -1> (masked)
}
"""

# A causal mask folded into a constant tensor of 0 and -inf, added to the scores.
CAUSAL = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 2, 4, 4] scores) => (float[1, 2, 4, 4] probs)
{
  causal = Constant <value = float[1, 1, 4, 4] {0, -inf, -inf, -inf, 0, 0, -inf, -inf, 0, 0, 0, -inf, 0, 0, 0, 0}> ()
  masked = Add (scores, causal)
  probs = Softmax <axis = -1> (masked)
}
"""


def _samples(text: str, count: int = 6, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    model = ir.from_proto(parse(text))
    samples = []
    for _ in range(count):
        sample = {}
        for value in model.graph.inputs:
            shape = [int(d) for d in value.shape]
            if value.dtype == ir.DataType.FLOAT:
                sample[value.name] = (rng.standard_normal(shape) * 8).astype(np.float32)
            elif value.dtype == ir.DataType.BOOL:
                sample[value.name] = rng.integers(0, 2, shape).astype(bool)
            else:
                sample[value.name] = (np.arange(shape[-1]) < rng.integers(1, shape[-1])).astype(np.int64)[
                    None
                ]
        samples.append(sample)
    return samples


def _applied(text: str, samples: list[dict]):
    model = ir.from_proto(parse(text))
    applied = FORM.apply(model, samples)
    return model, applied


def _bounded_constants(model: ir.Model) -> list[np.ndarray]:
    return [v.const_value.numpy() for v in model.graph.initializers.values() if v.name.endswith("_bounded")]


@pytest.mark.parametrize("text", [MUL_MASK, WHERE_MASK, CAUSAL], ids=["mul", "where", "causal"])
def test_the_constant_is_bounded_and_the_outputs_are_bit_identical(text):
    samples = _samples(text)
    before = ir.from_proto(parse(text))
    model, applied = _applied(text, samples)
    assert len(applied.sites) == 1, applied.refused
    constant = applied.measured["constant"]
    # Below every masked score by the float32 underflow bound and the margin, and far above -1e4.
    assert -1000 < constant <= -(LN_SMALLEST + MARGIN + applied.measured["largest_masked_lead"])
    assert [n.op_type for n in model.graph if n.op_type != "Constant"] == [
        n.op_type for n in before.graph if n.op_type != "Constant"
    ]
    (bounded,) = _bounded_constants(model)
    assert bounded.min() == constant and not np.isinf(bounded).any()
    for sample in samples + _samples(text, seed=7):  # samples it measured on and others
        for want, got in zip(run(ir.to_proto(before), sample), run(ir.to_proto(model), sample), strict=True):
            np.testing.assert_array_equal(got, want)


def test_a_row_with_nothing_to_attend_is_the_one_difference():
    """A mask of all zeros leaves no position to attend: the original's finfo.min row is uniform (the scores
    vanish in the rounding), the bounded row is softmax(scores). Rows with a position to attend stay identical."""
    samples = _samples(MUL_MASK)
    model, _ = _applied(MUL_MASK, samples)
    sample = {**samples[0], "mask": np.zeros((1, 6), np.int64)}
    want, got = run(parse(MUL_MASK), sample)[0], run(ir.to_proto(model), sample)[0]
    np.testing.assert_allclose(want, 1 / 6, rtol=1e-6)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-6)


def test_a_constant_that_reaches_more_than_a_softmax_is_left_alone():
    text = MUL_MASK.replace(
        "=> (float[1, 2, 6, 6] probs)", "=> (float[1, 2, 6, 6] probs, float[1, 1, 1, 6] additive)"
    )
    model, applied = _applied(text, _samples(MUL_MASK))
    assert not applied.sites
    assert any("graph output" in reason for reason in applied.refused), applied.refused
    assert not _bounded_constants(model)


def test_a_multiplier_that_is_not_a_mask_is_left_alone():
    """Mul(x, -1e4) for a float x: not a 0/1 mask, so m·C is not m·K's equal in effect."""
    text = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 2, 6, 6] scores, float[1, 1, 1, 6] weight) => (float[1, 2, 6, 6] probs)
{
  big = Constant <value = float {-10000.0}> ()
  additive = Mul (weight, big)
  masked = Add (scores, additive)
  probs = Softmax <axis = -1> (masked)
}
"""
    model, applied = _applied(text, _samples(text))
    assert not applied.sites
    assert any("is not a 0/1 mask" in reason for reason in applied.refused), applied.refused
