"""The report never contradicts itself: labels say what was measured, a refused alternative has no
"taken" line, cache stats do not claim time saved without hits, an estimate above the measured model says
why, the fusion list holds fusions only, and bucket notes name no file that is not written."""

from __future__ import annotations

import json

import pytest

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.cache import LRUCache, StatsCache
from flexdsa_core.cost import Cost
from flexdsa_core.cost_model import CostModel
from flexdsa_core.dims import is_batch_dim
from flexdsa_core.fusion_switcher import _label
from flexdsa_core.fusions import make_rule
from flexdsa_core.report import _explain_gain_beyond_measurement
from flexdsa_core.targets import load_target
from tests.core.test_fusion_switcher import DEDUPE_RELU, _entry, _npu_switcher, _relu_model
from tests.core.test_preflight import positions_model
from tests.core.test_rollback import LAYER_NORM_MODEL
from tests.models import fixture


def test_measured_only_when_both_sides_were_timed_here():
    timed = Cost(seconds=1e-5, kernels=2, measured=2)
    assert _label(timed, Cost(seconds=1e-5, kernels=1, measured=1), None) == "measured"
    # RMSNormalization cannot run alone in ONNX Runtime: its side is estimated, so the whole is not "measured".
    assert (
        _label(timed, Cost(seconds=1e-5, kernels=1, measured=0), None)
        == "partly measured (the rest estimated)"
    )
    assert _label(Cost(kernels=2), Cost(kernels=1), None) == "estimated"


def test_a_refused_alternative_has_no_taken_line():
    twin = make_rule(
        "test_twin", DEDUPE_RELU.summary, ["Relu"], DEDUPE_RELU.rewrite_rules, alternatives="relu"
    )
    first = make_rule(
        "test_first", DEDUPE_RELU.summary, ["Relu"], DEDUPE_RELU.rewrite_rules, alternatives="relu"
    )
    plan = _npu_switcher().run(_relu_model(), [first, twin])
    chosen, other = _entry(plan, "test_first"), _entry(plan, "test_twin")
    assert chosen["decision"] == "taken" and other["decision"] == "refused"
    assert other["taken"] == 0 and other["refused"] == 1
    assert other["by_kind"], "expected the refused twin's plan entry to break its decision down by kind"
    assert not any(line["taken"] for line in other["by_kind"])
    assert all(not line["reason"].endswith(": taken") for line in other["by_kind"])


def test_cache_stats_claim_no_time_saved_without_hits():
    relu = next(iter(_relu_model().graph))
    cache = StatsCache(LRUCache())
    model = CostModel(load_target("cpu-ort"), cache=cache)
    model.node_cost(relu)
    model.node_cost(relu)  # the cost model's own memo: not a hit of the caller's cache
    assert cache.stats.puts == 1 and cache.stats.hits == 0 and cache.stats.seconds_saved == 0
    CostModel(load_target("cpu-ort"), cache=cache).node_cost(relu)  # a new job: the caller's cache hits
    assert cache.stats.hits == 1 and cache.stats.seconds_saved > 0


def test_an_estimated_gain_above_the_measured_model_says_why():
    estimates = {"dynamic": {"fusion_gain_estimate_s": 0.118e-3}}
    _explain_gain_beyond_measurement(estimates, {"bucket": "dynamic", "before_s": 0.093e-3})
    assert (
        "exceeds the whole original model as measured"
        in estimates["dynamic"]["fusion_gain_exceeds_measured_model"]
    )
    below = {"dynamic": {"fusion_gain_estimate_s": 0.01e-3}}
    _explain_gain_beyond_measurement(below, {"bucket": "dynamic", "before_s": 0.093e-3})
    assert "fusion_gain_exceeds_measured_model" not in below["dynamic"]


def test_the_fusion_list_holds_fusions_and_bucket_notes_name_no_missing_file():
    report = (
        FlexDSAOptimizer("cpu-ort").optimize(LAYER_NORM_MODEL, OptimizeOptions(measure_latency=False)).report
    )
    assert report["fusions"]["applied"] == ["layer_norm"]
    assert "layer_norm" in report["rewrites_applied"]
    # No convolutions: ONNX Runtime's offline pass is skipped, and the bucket's notes say so.
    assert "ort_layout" not in report["rewrites_applied"]
    assert any("offline pass skipped" in note for note in report["legalization"]["dynamic"])
    result = FlexDSAOptimizer("cpu-ort").optimize(
        positions_model(), OptimizeOptions(shape_buckets={"seq": [8, 16]}, measure_latency=False)
    )
    notes = [note for notes in result.report["legalization"].values() for note in notes]
    written = set(result.artifacts)
    assert "model.onnx" not in written and notes
    assert not any("model.onnx" in note or "model.portable.onnx" in note for note in notes)


