"""The job's figures (``flexdsa_core.figures``): one latency and energy per bucket and one accuracy, each with its
source; an estimate that leaves CPU-fallback nodes out is a lower bound that says what it leaves out, and one
whose CPU has a sourced peak includes them; synthetic-input accuracy says "numerics only"; an int8 job's
validation names the fp32 model it checked; the re-specialisation proposal is anchored to the job's figure."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest
from onnx import helper

from flexdsa_core.cost_model import CostModel
from flexdsa_core.figures import figures_of, job_figures, seconds_text
from flexdsa_core.memory_planner import plan_memory
from flexdsa_core.respecialise import propose
from flexdsa_core.subgraph_mapper import SubgraphMapper
from flexdsa_core.targets import load_target
from flexdsa_core.targets.accelerator import ADAPTER
from flexdsa_core.vendor_runs.estimate import target_estimate
from tests.core.test_subgraph_mapper import _chain, _target
from tests.models import fixture


def _estimate(target, model):
    cost_model = CostModel(target)
    mapping = SubgraphMapper(target, ADAPTER, cost_model).map(model)
    return target_estimate(target, mapping, cost_model.graph_cost(model), plan_memory(model).as_dict())


def _sigmoid_tail() -> ir.Model:
    """Two Conv+Relu blocks on the accelerator, then a Sigmoid its op table lacks: one CPU-fallback node."""
    return _chain(2, extra=[helper.make_node("Sigmoid", ["r1"], ["y"], name="sig")])


def test_fallback_left_out_makes_a_lower_bound_that_names_it():
    estimate = _estimate(_target(), _sigmoid_tail())
    assert estimate["complete"] is False and estimate["left_out"] == ["1 CPU-fallback node"]
    assert estimate["fallback_s"] is None and estimate["latency_s"] == estimate["accelerator_s"] + estimate["transfer_s"]
    figure = job_figures(_report(estimate))["latency"]
    assert figure["seconds"] == estimate["latency_s"] and figure["complete"] is False
    assert figure["text"] == f"≥ {seconds_text(estimate['latency_s'])}"
    assert figure["label"] == f"{figure['text']} (roofline estimate; not included: 1 CPU-fallback node)"


def test_a_cpu_with_a_sourced_peak_has_its_fallback_time_added():
    without = _estimate(_target(), _sigmoid_tail())
    estimate = _estimate(_target(cpu_peak_ops_per_s=2e10), _sigmoid_tail())
    assert estimate["complete"] is True and estimate["left_out"] == []
    # Sigmoid over 8x16x16 floats: its FLOPs at the CPU's peak or its bytes at the memory bandwidth.
    assert estimate["fallback_s"] > 0
    assert estimate["latency_s"] == pytest.approx(without["latency_s"] + estimate["fallback_s"])
    assert any("estimated at its sourced peak (20 GFLOP/s)" in note for note in estimate["notes"])
    figure = job_figures(_report(estimate))["latency"]
    assert figure["complete"] and figure["text"] == seconds_text(estimate["latency_s"]) and "≥" not in figure["label"]


def test_a_cpu_peak_without_a_bandwidth_still_says_what_it_leaves_out():
    estimate = _estimate(_target(cpu_peak_ops_per_s=2e10, mem_bandwidth_bytes_per_s=None), _sigmoid_tail())
    assert estimate["complete"] is False
    assert "the CPU-fallback nodes' memory traffic (bandwidth unsourced)" in estimate["left_out"]


def test_a_spec_without_a_cpu_peak_keeps_its_hash():
    """The new field changes no built-in spec's hash, so no kernel cache entry of theirs is lost."""
    spec = load_target("rockchip-rk3588")
    assert spec.cpu_peak_ops_per_s is None
    assert spec.model_copy(update={"cpu_peak_ops_per_s": 1e10}).content_sha256 != spec.content_sha256


