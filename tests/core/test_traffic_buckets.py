"""Buckets from traffic: the exact dynamic programme against brute force, the evenly spaced baseline, the
request's ``observed_shapes`` checked against the model, and an end-to-end run on the BERT fixture."""

from __future__ import annotations

import itertools
import random

import onnx_ir as ir
import pytest
from pydantic import ValidationError

from flexdsa_core.errors import InvalidOptionsError
from flexdsa_core.options import OptimizeOptions
from flexdsa_core.shape_tracker import (
    ShapeTracker,
    choose_traffic_buckets,
    evenly_spaced_buckets,
    optimal_buckets,
)
from flexdsa_core.targets import TargetSpec, load_target
from tests.core.test_shape_tracker import block_model
from tests.models import fixture

CPU = load_target("cpu-ort")
ROOFLINE = TargetSpec(
    name="roofline-npu",
    vendor="test",
    adapter="cpu_ort",
    peak_ops_per_s={"float32": 1e12},
    mem_bandwidth_bytes_per_s=1e10,
)
# Most requests are short, a few are long: the shape of real sequence-length traffic.
SKEWED_SEQ = {8: 400, 10: 300, 12: 250, 16: 150, 20: 80, 24: 40, 32: 20, 48: 8, 64: 3}


def expected_cost(counts: dict[int, int], buckets: list[int], cost) -> float:
    return sum(count * cost(min(b for b in buckets if b >= v)) for v, count in counts.items())


def brute_force(counts: dict[int, int], k: int, cost) -> float:
    values = sorted(counts)
    return min(
        expected_cost(counts, [*rest, values[-1]], cost)
        for size in range(k)
        for rest in itertools.combinations(values[:-1], size)
    )


def random_case(rng: random.Random, *, monotone: bool) -> tuple[dict[int, int], dict[int, float]]:
    values = rng.sample(range(1, 40), rng.randint(1, 8))
    counts = {v: rng.randint(1, 50) for v in values}
    if monotone:
        table = {v: 1.0 + v * rng.uniform(0.5, 2.0) + v * v * rng.uniform(0, 0.1) for v in sorted(values)}
        running = 0.0
        for v in sorted(table):  # make it non-decreasing
            running = table[v] = max(running, table[v])
    else:  # kernels that like some sizes better than smaller ones
        table = {v: rng.uniform(1.0, 10.0) for v in values}
    return counts, table


@pytest.mark.parametrize("monotone", [True, False])
def test_dynamic_programme_matches_brute_force(monotone):
    rng = random.Random(7)
    for _ in range(200):
        counts, table = random_case(rng, monotone=monotone)
        k = rng.randint(1, len(counts) + 1)
        chosen = optimal_buckets(counts, k, table.__getitem__)
        assert len(chosen) <= k
        assert expected_cost(counts, chosen, table.__getitem__) == pytest.approx(
            brute_force(counts, k, table.__getitem__)
        )


def test_largest_value_is_always_a_bucket():
    rng = random.Random(3)
    for _ in range(100):
        counts, table = random_case(rng, monotone=rng.random() < 0.5)
        assert max(counts) in optimal_buckets(counts, rng.randint(1, 5), table.__getitem__)


def test_one_bucket_is_the_largest_value():
    assert optimal_buckets(SKEWED_SEQ, 1, lambda v: v) == [64]
    choice = choose_traffic_buckets([({"seq": v}, c) for v, c in SKEWED_SEQ.items()], 1, lambda d: d["seq"])
    assert choice.chosen == {"seq": [64]}
    assert choice.evenly_spaced["buckets"] == {"seq": [64]}


def test_a_bucket_per_value_wastes_nothing():
    observed = [({"seq": v}, c) for v, c in SKEWED_SEQ.items()]
    choice = choose_traffic_buckets(observed, len(SKEWED_SEQ), lambda d: 1e-4 + 1e-6 * d["seq"] ** 2)
    assert choice.chosen == {"seq": sorted(SKEWED_SEQ)}
    assert choice.padding_waste == 0.0
    # A bucket more than the values helps nothing, and none is added.
    assert choose_traffic_buckets(observed, 16, lambda d: d["seq"]).chosen == {"seq": sorted(SKEWED_SEQ)}


def test_evenly_spaced_buckets_round_up_to_observed_values():
    assert evenly_spaced_buckets(list(SKEWED_SEQ), 3) == [32, 48, 64]  # steps at 26.7, 45.3, 64
    assert evenly_spaced_buckets([1, 2, 3, 4], 2) == [3, 4]  # 2.5 rounds up to 3
    assert evenly_spaced_buckets([5, 100], 4) == [100]  # nothing observed in between


def test_skewed_traffic_wastes_less_than_evenly_spaced():
    observed = [({"seq": v}, c) for v, c in SKEWED_SEQ.items()]
    calls = []

    def cost(dims):
        calls.append(dict(dims))
        return 2e-4 + 1e-6 * dims["seq"] + 1e-8 * dims["seq"] ** 2  # launches + linear + attention

    choice = choose_traffic_buckets(observed, 3, cost, "test")
    assert choice.padding_waste < choice.evenly_spaced["padding_waste"]
    assert choice.expected_cost_s < choice.evenly_spaced["expected_cost_s"]
    assert len(calls) == choice.cost_evaluations == len(SKEWED_SEQ)  # one per distinct value, cached
    assert choice.as_dict()["observed"] == {
        "requests": sum(SKEWED_SEQ.values()),
        "distinct_shapes": len(SKEWED_SEQ),
        "dims": {"seq": {"min": 8, "max": 64, "distinct": len(SKEWED_SEQ)}},
    }