@pytest.mark.models
@pytest.mark.parametrize("name", ["bert", "resnet"])
def test_one_shape_per_bucket_across_costing_memory_validation_and_timing(name):
    """The dims that stay symbolic take one value per bucket: the fusions are costed, the memory planned,
    the outputs validated and the latency timed at it, and the report names it (``shapes.at``). The BERT
    fixture's 64-row position table refuses the default 128, so its shape is the lowered one everywhere."""
    result = FlexDSAOptimizer("cpu-ort").optimize(fixture(name), OptimizeOptions(latency_repeats=3))
    report, plans = result.report, json.loads(result.artifacts["fusion_plan.json"])
    [bucket] = report["shapes"]["buckets"]
    at = report["shapes"]["at"][bucket]
    assert at["dims"] and "latency check" in at["used_for"]
    costed = plans[bucket]["cost_model"]["representative_dims"]
    for dim, value in at["dims"].items():  # the Shape Tracker's plan names each dim; else the batch/other rule
        assert value == costed.get(dim, costed["batch"] if is_batch_dim(dim) else costed["other"]), (dim, at, costed)
        assert value == report["shapes"]["plan"]["dims"][dim]["value"]
    assert report["memory"][bucket]["dims"] == at["dims"] and not report["memory"][bucket]["assumed_dims"]
    [validation] = report["validation"]["buckets"]
    assert validation["input_shapes"] == at["input_shapes"] == report["latency"]["input_shapes"]
    # A second, small shape is validated too, and named as such.
    second = validation["second_shape"]
    assert second["ok"] and second["input_shapes"] != at["input_shapes"]
    if name == "bert":
        assert at["dims"] == {"batch": 1, "seq": 64}


def test_a_model_that_runs_at_one_length_only_is_validated_there_and_says_so():
    """A positional table of 64 rows added as is: the model runs at seq 64 only. Its one shape is seq 64
    (costed, planned, validated, timed); the second, small shape is skipped with a note, not a failed job."""
    import numpy as np
    import onnx

    table = onnx.numpy_helper.from_array(np.random.default_rng(0).random((100, 8), dtype=np.float32), "table")
    positions = onnx.numpy_helper.from_array(np.random.default_rng(1).random((1, 64, 8), dtype=np.float32), "pos")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Gather", ["table", "ids"], ["e"]), onnx.helper.make_node("Add", ["e", "pos"], ["y"])],
        "one_length",
        [onnx.helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["batch", "seq"])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", "seq", 8])],
        [table, positions],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=9)
    report = FlexDSAOptimizer("cpu-ort").optimize(model.SerializeToString(), OptimizeOptions(latency_repeats=3)).report
    at = report["shapes"]["at"]["dynamic"]
    assert at["dims"] == {"batch": 1, "seq": 64}
    assert report["validation"]["ok"] and "second_shape" not in report["validation"]["buckets"][0]
    assert report["validation"]["buckets"][0]["input_shapes"] == report["latency"]["input_shapes"] == {"ids": [1, 64]}
    assert "not validated at a second shape" in at["note"]


# --- the headline: one speed-up per job, with its source -------------------------------------------------


def _report(target: str, measured_here: bool, **extra) -> dict:
    return {
        "target": {"name": target, "version": "1", "vendor": "x", "measured_here": measured_here},
        "objective": "latency",
        "nodes": {"total_before": 4, "total_after": 3, "before": {"Add": 4}, "after": {"b": {"Add": 3}}},
        "fusions": {"applied": [], "candidates": []},
        "legalization": {}, "rollbacks": [], "validation": {"performed": False, "ok": None, "buckets": []},
        "memory": {}, "cache": {}, "total_seconds": 1.0, "warnings": [],
        **extra,
    }  # fmt: skip


def _latency(ratio: float, low: float, high: float, verdict: str) -> dict:
    comparison = {"verdict": verdict, "ratio_median": ratio, "ratio_ci": [low, high], "confidence": 0.95,
                  "min_effect": 0.03, "rounds": 21, "first_s": 0.002, "second_s": 0.00062}  # fmt: skip
    # before/after medians measured apart can say 3.23x while the paired rounds say "tie" (issue 23)
    return {"before_s": 0.002, "after_s": 0.00062, "speedup": 3.23, "comparison": comparison}


def test_a_tie_is_no_significant_difference_everywhere_never_the_ratio_of_medians():
    from flexdsa_core.report import headline, render_summary, report_summary

    report = _report("cpu-ort", True, latency=_latency(0.616, 0.18, 0.99, "tie"))
    top = headline(report)
    assert top["verdict"] == "no significant difference" and top["source"] == "this CPU, measured"
    assert top["speedup"] == pytest.approx(1 / 0.616, abs=1e-3)
    assert top["interval"] == [pytest.approx(1 / 0.99, abs=1e-3), pytest.approx(1 / 0.18, abs=1e-3)]
    assert "no significant difference" in top["text"] and "95% interval 1.01-5.56" in top["text"]
    summary = report_summary(report)
    assert summary["speedup"] == top["speedup"] != 3.23 and summary["headline"] == top
    assert f"Speed-up      {top['text']}" in render_summary(report)

    faster = headline(_report("cpu-ort", True, latency=_latency(0.8, 0.75, 0.85, "faster")))
    assert faster["verdict"] == "faster" and faster["text"].startswith(
        "1.25x the original model (its time / the optimised model's, paired rounds; 95% interval"
    )


