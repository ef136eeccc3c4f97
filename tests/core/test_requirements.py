"""Gates for pipelines (``flexdsa_core.requirements``): requirements read with "did you mean", the figures taken
from a job's report summary with their sources, verdicts that never pass on a figure the report lacks, and the
comparison with the previous job of the same model."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from flexdsa_core import RequestSpec
from flexdsa_core.requirements import (
    canonical,
    compare_with_previous,
    evaluate,
    figures,
    parse,
    unmet_line,
)


def _summary(speedup=1.3, latency_s=0.0005, accuracy=None, cpu_nodes=0, source="measured on this CPU"):
    accuracy = accuracy or {"value": 3e-7, "metric": "max_abs", "source": "ONNX Runtime validation"}
    return {
        "speedup": speedup,
        "headline": {"speedup": speedup, "source": "this CPU, measured", "text": f"{speedup:.2f}x the original model"},
        "comparison": {"latency": {"seconds": latency_s, "source": source}, "accuracy": accuracy,
                       "cpu_fallback_nodes": cpu_nodes},
    }  # fmt: skip


@pytest.mark.parametrize(
    ("text", "expected"),
    [("speedup>=1.2", ("speedup", ">=", 1.2)), (" accuracy >= 0.99 ", ("accuracy", ">=", 0.99)),
     ("cpu_nodes==0", ("cpu_nodes", "==", 0.0)), ("latency_ms<5", ("latency_ms", "<", 5.0)),
     ("no_regression", ("no_regression", None, None))],
)  # fmt: skip
def test_requirements_are_read(text, expected):
    assert parse(text) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [("sppedup>=1.2", "Did you mean 'speedup'"), ("acuracy>=0.9", "Did you mean 'accuracy'"),
     ("no_regresion", "Did you mean 'no_regression'"), ("speedup=>1.2", "Cannot read"),
     ("speedup", "needs a bound"), ("no_regression>1", "takes no bound"), ("frobs>3", "Known: speedup")],
)  # fmt: skip
def test_an_unreadable_requirement_says_how_to_write_it(text, says):
    with pytest.raises(ValueError, match=says):
        parse(text)


def test_the_spec_refuses_an_unknown_requirement_with_did_you_mean():
    with pytest.raises(ValidationError) as refused:
        RequestSpec.model_validate({"target": "cpu-ort", "requirements": ["sped>=1.2"]})
    assert "Did you mean 'speedup'" in str(refused.value)
    spec = RequestSpec.model_validate({"target": "cpu-ort", "requirements": [" speedup >= 1.20 ", "no_regression"]})
    assert spec.requirements == [canonical("speedup>=1.20"), "no_regression"] == ["speedup>=1.20", "no_regression"]
    # Not pipeline options: the optimizer never sees them.
    assert "requirements" not in spec.options().model_dump() and "model_name" not in spec.options().model_dump()


def test_figures_come_from_the_summary_with_their_sources():
    found = figures(_summary(), bundle_bytes=2_500_000)
    assert found["speedup"] == 1.3 and found["speedup_source"] == "this CPU, measured"
    assert found["latency_ms"] == 0.5 and found["latency_source"] == "measured on this CPU"
    assert found["bundle_mb"] == 2.5 and found["cpu_nodes"] == 0
    # An fp32 job checked numerically makes no accuracy claim: no accuracy figure, and why.
    assert found["accuracy"] is None and "no accuracy claim" in found["accuracy_source"]
    held_out = {"value": 0.9931, "metric": "cosine", "source": "held-out samples"}
    found = figures(_summary(accuracy=held_out), None)
    assert found["accuracy"] == 0.9931 and found["accuracy_metric"] == "cosine" and found["bundle_mb"] is None


def test_verdicts_pass_and_fail_on_the_figure_and_never_on_a_missing_one():
    current = figures(_summary(speedup=1.04), 1_000_000)
    verdicts = {v["expr"]: v for v in evaluate(["speedup>=1.2", "speedup>=1", "cpu_nodes==0", "accuracy>=0.99"],
                                                current, None)}  # fmt: skip
    assert verdicts["speedup>=1.2"]["met"] is False and verdicts["speedup>=1.2"]["figure"] == 1.04
    assert verdicts["speedup>=1"]["met"] is True and verdicts["cpu_nodes==0"]["met"] is True
    assert verdicts["accuracy>=0.99"]["met"] is False and verdicts["accuracy>=0.99"]["figure"] is None
    line = unmet_line(verdicts["speedup>=1.2"])
    assert line.startswith("requirement not met: speedup>=1.2: speedup is 1.04") and "\n" not in line
    assert "no accuracy claim" in unmet_line(verdicts["accuracy>=0.99"])


def test_no_regression_compares_with_the_previous_job():
    before = figures(_summary(latency_s=0.0005, source="roofline estimate"), 1_000_000)
    same = figures(_summary(latency_s=0.000502, source="roofline estimate"), 1_010_000)
    rows = compare_with_previous(same, before)
    assert {r["figure"]: r["regressed"] for r in rows} == {
        "latency_ms": False, "accuracy": None, "bundle_mb": False, "cpu_nodes": False
    }  # fmt: skip
    verdict = evaluate(["no_regression"], same, {"job_id": "j1", "rows": rows})[0]
    assert verdict["met"] is True and "j1" in verdict["detail"]

    worse = figures(_summary(latency_s=0.0006, cpu_nodes=2, source="roofline estimate"), 1_200_000)
    rows = compare_with_previous(worse, before)
    verdict = evaluate(["no_regression"], worse, {"job_id": "j1", "rows": rows})[0]
    assert verdict["met"] is False and verdict["figure"] == ["latency_ms", "bundle_mb", "cpu_nodes"]
    assert "latency_ms 0.6 vs 0.5 (+20.0%" in verdict["detail"]
    # With no earlier job there is nothing to regress from.
    assert evaluate(["no_regression"], worse, None)[0]["met"] is True


def test_measured_latency_has_room_for_noise_and_other_sources_are_not_compared():
    before = figures(_summary(latency_s=0.0005), None)
    noisy = figures(_summary(latency_s=0.00054), None)  # +8%: within the measured tolerance
    assert compare_with_previous(noisy, before)[0]["regressed"] is False
    estimated = figures(_summary(latency_s=0.0009, source="roofline estimate"), None)
    assert compare_with_previous(estimated, before)[0]["regressed"] is None


def test_a_figure_on_synthetic_inputs_claims_no_accuracy():
    synthetic = {"value": 0.99915, "metric": "cosine", "source": "vendor simulator (amd)", "numerics_only": True,
                 "text": "cosine 0.99915, numerics only"}  # fmt: skip
    found = figures(_summary(accuracy=synthetic), None)
    assert found["accuracy"] is None and "numerics only" in found["accuracy_source"]
    [verdict] = evaluate(["accuracy>=0.99"], found, None)
    assert verdict["met"] is False and "synthetic inputs" in verdict["detail"]


def test_an_upper_limit_is_not_met_by_a_lower_bound():
    """A latency that leaves the CPU-fallback nodes out only bounds the time from below: 'latency_ms<5' cannot
    be established from it, while 'latency_ms>0.001' can."""
    summary = _summary(latency_s=2.6e-5, source="roofline estimate")
    summary["comparison"]["latency"].update(
        complete=False, label="≥ 26 µs (roofline estimate; not included: 4 CPU-fallback nodes)"
    )
    below, above = evaluate(["latency_ms<5", "latency_ms>0.001"], figures(summary, None), None)
    assert below["met"] is False and "a lower bound" in below["detail"] and "4 CPU-fallback nodes" in below["detail"]
    assert above["met"] is True
