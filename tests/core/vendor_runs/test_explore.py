"""Exploration scored by the vendor's own estimate (``vendor_runs/explore``): the vendor alone beside every
bucket, forms decided per site by the vendor's per-layer cycles, never worse than the vendor alone, and a vendor
crash on a form of ours ending in a shipped fallback with its reason.

The decision rules are tested on given figures; what rknn-toolkit2 says is tested with it installed."""

import json

import numpy as np
import onnx
import pytest

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.cache import LRUCache
from flexdsa_core.targets.rockchip import ADAPTER
from flexdsa_core.targets.vendor_cost import VendorCost
from flexdsa_core.vendor_runs.explore import (
    ALONE,
    CONFIRMATIONS,
    CONFIRMED_SAMPLES,
    PLAIN,
    Candidate,
    _cheapest_accurate_alone,
    _confirm,
    _decide,
    _shortfall,
    traffic_figures,
)
from tests.core.targets import _bundle_checks as checks
from tests.core.targets.test_rockchip import LOG, _driver
from tests.models import fixture


def _cost(cycles, cpu=0):
    return VendorCost(cycles=cycles, cpu_nodes=cpu, transitions=0, source="test")


def _candidate(name, cycles=None, cpu=0, error=None, forms=None):
    return Candidate(
        "b", name, None, forms=forms or {}, cost=_cost(cycles, cpu) if cycles else None, error=error
    )


# ---- the decision -----------------------------------------------------------------------------------


def test_the_cheapest_form_of_ours_ships_when_at_least_as_good_as_the_vendor_alone():
    alone = _candidate(ALONE, 100)
    forms = _candidate("s2d", 60, forms={"f": {"a": "block2"}})
    best, reason = _decide([alone, _candidate(PLAIN, 100), forms], alone)
    assert best is forms and "0.600x the vendor alone's 100" in reason


def test_ties_go_to_the_plainer_form():
    alone = _candidate(ALONE, 100)
    plain = _candidate(PLAIN, 100)
    best, _ = _decide([alone, plain, _candidate("s2d", 100, forms={"f": {"a": "block2"}})], alone)
    assert best is plain


def test_never_worse_than_the_vendor_alone_in_cycles_or_cpu_layers():
    alone = _candidate(ALONE, 100, cpu=2)
    best, reason = _decide([alone, _candidate(PLAIN, 120, cpu=2)], alone)
    assert best is alone and "above the original alone" in reason
    best, reason = _decide([alone, _candidate(PLAIN, 90, cpu=3)], alone)
    assert best is alone and "3 CPU layer(s)" in reason


def test_a_vendor_crash_on_every_form_of_ours_ships_the_original_with_the_reason():
    alone = _candidate(ALONE, 100)
    best, reason = _decide([alone, _candidate(PLAIN, error="ValueError: read-only")], alone)
    assert best is alone
    assert reason.startswith("the vendor built none of our forms (ours: ValueError: read-only)")


def test_a_refused_form_is_named_beside_the_one_that_ships():
    alone = _candidate(ALONE, 100)
    best, reason = _decide([alone, _candidate(PLAIN, 100), _candidate("s2d", error="crash")], alone)
    assert best.name == PLAIN and "the vendor refused s2d (crash)" in reason


def test_rknn_cost_is_its_layer_table():
    driver = _driver()
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
         onnx.helper.make_node("Relu", ["c"], ["r"], name="relu"),
         onnx.helper.make_node("Erf", ["r"], ["e"], name="erf"),
         onnx.helper.make_node("Gemm", ["e", "v"], ["y"], name="fc")],
        "g", [], [],
    )  # fmt: skip
    layers, _ = driver.place_nodes(graph, driver.parse_layer_table(LOG), driver.parse_lineage(LOG))
    cost = ADAPTER.vendor_cost({"layers": layers}, {"rknn-toolkit2": "2.5.0"})
    assert cost.cycles == 576 + 64  # Total cycles, the In/OutputOperator rows left out
    assert cost.cpu_nodes == 2 and cost.cpu_layers == ("Erf erf", "Reshape out_rs")
    assert cost.transitions == 3  # NPU -> CPU -> NPU -> CPU in the table's order
    assert cost.site_cycles({"conv"}) == 576 and cost.site_cycles({"fc"}) == 64
    assert cost.source.startswith("rknn-toolkit2 2.5.0 estimate")


# ---- with rknn-toolkit2 installed --------------------------------------------------------------------


def _toolchain_or_skip():
    return checks.toolchain_or_skip("rockchip", "rknn-toolkit2")


