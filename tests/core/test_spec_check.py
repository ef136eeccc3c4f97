"""One reading of a request spec for every surface (``flexdsa_core.spec_check``): the sentence the API answers
and the command lines print, in one line with its fix."""

from __future__ import annotations

import pytest

from flexdsa_core import RequestSpec, load_target
from flexdsa_core.errors import InvalidOptionsError, TargetNotFoundError
from flexdsa_core.spec_check import (
    CalibrationUseError,
    SpecError,
    check_calibration_use,
    one_line,
    parse_buckets,
    parse_request,
)


def test_a_mistyped_key_is_one_sentence_with_did_you_mean():
    with pytest.raises(SpecError) as refused:
        parse_request({"target": "cpu-ort", "shape_bucket": {"seq": [8]}, "accuracy": {"min_cosin": 0.9}})
    message = refused.value.message
    assert "\n" not in message and message.startswith("The spec is not a valid request spec: ")
    assert "Unknown key 'shape_bucket': did you mean 'shape_buckets'?" in message
    assert "did you mean 'min_cosine'" in message
    assert refused.value.code == "invalid_spec"
    assert {tuple(d["loc"]): d.get("did_you_mean") for d in refused.value.details} == {
        ("shape_bucket",): "shape_buckets", ("accuracy", "min_cosin"): "min_cosine"
    }  # fmt: skip


def test_a_wrong_value_names_its_field():
    with pytest.raises(SpecError, match=r"precision: Input should be 'fp32', 'fp16', 'int8' or 'mixed'"):
        parse_request('{"target": "cpu-ort", "precision": "int4"}')


def test_calibration_without_a_precision_that_uses_it_is_refused():
    with pytest.raises(CalibrationUseError, match="precision is fp32, which does not use them"):
        check_calibration_use(RequestSpec(target="cpu-ort"), has_calibration=True)
    check_calibration_use(RequestSpec(target="cpu-ort", precision="int8"), has_calibration=True)
    check_calibration_use(RequestSpec(target="cpu-ort"), has_calibration=False)


def test_target_all_points_at_targets():
    with pytest.raises(TargetNotFoundError, match=r'send "targets" in its place.*--targets all'):
        load_target("all")


def test_one_line_folds_details_the_message_does_not_carry():
    details = [{"loc": ["seed"], "msg": "Input should be a valid integer"}]
    assert one_line("The 'spec' field is not valid; see details.", details) == (
        "The 'spec' field is not valid: seed: Input should be a valid integer"
    )
    assert one_line("two\n  lines") == "two lines"


def test_buckets_from_the_command_line():
    assert parse_buckets(["seq=32,64", "batch=1"]) == {"seq": [32, 64], "batch": [1]}
    assert parse_buckets(["seq=8;batch=1,2"]) == {"seq": [8], "batch": [1, 2]}
    assert parse_buckets(['{"seq": [16]}']) == {"seq": [16]}
    for wrong in (["seq"], ["seq=a,b"], ["{not json"]):
        with pytest.raises(InvalidOptionsError, match="--buckets"):
            parse_buckets(wrong)
