"""Measured decisions are significant or not taken on timings at all: the paired statistics, and a noisy
clock injected into the cost model that must not change any Fusion Switcher decision on a real model."""

from __future__ import annotations

import random

import onnx_ir as ir
import pytest

from flexdsa_core.cost_model import CostModel
from flexdsa_core.fusion_switcher import FusionSwitcher
from flexdsa_core.fusions import discover_rules
from flexdsa_core.ingest import ingest
from flexdsa_core.kernel_timing import timed
from flexdsa_core.options import OptimizeOptions
from flexdsa_core.passes import generic_passes, run_passes
from flexdsa_core.shape_tracker import ShapeTracker
from flexdsa_core.significance import median_interval_rank, paired, settled_early, straddles, thresholds
from flexdsa_core.targets import load_target
from tests.core.timed_verdicts import VerdictCache, contradictions, same_decisions_expected
from tests.models import fixture


def test_interval_ranks_match_the_binomial_table():
    # The 95% distribution-free interval of a median: ranks from the Binomial(n, 1/2) table.
    assert [median_interval_rank(n) for n in (5, 6, 9, 10, 20, 50)] == [0, 1, 2, 2, 6, 18]


def test_same_timings_under_noise_are_a_tie():
    rng = random.Random(0)
    first = [1e-3 * rng.uniform(0.5, 2.0) for _ in range(30)]
    second = [1e-3 * rng.uniform(0.5, 2.0) for _ in range(30)]
    assert paired(first, second, min_effect=0.1).verdict == "tie"


def test_a_large_effect_survives_noise_and_a_small_one_does_not_count():
    rng = random.Random(1)
    first = [1e-3 * rng.uniform(0.9, 1.1) for _ in range(20)]
    assert paired(first, [2 * f * rng.uniform(0.9, 1.1) for f in first], min_effect=0.1).verdict == "slower"
    assert paired(first, [0.5 * f * rng.uniform(0.9, 1.1) for f in first], min_effect=0.1).verdict == "faster"
    # 5% faster on every round, no noise: real, but under the minimum effect that counts.
    assert paired(first, [0.95 * f for f in first], min_effect=0.1).verdict == "tie"


def test_too_few_rounds_are_always_a_tie():
    assert paired([1.0] * 5, [10.0] * 5, min_effect=0.1).verdict == "tie"


def _switcher_decisions(model: ir.Model, timer, cache: VerdictCache) -> tuple[dict[str, int], list[str]]:
    target = load_target("cpu-ort")
    cost_model = CostModel(target, cache=cache, timer=timer)
    switcher = FusionSwitcher(target, lambda op: True, cost_model)
    plan = switcher.run(model, discover_rules())
    taken = {c["rule"]: c["taken"] for c in plan.to_json()["candidates"] if c["matches"]}
    return taken, sorted(f"{n.domain}::{n.op_type}" for n in model.graph)


@pytest.mark.models
@pytest.mark.parametrize("name", ["bert", "mobilenetv2"])
def test_a_noisy_clock_changes_no_decision(name):
    """Every sample of the injected clock is the kernel's CPU time off by up to 25% either way, and one in
    twenty is 2-5x too long (a preempted run): no comparison contradicts the quiet clock's (an effect at a
    threshold may be significant under one clock and a tie, decided by the rule, under the other), and
    where no verdict differs in what decides, neither does any decision."""
    tracker = ShapeTracker(ingest(str(fixture(name))).model)
    tracker.infer()
    [bucket] = tracker.buckets(None, load_target("cpu-ort"))
    base = tracker.specialize(bucket)
    run_passes(base, generic_passes(OptimizeOptions()))

    rng = random.Random(7)

    def noisy(function) -> float:
        spike = rng.uniform(2.0, 5.0) if rng.random() < 0.05 else 1.0
        return timed(function) * rng.uniform(0.8, 1.25) * spike

    quiet_cache, loud_cache = VerdictCache(), VerdictCache()
    quiet = _switcher_decisions(base.clone(), None, quiet_cache)
    loud = _switcher_decisions(base.clone(), noisy, loud_cache)
    assert quiet_cache.comparisons, "no comparison was timed side by side"
    assert not contradictions(quiet_cache.comparisons, loud_cache.comparisons)
    if same_decisions_expected(quiet_cache.comparisons, loud_cache.comparisons):
        assert loud == quiet


def test_an_early_look_settles_only_the_threshold_the_caller_asks_about():
    """Ratios at 0.88-0.92 straddle 1 - 10%: "faster?" (and both) stay open, "slower?" is plainly no."""
    first = [1e-3] * 9
    second = [1e-3 * (0.88 if i % 2 else 0.92) for i in range(9)]
    assert not settled_early(first, second, min_effect=0.1)
    assert not settled_early(first, second, min_effect=0.1, question="faster")
    assert settled_early(first, second, min_effect=0.1, question="slower")
    comparison = paired(first, second, min_effect=0.1)
    assert straddles(comparison) and straddles(comparison, "faster") and not straddles(comparison, "slower")
    with pytest.raises(ValueError, match="question"):
        thresholds(0.1, "sooner")