def _report(on_target: dict, **sections) -> dict:
    bucket = "b1"
    return {
        "target": {"name": "test-npu", "measured_here": False},
        "estimates": {"per_bucket": {bucket: {"on_target": on_target}}},
        "partition": {bucket: {"cpu_nodes": len(on_target.get("left_out") or [])}},
        "validation": {"performed": True, "ok": True, "buckets": [{"outputs": [{"max_abs": 3e-7}]}]},
        **sections,
    }


def test_energy_follows_the_latency_and_says_when_unsourced():
    estimate = _estimate(_target(power_w=8.0), _sigmoid_tail())
    figures = job_figures(_report(estimate))
    assert figures["energy"]["joules"] == 8.0 * estimate["latency_s"] and figures["energy"]["text"].startswith("≥ ")
    unpowered = job_figures(_report(_estimate(_target(), _sigmoid_tail())))
    assert unpowered["energy"]["joules"] is None
    assert unpowered["energy"]["label"] == "not known (the target's power is unsourced)"


def test_cpu_ort_is_measured_at_the_bucket_it_timed_only():
    report = {
        "target": {"name": "cpu-ort", "measured_here": True},
        "shapes": {"buckets": ["seq16", "seq64"]},
        "latency": {"after_s": 5.08e-4, "before_s": 5.7e-4, "bucket": "seq64", "repeats": 20},
    }
    figures = job_figures(report)
    assert figures["bucket"] == "seq64" and figures["latency"]["text"] == "508 µs"
    assert figures["latency"]["label"] == "508 µs (measured on this CPU)"
    assert figures["per_bucket"]["seq16"]["latency"]["label"] == "not known (the latency check timed bucket seq64 only)"
    assert figures["energy"]["source"] == "not known"


def test_synthetic_inputs_check_numerics_only_everywhere():
    toolchain = {"name": "amd", "ran": True, "buckets": {"b1": {
        "numerics": [{"name": "y", "cosine": 0.99915}], "quantization": {"precision": "int8"}}}}  # fmt: skip
    figures = job_figures(_report(_estimate(_target(), _sigmoid_tail()), toolchain=toolchain))
    accuracy = figures["accuracy"]
    assert accuracy["numerics_only"] and accuracy["text"] == "cosine 0.99915, numerics only"
    assert accuracy["of"] == "int8" and "the shipped int8 model" in accuracy["label"]
    # The validation compared the fp32 optimised model: the summary says so, not "passed" about what ships.
    validation = figures["validation"]["text"]
    assert validation.startswith("passed: the fp32 optimised model against the original")
    assert "not the shipped int8 model" in validation

    held_out = {"shipped": "int8", "calibration": {"source": "synthetic"},
                "accuracy": {"loss": 0.002, "metric": "cosine", "ok": True, "measured_on": "4 held-out synthetic random inputs"}}  # fmt: skip
    accuracy = job_figures(_report(_estimate(_target(), _sigmoid_tail()), precision=held_out))["accuracy"]
    assert accuracy["source"] == "held-out samples" and accuracy["numerics_only"]
    samples = {**held_out, "calibration": {"source": "uploaded"},
               "accuracy": {**held_out["accuracy"], "measured_on": "8 held-out samples of yours"}}  # fmt: skip
    accuracy = job_figures(_report(_estimate(_target(), _sigmoid_tail()), precision=samples))["accuracy"]
    assert not accuracy["numerics_only"] and accuracy["text"] == "cosine 0.99800"


def test_a_report_from_before_figures_gets_them_from_its_sections():
    """An older report: no ``figures``, an on-target estimate marked ``partial`` with no ``left_out``."""
    old = _report({"latency_s": 2.6e-5, "partial": True, "energy_j": None, "notes": []})
    old["partition"]["b1"]["cpu_nodes"] = 4
    figures = figures_of(old)
    assert figures["latency"]["label"] == "≥ 26 µs (roofline estimate; not included: 4 CPU-fallback nodes)"
    kept = {**old, "figures": figures}
    assert figures_of(kept) is figures