def test_two_varying_dims_share_k():
    observed = [({"batch": b, "seq": s}, (b == 1) * 50 + 1) for b in (1, 4) for s in (16, 32, 64, 128)]
    choice = choose_traffic_buckets(observed, 4, lambda d: d["batch"] * d["seq"])
    sizes = [len(values) for values in choice.chosen.values()]
    assert sizes[0] * sizes[1] <= 4
    assert 4 in choice.chosen["batch"] and 128 in choice.chosen["seq"]
    # The reference (both maxima) plus every other distinct value of each dim.
    assert choice.cost_evaluations == 1 + 1 + 3
    # Cost batch * seq is separable: the estimate is exact, and no worse than evenly spaced.
    assert choice.padding_waste <= choice.evenly_spaced["padding_waste"]


def test_three_varying_dims_stay_within_k_and_repeated_shapes_merge():
    observed = [({"a": a, "b": b, "c": c}, 1) for a in (1, 2, 3) for b in (1, 5) for c in (2, 4, 8)]
    choice = choose_traffic_buckets([*observed, *observed], 4, lambda d: d["a"] * d["b"] * d["c"])
    assert len(choice.chosen["a"]) * len(choice.chosen["b"]) * len(choice.chosen["c"]) <= 4
    assert choice.observed["requests"] == 36 and choice.observed["distinct_shapes"] == 18


# ---- the request's observed_shapes against the model ----------------------------------------------------


def block_tracker() -> ShapeTracker:
    return ShapeTracker(ir.from_proto(block_model()))


def test_tracker_chooses_buckets_from_traffic_and_reports_them():
    tracker = block_tracker()
    observed = [{"dims": {"seq": v}, "count": c} for v, c in SKEWED_SEQ.items()]
    buckets = tracker.buckets(None, ROOFLINE, observed=observed, max_buckets=2)
    report = tracker.infer().as_dict()["from_traffic"]
    assert [b.dims for b in buckets] == [{"seq": v} for v in report["chosen"]["seq"]]
    assert len(buckets) <= 2 and buckets[-1].dims == {"seq": 64}
    assert report["k"] == 2
    assert report["cost_basis"].startswith("estimate: roofline estimate from the roofline-npu spec")
    assert report["padding_waste"] <= report["evenly_spaced"]["padding_waste"]


def test_shape_buckets_win_over_traffic():
    tracker = block_tracker()
    buckets = tracker.buckets({"seq": [32]}, CPU, observed=[{"dims": {"seq": 5}}])
    assert [b.dims for b in buckets] == [{"seq": 32}]
    assert "from_traffic" not in tracker.infer().as_dict()
    assert any("observed_shapes not used" in note for note in tracker.infer().notes)


def test_unknown_dim_names_are_refused():
    with pytest.raises(InvalidOptionsError, match="'sequence'.*not a dynamic dim") as error:
        block_tracker().buckets(None, CPU, observed=[{"dims": {"sequence": 5}, "count": 2}])
    assert error.value.details["dynamic_dims"] == ["batch", "seq"]


def test_entries_must_name_the_same_dims():
    observed = [{"dims": {"seq": 5}}, {"dims": {"seq": 7, "batch": 2}}]
    with pytest.raises(InvalidOptionsError, match="entry 1 names dims"):
        block_tracker().buckets(None, CPU, observed=observed)


def test_too_many_distinct_values_are_refused():
    observed = [{"dims": {"seq": v}} for v in range(1, 100)]
    with pytest.raises(InvalidOptionsError, match="99 distinct values of dim 'seq'"):
        block_tracker().buckets(None, CPU, observed=observed)


@pytest.mark.parametrize(
    "spec",
    [
        {"observed_shapes": [{"dims": {"seq": 0}, "count": 1}]},
        {"observed_shapes": [{"dims": {"seq": 8}, "count": 0}]},
        {"observed_shapes": [{"dims": {}, "count": 1}]},
        {"observed_shapes": [{"dims": {"seq": 8}, "hits": 1}]},
        {"max_buckets": 0},
        {"max_buckets": 17},
    ],
)
def test_options_refuse_malformed_traffic(spec):
    with pytest.raises(ValidationError):
        OptimizeOptions.model_validate(spec)


# ---- end to end ---------------------------------------------------------------------------------------


def test_optimizer_refuses_unknown_dims_before_compiling():
    from flexdsa_core.optimizer import FlexDSAOptimizer

    options = OptimizeOptions(observed_shapes=[{"dims": {"tokens": 8}}], measure_latency=False)
    with pytest.raises(InvalidOptionsError, match="'tokens'"):
        FlexDSAOptimizer("cpu-ort").optimize(fixture("bert"), options)


@pytest.mark.models
def test_bert_buckets_from_skewed_traffic():
    from flexdsa_core.optimizer import FlexDSAOptimizer

    observed = [{"dims": {"seq": v}, "count": c} for v, c in SKEWED_SEQ.items()]
    options = OptimizeOptions(observed_shapes=observed, max_buckets=2, measure_latency=False)
    result = FlexDSAOptimizer("cpu-ort").optimize(fixture("bert"), options)
    traffic = result.report["shapes"]["from_traffic"]
    assert traffic["chosen"]["seq"][-1] == 64 and len(traffic["chosen"]["seq"]) == 2
    assert result.report["shapes"]["buckets"] == [f"seq{v}" for v in traffic["chosen"]["seq"]]
    assert traffic["cost_basis"].startswith("estimate: cost-model FLOPs")
    assert traffic["cost_evaluations"] == len(SKEWED_SEQ)
    assert 0 <= traffic["padding_waste"] < traffic["evenly_spaced"]["padding_waste"]
    assert result.report["validation"]["ok"] is True
    assert len(result.report["validation"]["buckets"]) == 2