def _optimize(model, cache=None, **options):
    return FlexDSAOptimizer("rockchip-rk3588", toolchain_root=checks.TOOLCHAIN_ROOT).optimize(
        model, OptimizeOptions(**{"measure_latency": False, **options}), cache=cache
    )


def test_exploration_ships_a_form_the_vendor_scores_cheaper_and_says_why():
    """The ResNet fixture's 7x7 stride-2 stem over 3 channels: rknn-toolkit2 charges every kernel position
    (its layer table), so the space-to-depth form of that one conv costs fewer cycles; the same form on the
    body's strided convs costs more, so the choice is per site."""
    _toolchain_or_skip()
    result = _optimize(fixture("resnet"), shape_buckets={"batch": [1]})
    [(bucket, row)] = result.report["vendor"]["buckets"].items()
    assert row["shipped"] == "ours + forms"
    assert row["forms"] == {"strided_conv_space_to_depth": {"node_Conv_0": "block2"}}
    assert row["ratio"] < 0.9
    assert row["ours"]["cpu_nodes"] <= row["vendor_alone"]["cpu_nodes"]
    assert row["vendor_alone"]["source"].startswith("rknn-toolkit2 2.5.0 estimate")
    plan = json.loads(result.artifacts["fusion_plan.json"])[bucket]["vendor_exploration"]
    chosen = next(c for c in plan["candidates"] if c["candidate"] == plan["chosen"])
    assert plan["chosen"] != PLAIN and chosen["vendor"]["cycles"] == row["ours"]["cycles"]
    plain = next(c for c in plan["candidates"] if c["candidate"] == PLAIN)
    assert chosen["vendor"]["cycles"] < plain["vendor"]["cycles"]
    assert plan["scored_by"].startswith("rknn-toolkit2 2.5.0 estimate")
    # The shipped model is the rewritten one, validated against the original and checked in the simulator.
    assert result.report["validation"]["ok"] and result.report["validation"]["buckets"][0]["bucket"] == bucket
    assert "node_Conv_0/space_to_depth" in {n.name for n in result.buckets[0].model.graph}
    entry = result.report["toolchain"]["buckets"][bucket]
    assert f"model.{bucket}.rknn" in result.artifacts
    assert min(o["cosine"] for o in entry["numerics"]) >= 0.9999


def test_a_second_job_reads_the_vendor_figures_from_the_kernel_cache():
    _toolchain_or_skip()
    cache = LRUCache()
    first = _optimize(fixture("resnet"), shape_buckets={"batch": [1]}, cache=cache)
    second = _optimize(fixture("resnet"), shape_buckets={"batch": [1]}, cache=cache)
    assert first.report["vendor"]["compiles"] >= 3 and first.report["vendor"]["cache_hits"] == 0
    assert second.report["vendor"]["compiles"] == 0
    assert second.report["vendor"]["cache_hits"] == first.report["vendor"]["compiles"]
    assert second.report["vendor"]["buckets"] == first.report["vendor"]["buckets"]


def _tf_style_pad_conv() -> bytes:
    """Pad -> Conv with the pads computed (a Concat, as tf2onnx writes them): rknn-toolkit2 builds it, but once
    our folding makes the pads a constant its own pad-into-conv fusion crashes ("assignment destination is
    read-only")."""
    helper, tensor = onnx.helper, onnx.numpy_helper
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Concat", ["p1", "p2"], ["pads"], axis=0, name="pads"),
        helper.make_node("Pad", ["x", "pads"], ["xp"], name="pad"),
        helper.make_node("Conv", ["xp", "w"], ["c"], name="conv", kernel_shape=[3, 3]),
        helper.make_node("Relu", ["c"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 8, 32, 32])],
        [tensor.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w"),
         tensor.from_array(np.array([0, 0, 1, 1], np.int64), "p1"),
         tensor.from_array(np.array([0, 0, 1, 1], np.int64), "p2")],
    )  # fmt: skip
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8
    ).SerializeToString()


def test_a_form_that_crashes_the_vendor_ends_in_the_original_shipped_with_the_reason():
    _toolchain_or_skip()
    # Neither our pad_conv fusion nor the rk3588 legalisation folds the Pad: rknn's own pad fusion crashes.
    result = _optimize(_tf_style_pad_conv(), disabled_rules=["pad_into_conv", "pad_conv"])
    [(bucket, row)] = result.report["vendor"]["buckets"].items()
    assert row["shipped"] == "original"
    assert "the vendor built none of our forms" in row["decision"]
    assert "assignment destination is read-only" in row["decision"]
    # Compiled and checked all the same: the original, as the vendor alone builds it.
    assert f"model.{bucket}.rknn" in result.artifacts
    assert result.report["toolchain"]["ran"] and row["ratio"] == 1.0
    shipped = onnx.load_from_string(result.artifact_bytes(f"model.{bucket}.onnx"))
    assert [n.op_type for n in shipped.graph.node] == ["Concat", "Pad", "Conv", "Relu"]


