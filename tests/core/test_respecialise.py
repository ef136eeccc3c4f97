"""The re-specialisation proposal: on skewed traffic the planner's buckets cost less per request than one
large bucket and waste less; the three sets are priced by one cost function; a dim with more distinct
values than the planner costs is rounded up, and the note says so."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest

from flexdsa_core.respecialise import propose, rounded
from flexdsa_core.targets import load_target
from tests.models import fixture

TRAFFIC = [
    ({"batch": 1, "seq": s}, n) for s, n in {4: 300, 6: 250, 9: 120, 14: 60, 25: 15, 40: 4, 64: 1}.items()
]


@pytest.fixture(scope="module")
def bert():
    return ir.from_proto(onnx.load(fixture("bert")))


def test_the_proposal_beats_one_large_bucket(bert):
    found = propose(bert, load_target("rockchip-rk3588"), TRAFFIC, [{"dims": {"batch": 1, "seq": 64}}], 3)
    assert found["current"]["buckets"] == {"batch": [1], "seq": [64]}
    # The target's default seq 128 is capped by what the fixture runs (a 64-row position table).
    assert found["default"]["buckets"] == {"batch": [1], "seq": [64]}
    seq = found["proposed"]["buckets"]["seq"]
    assert len(seq) == 3 and seq[-1] == 64
    assert (
        found["gain"]["cost_vs_current"] < 1
        and found["gain"]["cost_vs_default"] <= found["gain"]["cost_vs_current"]
    )
    assert found["proposed"]["padding_waste"] < found["current"]["padding_waste"]
    assert found["requests"] == sum(n for _, n in TRAFFIC) and "roofline" in found["cost_basis"]


def test_shapes_over_every_current_bucket_are_priced_at_their_own_and_noted(bert):
    found = propose(bert, load_target("rockchip-rk3588"), TRAFFIC, [{"dims": {"batch": 1, "seq": 32}}], 2)
    assert found["current"]["unserved_requests"] == 5
    assert any("larger than every current bucket" in note for note in found["notes"])


def test_many_distinct_values_are_rounded_up():
    observed = [({"seq": v}, 1) for v in range(1, 201)]
    fewer, notes = rounded(observed)
    assert len({d["seq"] for d, _ in fewer}) <= 64 and all(
        d["seq"] >= v for (d, _), v in zip(fewer, range(1, 201))
    )
    assert notes == ["seq: 200 distinct values, rounded up to multiples of 4 for the planner"]


SHORT = [({"batch": 1, "seq": s}, n) for s, n in {4: 300, 6: 250, 12: 60, 19: 20, 56: 2}.items()]


def test_a_proposal_keeps_serving_what_the_current_version_serves(bert):
    """Traffic whose longest sequence was 56 on a bundle serving 64: the proposal still reaches 64 (version 1
    served 57-64 and the model takes them), and says so."""
    found = propose(bert, load_target("rockchip-rk3588"), SHORT, [{"dims": {"batch": 1, "seq": 64}}], 3)
    assert found["proposed"]["buckets"]["seq"][-1] == 64
    assert found["coverage"] == {"current": {"batch": 1, "seq": 64}, "proposed": {"batch": 1, "seq": 64},
                                 "narrower": []}  # fmt: skip
    assert any("keep serving up to" in note for note in found["notes"])


def test_a_narrower_proposal_is_made_only_when_asked_and_says_what_is_lost(bert):
    found = propose(
        bert, load_target("rockchip-rk3588"), SHORT, [{"dims": {"batch": 1, "seq": 64}}], 3, allow_narrower=True
    )
    assert found["proposed"]["buckets"]["seq"][-1] == 56
    assert found["coverage"]["narrower"] == ["seq"]
    assert any("seq up to 56, now 64" in note for note in found["notes"])