def test_an_accelerator_job_shows_no_cpu_timing_and_names_its_estimate():
    from flexdsa_core.report import headline, render_summary, report_summary

    estimates = {"per_bucket": {"b": {"before": {"seconds": 2e-4}, "after": {"seconds": 1e-4}}}}
    partition = {"b": {"accelerator_nodes": 3, "cpu_nodes": 1}}
    report = _report("nvidia-orin-nano", False, latency=_latency(1.19, 1.1, 1.3, "slower"),
                     estimates=estimates, partition=partition)  # fmt: skip
    top = headline(report)
    assert top["source"] == "roofline estimate" and top["speedup"] == 2.0 and top["interval"] is None
    summary = report_summary(report)
    assert summary["latency_before_ms"] is None and summary["latency_after_ms"] is None
    assert summary["speedup"] == 2.0
    text = render_summary(report)
    assert "ORT CPU" not in text and "roofline estimate" in text
    assert "Placement     [b] 3 on the accelerator, 1 on the CPU" in text
    # Where the vendor's own estimate exists, it is the headline: ours against the vendor's compiler alone.
    report["vendor"] = {"tool": "rknn-toolkit2", "measure": "cycles", "buckets": {"b": {"ratio": 0.8, "precision": "int8"}}}
    top = headline(report)
    assert top["source"] == "vendor estimate" and top["speedup"] == 1.25 and top["of"] == "int8"
    assert "rknn-toolkit2 alone" in top["text"]


def test_an_int8_job_headlines_the_shipped_precision():
    from flexdsa_core.report import headline, report_summary

    versus = {"verdict": "faster", "ratio_median": 0.84, "ratio_ci": [0.8, 0.88], "confidence": 0.95,
              "min_effect": 0.03, "rounds": 21, "first_s": 1.0, "second_s": 0.84}  # fmt: skip
    precision = {"requested": "int8", "shipped": "int8_static",
                 "candidates": [{"name": "int8_static", "time_ratio_vs_fp32": 0.7,
                                 "timing_vs_fp32": {"speedup_vs_original": 1.1905, "vs_original": versus}}]}  # fmt: skip
    report = _report("cpu-ort", True, latency=_latency(0.95, 0.93, 0.97, "faster"), precision=precision)
    top = headline(report)
    assert top["of"] == "int8_static" and top["speedup"] == pytest.approx(1.1905, abs=1e-4)
    summary = report_summary(report)
    assert summary["speedup"] == summary["precision"]["speedup_vs_original"] == top["speedup"]


def test_a_real_accelerator_job_has_no_this_machine_warning_or_cpu_figure():
    import onnx

    model = onnx.load_from_string(positions_model())
    result = FlexDSAOptimizer("rockchip-rk3588").optimize(
        model, OptimizeOptions(latency_repeats=3), cache=LRUCache()
    )
    report = result.report
    assert report["latency"]["measured"]  # kept in report.json, labelled as this CPU's
    assert not any("on this machine" in w for w in report["warnings"])
    summary = result.report_summary()
    assert summary["latency_before_ms"] is None and summary["headline"] == report["headline"]
    assert report["headline"]["source"] in ("roofline estimate", "vendor estimate")
    assert "ORT CPU" not in result.summary() and "Placement     [" in result.summary()


def test_a_vendor_quantised_bucket_ships_the_requested_precision_when_its_binary_is_kept():
    from types import SimpleNamespace

    from flexdsa_core.verify.toolchain import _vendor_verdicts

    def case(accuracy_ok: bool | None, ran: bool = True, explored: str | None = None):
        precision = {"requested": "int8", "shipped": "fp32", "vendor_quantiser": True, "warnings": []}
        entry = {"artifacts": ["model.b_qnn.bin", "model.b.qnn_ctx.onnx"]}
        if accuracy_ok is not None:
            entry["accuracy"] = {"ok": accuracy_ok, "loss": 0.001, "measured_on": "4 held-out samples"}
        toolchain = {"ran": ran, "buckets": {"b": entry}}
        files = {"model.b_qnn.bin": b"x", "model.b.qnn_ctx.onnx": b"y", "model.b.onnx": b"z"}
        run = SimpleNamespace(options=OptimizeOptions(precision="int8", precision_fallback="fp32"))
        vendor = {"buckets": {"b": {"precision": explored}}} if explored else None
        _vendor_verdicts(precision, {"b": run}, toolchain, files, vendor=vendor)
        return precision, files

    precision, files = case(True)
    assert precision["shipped"] == "int8" and "model.b_qnn.bin" in precision["shipped_in"]
    assert "model.b_qnn.bin" in files
    precision, _ = case(None, ran=False)  # the toolchain did not run here: the bundle holds fp32 only
    assert precision["shipped"] == "fp32"
    # Exploration found float16 cheaper than any accurate quantised build: float16 is in the binary.
    assert case(True, explored="float16")[0]["shipped"] == "fp16"
    hybrid, _ = case(True, explored="w8a8 + float16 hybrid")
    assert hybrid["shipped"] == "int8" and hybrid["shipped_format"] == "w8a8 + float16 hybrid"