@pytest.mark.parametrize(
    ("disabled", "folded_by"),
    [([], "pad_conv"), (["pad_conv"], "pad_into_conv")],
    ids=["fusion", "legalisation"],
)
def test_pad_into_conv_keeps_the_vendor_building_our_form(disabled, folded_by):
    """The pad_conv fusion folds the Pad on every target; with it switched off, the rk3588 legalisation
    still does, so rknn's own pad fusion never sees one."""
    _toolchain_or_skip()
    result = _optimize(_tf_style_pad_conv(), disabled_rules=disabled)
    [(bucket, row)] = result.report["vendor"]["buckets"].items()
    assert row["shipped"] == "ours" and row["ratio"] == 1.0
    assert folded_by in result.report["rewrites_applied"]
    shipped = onnx.load_from_string(result.artifact_bytes(f"model.{bucket}.onnx"))
    assert [n.op_type for n in shipped.graph.node] == ["Conv", "Relu"]


def test_placement_only_vendors_decide_by_cpu_nodes():
    def placed(name, cpu):
        return Candidate("b", name, None, cost=VendorCost(None, cpu, None, "test", layers=10))

    alone = placed(ALONE, 0)
    best, reason = _decide([alone, placed(PLAIN, 0)], alone)
    assert best.name == PLAIN and "no cost to compare beyond placement" in reason
    best, reason = _decide([alone, placed(PLAIN, 2)], alone)
    assert best is alone and "2 node(s) of ours on the CPU" in reason


def test_qualcomm_vendor_alone_is_all_htp_where_ours_is():
    """QNN beside every job: the original, prepared as QNN's documentation asks (input dims fixed,
    qnn_preprocess_model), placed by QNN; ours leaves no more nodes on the CPU."""
    checks.toolchain_or_skip("qualcomm", "onnxruntime-qnn")
    result = FlexDSAOptimizer("qualcomm-sm8650", toolchain_root=checks.TOOLCHAIN_ROOT).optimize(
        fixture("bert"), OptimizeOptions(shape_buckets={"batch": [1], "seq": [16]}, measure_latency=False)
    )
    vendor = result.report["vendor"]
    [(bucket, row)] = vendor["buckets"].items()
    assert vendor["tool"].startswith("onnxruntime-qnn ")
    assert row["vendor_alone"]["cpu_nodes"] == 0 and row["vendor_alone"]["layers"] > 0
    assert row["ours"]["cpu_nodes"] == 0 and row["shipped"] == "ours" and row["ratio"] is None
    assert "placement" in row["ours"]["source"] and "no cost figure" in row["ours"]["source"]
    assert "only its placement" in vendor["energy"]["detail"]


def test_traffic_is_priced_per_request_by_the_bucket_that_serves_it():
    """Each observed shape is served by the smallest bucket that fits it (the manifest's policy), weighted by
    its count, against the vendor alone compiled once at the largest observed shape."""
    traffic = {
        "observed": [{"dims": {"seq": 8}, "count": 6}, {"dims": {"seq": 20}, "count": 3}, {"dims": {"seq": 64}, "count": 1}],
        "bucket_dims": {"s16": {"seq": 16, "batch": 1}, "s32": {"seq": 32, "batch": 1}, "s64": {"seq": 64, "batch": 1}},
        "vendor_alone": {"cycles": 640.0}, "largest_observed": {"seq": 64},
    }  # fmt: skip
    figures = traffic_figures(traffic, {"s16": 160.0, "s32": 320.0, "s64": 640.0})
    assert figures["served_by_bucket"] == {"s16": 6, "s32": 3, "s64": 1}
    assert figures["expected_cycles_per_request"] == (6 * 160 + 3 * 320 + 640) / 10
    assert figures["ratio"] == figures["expected_cycles_per_request"] / 640
    # A bucket the vendor did not build serves nothing; what fits no bucket is counted, not hidden.
    figures = traffic_figures(traffic, {"s16": None, "s32": 320.0, "s64": None})
    assert figures["served_by_bucket"] == {"s32": 9} and figures["unserved"] == 1

# ---- the precision that ships is confirmed on more held-out samples ------------------------------------