def test_seconds_are_written_one_way():
    assert [seconds_text(s) for s in (2.599e-5, 2.837e-4, 4.3257e-4, 0.0123, 2.5)] == [
        "26 µs", "284 µs", "433 µs", "12.3 ms", "2.5 s",
    ]  # fmt: skip


def test_the_proposal_is_anchored_to_the_jobs_figure():
    """Traffic served by the bundle's one bucket costs, per request, the job's figure for that bucket; the
    ratios do not move, and a lower bound stays one."""
    bert = ir.from_proto(onnx.load(fixture("bert")))
    traffic = [({"batch": 1, "seq": s}, n) for s, n in {4: 30, 9: 12, 40: 4}.items()]
    bucket = [{"dims": {"batch": 1, "seq": 64}}]
    target = load_target("rockchip-rk3588")
    plain = propose(bert, target, traffic, bucket, 2)
    anchor = {"bucket": "batch1_seq64", "dims": {"batch": 1, "seq": 64}, "seconds": 2.6e-5, "complete": False,
              "label": "≥ 26 µs (roofline estimate; not included: 4 CPU-fallback nodes)"}  # fmt: skip
    found = propose(bert, target, traffic, bucket, 2, anchor=anchor)
    assert found["current"]["expected_cost_s"] == pytest.approx(2.6e-5)
    assert found["current"]["expected_cost_text"] == "≥ 26 µs"
    assert found["gain"]["cost_vs_current"] == pytest.approx(plain["gain"]["cost_vs_current"])
    assert found["current"]["padding_waste"] == pytest.approx(plain["current"]["padding_waste"])
    assert found["anchor"]["model_cost_s"] == pytest.approx(plain["current"]["expected_cost_s"])
    assert "costs the job's latency figure for it (≥ 26 µs" in found["cost_basis"]
    assert "no latency figure to anchor" in plain["cost_basis"] and plain["padding_waste_of"].startswith("cost")


@pytest.mark.parametrize(
    ("quantization", "shipped"),
    [({"precision": "int8", "preset": "XINT8"}, "int8"), ("rknn w8a8 (normal, channel weights) on 4 samples", "int8"),
     ("float graph on HTP FP16 (enable_htp_fp16_precision=1)", "fp16"), (None, "fp32"), ("something else", "fp32")],
)  # fmt: skip
def test_the_shipped_precision_from_each_toolchains_record(quantization, shipped):
    """Quark records a dict, RKNN and QNN a line of text: every form reads, none fails the job."""
    toolchain = {"name": "v", "ran": True, "buckets": {"b1": {"quantization": quantization, "numerics": []}}}
    figures = job_figures(_report(_estimate(_target(), _sigmoid_tail()), toolchain=toolchain))
    assert figures["accuracy"]["of"] == shipped
    assert ("not the shipped" in figures["validation"]["text"]) == (shipped != "fp32")


def test_an_int8_cpu_job_is_timed_as_the_model_that_ships():
    """The latency check times the fp32 optimised model; the figure is the shipped int8 model's own time, from
    the rounds paired with the original that the headline speed-up divides."""
    versus = {"verdict": "faster", "ratio_median": 0.6, "ratio_ci": [0.55, 0.65], "rounds": 21,
              "first_s": 1.0e-3, "second_s": 6.0e-4}  # fmt: skip
    report = {
        "target": {"name": "cpu-ort", "measured_here": True},
        "shapes": {"buckets": ["static"]},
        "latency": {"after_s": 9.0e-4, "before_s": 1.0e-3, "bucket": "static"},
        "precision": {"shipped": "int8_static", "candidates": [{"name": "int8_static", "timing_vs_fp32": {"vs_original": versus}}]},
    }  # fmt: skip
    latency = job_figures(report)["latency"]
    assert latency["seconds"] == 6.0e-4 and latency["text"] == "600 µs"
    assert latency["detail"].startswith("the shipped int8_static model")
