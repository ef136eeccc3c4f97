"""The compiler's padding check: a masked model tolerates padding (and says which output axes to crop), an
unmasked mean does not (with the reason), a 1-means-ignore mask gets pad value 1, a dim nothing pads is
marked so; and the optimiser writes the verdicts into the bundle's manifest and warns on a refusal."""

from __future__ import annotations

import json

import onnx

from flexdsa_core import FlexDSAOptimizer, RequestSpec
from flexdsa_core.padding_check import check_padding
from flexdsa_core.shape_tracker import ShapeTracker
from flexdsa_core.targets import load_target
from tests.runtime.tiny_models import IGNORE_MASK, MASKED, UNMASKED, model_bytes


def _check(text: str, buckets: dict):
    import onnx_ir as ir

    data = model_bytes(text)
    tracker = ShapeTracker(ir.from_proto(onnx.load_from_string(data)))
    report = tracker.infer()
    tracker.buckets(buckets, load_target("cpu-ort"))
    return check_padding(data, onnx.load_from_string(data), tracker.manifest(), report.as_dict()["outputs"])


def test_a_masked_model_tolerates_padding_and_names_the_axes_to_crop():
    found = _check(MASKED, {"batch": [2], "seq": [8, 16]})
    assert found["dims"]["seq"]["tolerated"] is True
    assert found["dims"]["seq"]["checked"]["runtime"] == 4 and found["dims"]["seq"]["checked"]["bucket"] == 8
    assert found["dims"]["batch"]["tolerated"] is True  # rows of a batch never meet
    assert found["crop"] == {"y": {"seq": [1], "batch": [0]}, "z": {"batch": [0]}}
    assert found["pad_values"] == {"x": 0, "attention_mask": 0}


def test_an_unmasked_mean_does_not_and_says_why():
    found = _check(UNMASKED, {"batch": [1], "seq": [8, 16]})
    seq = found["dims"]["seq"]
    assert seq["tolerated"] is False
    assert "changes output 'z'" in seq["reason"] and "max |Δ|" in seq["reason"]
    assert found["dims"]["batch"] == {"tolerated": None, "note": "never padded: every bucket has batch = 1"}


def test_a_mask_where_one_means_ignore_is_padded_with_one():
    found = _check(IGNORE_MASK, {"batch": [1], "seq": [8]})
    assert found["dims"]["seq"]["tolerated"] is True
    assert found["pad_values"]["ignore_mask"] == 1 and found["pad_values"]["x"] == 0


def test_a_dynamic_bundle_pads_nothing():
    found = _check(MASKED, {})
    assert found["dims"] == {} and "nothing is padded" in found["note"]


def test_the_optimiser_writes_the_verdict_into_the_manifest_and_warns():
    request = RequestSpec.model_validate(
        {"target": "cpu-ort", "shape_buckets": {"batch": [1], "seq": [8, 16]}, "measure_latency": False}
    )
    result = FlexDSAOptimizer(request.target_spec()).optimize(model_bytes(UNMASKED), request.options())
    manifest = json.loads(result.artifacts["manifest.json"])
    assert manifest["runtime"]["padding"]["seq"]["tolerated"] is False
    assert result.report["shapes"]["padding"]["dims"]["seq"]["tolerated"] is False
    assert any("padding seq changes the outputs" in w for w in result.report["warnings"])