class _Simulator:
    """A vendor whose every candidate is accurate on the search's few samples and, judged on more, only those
    named in ``holds``; it records each run's candidates and sample count."""

    def __init__(self, holds):
        self.holds, self.runs = set(holds), []

    def simulate(self, candidates, sources, shapes, datasets, judged, references, accuracy):
        self.runs.append(
            [
                (c.bucket, c.name, len(judged[c.bucket]), c.options.get("accuracy_analysis"))
                for c in candidates
            ]
        )
        for c in candidates:
            ok = c.name in self.holds
            assert len(references[c.bucket]) == len(judged[c.bucket])
            c.accuracy = {"ok": ok, "samples": len(judged[c.bucket]),
                          "outputs": {"y": {"cosine": 0.999 if ok else 0.981}}}  # fmt: skip


def _identity() -> bytes:
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    return onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=9
    ).SerializeToString()


def _ranked(bucket, *names):
    return [Candidate(bucket, name, None, cost=_cost(100 + 10 * i), options={"accuracy_analysis": True})
            for i, name in enumerate(names)]  # fmt: skip


def _samples(n):
    return [{"x": np.full((1, 4), i, np.float32)} for i in range(n)]


def _confirmed(ranked, simulator, held=40, judged=8):
    held_out = {b: _samples(held) for b in ranked}
    return _confirm(simulator, ranked, {}, {}, {}, held_out, {b: held_out[b][:judged] for b in ranked},
                    _identity(), None)  # fmt: skip


def test_the_cheapest_candidate_that_holds_on_more_samples_ships_and_the_misses_are_named():
    simulator = _Simulator(holds={"c"})
    found = _confirmed({"b": _ranked("b", "a", "b", "c", "d")}, simulator)
    best, missed = found["b"]
    assert best.name == "c" and [m.name for m in missed] == ["a", "b"]
    # Cheapest first, one at a time, judged on CONFIRMED_SAMPLES of the 40 held out, without the per-layer analysis.
    assert simulator.runs == [[("b", name, CONFIRMED_SAMPLES, False)] for name in ("a", "b", "c")]
    assert best.confirmation["ok"] and missed[0].confirmation["samples"] == CONFIRMED_SAMPLES
    assert _shortfall(missed[0].confirmation) == f"cosine 0.9810 on {CONFIRMED_SAMPLES} samples"


def test_at_most_a_few_candidates_are_confirmed_before_settling_for_float16():
    simulator = _Simulator(holds={"d"})
    best, missed = _confirmed({"b": _ranked("b", "a", "b", "c", "d")}, simulator)["b"]
    assert best is None and len(missed) == CONFIRMATIONS == len(simulator.runs)


def test_with_no_more_samples_held_out_than_the_search_judged_its_pick_stands():
    simulator = _Simulator(holds=set())
    best, missed = _confirmed({"b": _ranked("b", "a", "b")}, simulator, held=8)["b"]
    assert best.name == "a" and not missed and best.confirmation is None and simulator.runs == []


def test_buckets_are_confirmed_together_one_candidate_each_per_run():
    simulator = _Simulator(holds={"b2"})
    found = _confirmed({"one": _ranked("one", "a1"), "two": _ranked("two", "a2", "b2")}, simulator)
    assert found["one"][0] is None and found["two"][0].name == "b2"
    assert [sorted(c[0] for c in run) for run in simulator.runs] == [["one", "two"], ["two"]]


def test_the_vendor_alones_accurate_int8_is_judged_on_the_same_samples_as_ours_in_the_first_run():
    """The ratio is to the vendor alone's best accurate build: its int8, accurate on the search's samples, is
    confirmed on the same wider ones as ours (here it misses there), even where none of ours is accurate."""
    simulator = _Simulator(holds={"b"})
    alone = _ranked("b", f"{ALONE}: w8a8")[0]
    held_out = {"b": _samples(40), "c": _samples(40)}
    judged = {name: samples[:8] for name, samples in held_out.items()}
    found = _confirm(simulator, {"b": _ranked("b", "a", "b"), "c": []}, {}, {}, {}, held_out, judged, _identity(),
                     None, alongside={"b": alone, "c": _ranked("c", f"{ALONE}: w8a8")[0]})  # fmt: skip
    assert found["b"][0].name == "b" and not alone.confirmation["ok"]
    first, second = simulator.runs
    assert sorted((c[0], c[1]) for c in first) == [("b", "a"), ("b", f"{ALONE}: w8a8"), ("c", f"{ALONE}: w8a8")]
    assert second == [("b", "b", CONFIRMED_SAMPLES, False)]
    row = {"vendor_alone": {"cycles": 200.0, "cpu_nodes": 0, "transitions": 0, "source": "test"},
           "vendor_alone_int8": {"cycles": 100.0, "cpu_nodes": 0, "transitions": 0, "source": "test",
                                 "accuracy": {"ok": True}, "confirmation": alone.confirmation}}  # fmt: skip
    assert _cheapest_accurate_alone(row).cycles == 200.0  # its int8 missed on the wider samples: float16 is its best
