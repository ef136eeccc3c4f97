"""Run-time traffic on the API, on PostgreSQL and SQLite: pushes stored per job and summed, tenant-scoped and
bounded; a proposal from the traffic with its expected gain; re-specialisation into the next bundle version
(linked, enqueued), by request or past a waste threshold. The bundles are real (the pipeline compiled them
here; the test plays only the worker's hand-over of the artifacts)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from flexdsa_core import FlexDSAOptimizer, RequestSpec
from flexdsa_runtime import Runtime
from service.core import ratelimit
from service.core.ratelimit import WINDOW_S
from tests.runtime.tiny_models import MASKED, model_bytes

SPEC = {"target": "rockchip-rk3588", "shape_buckets": {"batch": [1], "seq": [64]}, "measure_latency": False}
# A skewed length distribution: most requests short, a few long (what a sentence encoder sees).
LENGTHS = {4: 60, 6: 50, 8: 40, 12: 20, 20: 8, 40: 3, 64: 1}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    request = RequestSpec.model_validate(SPEC)
    result = FlexDSAOptimizer(request.target_spec()).optimize(model_bytes(MASKED), request.options())
    folder = tmp_path_factory.mktemp("bundle")
    result.write(folder)
    return folder


def _finished_job(env, headers, compiled) -> str:
    job_id = env.submit(headers, model_bytes(MASKED), SPEC).json()["job_id"]
    artifacts = {
        p.relative_to(compiled).as_posix(): p.read_bytes() for p in compiled.rglob("*") if p.is_file()
    }
    env.finish(job_id, artifacts=artifacts)
    return job_id


def _served(compiled, lengths=LENGTHS) -> dict:
    """The snapshot a runtime serving ``lengths`` (seq -> requests) on this bundle pushes."""
    rng = np.random.default_rng(0)
    with Runtime.open(compiled) as runtime:
        for seq, count in lengths.items():
            for _ in range(count):
                runtime.run(
                    {
                        "x": rng.standard_normal((1, seq, 4)).astype(np.float32),
                        "attention_mask": np.ones((1, seq), np.int64),
                    }
                )
        return runtime.traffic.snapshot()


def test_pushes_are_stored_per_job_and_summed(env, headers, compiled):
    job_id = _finished_job(env, headers, compiled)
    snapshot = _served(compiled)
    first = env.client.post(f"/jobs/{job_id}/traffic", headers=headers, json=snapshot)
    assert first.status_code == 201, first.text
    assert first.json()["requests"] == sum(LENGTHS.values())
    env.client.post(f"/jobs/{job_id}/traffic", headers=headers, json=snapshot)
    summary = env.client.get(f"/jobs/{job_id}/traffic", headers=headers).json()
    assert summary["requests"] == 2 * sum(LENGTHS.values()) and summary["pushes"] == 2
    assert {(h["value"], h["count"]) for h in summary["histogram"]["seq"]} == {
        (s, 2 * n) for s, n in LENGTHS.items()
    }
    # x [1, s, 4] + mask [1, s] = 5s elements, all padded to 5 * 64
    real = sum(5 * s * n for s, n in LENGTHS.items())
    assert summary["padding_waste"] == pytest.approx((5 * 64 * sum(LENGTHS.values()) - real) / real)
    assert summary["buckets"] == [{"name": "batch1_seq64", "dims": {"batch": 1, "seq": 64}, "requests": 364}]


def test_traffic_is_tenant_scoped(env, headers, compiled):
    job_id = _finished_job(env, headers, compiled)
    other = env.new_key()
    assert (
        env.client.post(f"/jobs/{job_id}/traffic", headers=other, json=_served(compiled, {4: 1})).status_code
        == 404
    )
    assert env.client.get(f"/jobs/{job_id}/traffic", headers=other).status_code == 404
    assert env.client.post(f"/jobs/{job_id}/respecialise", headers=other, json={}).status_code == 404


def test_bad_pushes_are_refused_with_the_reason(env, headers, compiled):
    job_id = _finished_job(env, headers, compiled)
    url = f"/jobs/{job_id}/traffic"
    entry = {"dims": {"batch": 1, "seq": 4}, "bucket": "batch1_seq64", "count": 1}
    big = env.client.post(
        url, headers={**headers, "Content-Type": "application/json"}, content=b" " * (3 * 1024 * 1024)
    )
    assert big.status_code == 413 and big.json()["error"]["code"] == "payload_too_large"
    many = env.client.post(url, headers=headers, json={"entries": [entry] * 4097})
    assert many.status_code == 422 and many.json()["error"]["code"] == "invalid_traffic"
    wrong_dims = env.client.post(url, headers=headers, json={"entries": [{**entry, "dims": {"seq": 4}}]})
    assert (
        wrong_dims.status_code == 422
        and "dynamic dims are ['batch', 'seq']" in wrong_dims.json()["error"]["message"]
    )
    wrong_bucket = env.client.post(
        url, headers=headers, json={"entries": [{**entry, "bucket": "batch1_seq9"}]}
    )
    assert wrong_bucket.status_code == 422 and "another version" in wrong_bucket.json()["error"]["message"]
    garbage = env.client.post(
        url, headers={**headers, "Content-Type": "application/json"}, content=b"{not json"
    )
    assert garbage.status_code == 422
    nul = env.client.post(url, headers=headers, json={"bundle_version": "v\u0000", "entries": [entry]})
    assert nul.status_code == 422 and "control character" in nul.json()["error"]["message"]
    queued = env.submit(headers, model_bytes(MASKED), {**SPEC, "seed": 1}).json()["job_id"]
    early = env.client.post(f"/jobs/{queued}/traffic", headers=headers, json={"entries": [entry]})
    assert early.status_code == 409 and early.json()["error"]["code"] == "job_not_finished"


def test_the_proposal_follows_the_traffic_and_prices_the_gain(env, headers, compiled):
    job_id = _finished_job(env, headers, compiled)
    assert (
        env.client.get(f"/jobs/{job_id}/respecialise", headers=headers).json()["error"]["code"]
        == "no_traffic"
    )
    env.client.post(f"/jobs/{job_id}/traffic", headers=headers, json=_served(compiled))
    found = env.client.get(f"/jobs/{job_id}/respecialise?max_buckets=3", headers=headers).json()
    assert found["current"]["buckets"] == {"batch": [1], "seq": [64]}
    proposed = found["proposed"]["buckets"]["seq"]
    assert (
        len(proposed) == 3 and proposed[-1] == 64 and proposed[0] < 12
    )  # short requests get their own bucket
    assert (
        found["gain"]["cost_vs_current"] < 1
        and found["proposed"]["padding_waste"] < found["current"]["padding_waste"]
    )
    assert found["default"]["buckets"] == {"batch": [1], "seq": [128]}  # rockchip's default single bucket
    assert "estimate" in found["cost_basis"]


def test_respecialise_makes_the_next_version_and_lists_the_lineage(env, headers, compiled):
    job_id = _finished_job(env, headers, compiled)
    env.client.post(f"/jobs/{job_id}/traffic", headers=headers, json=_served(compiled))
    proposal = env.client.get(f"/jobs/{job_id}/respecialise", headers=headers).json()
    response = env.client.post(f"/jobs/{job_id}/respecialise", headers=headers, json={})
    assert response.status_code == 202, response.text
    child = response.json()["job"]
    assert child["parent_job_id"] == job_id and child["bundle_version"] == 2 and child["status"] == "queued"
    assert child["spec"]["shape_buckets"] == proposal["proposed"]["buckets"]
    assert env.enqueued == [job_id, child["id"]]  # the submission, then the new version
    versions = env.client.get(f"/jobs/{child['id']}/versions", headers=headers).json()["versions"]
    assert [v["job"]["id"] for v in versions] == [job_id, child["id"]]
    assert versions[0]["buckets"] == [{"name": "batch1_seq64", "dims": {"batch": 1, "seq": 64}}]
    events = [e.kind for e in env.job(job_id).events]
    assert "respecialised" in events


def test_buckets_that_already_fit_the_traffic_are_not_recompiled(env, headers, compiled):
    job_id = _finished_job(env, headers, compiled)
    env.client.post(f"/jobs/{job_id}/traffic", headers=headers, json=_served(compiled, {64: 5}))
    again = env.client.post(f"/jobs/{job_id}/respecialise", headers=headers, json={})
    assert again.status_code == 409 and again.json()["error"]["code"] == "no_change"
    given = env.client.post(
        f"/jobs/{job_id}/respecialise", headers=headers, json={"shape_buckets": {"seq": [8]}}
    )
    assert given.status_code == 422 and "dynamic dims" in given.json()["error"]["message"]
    zero = env.client.post(
        f"/jobs/{job_id}/respecialise", headers=headers, json={"shape_buckets": {"batch": [1], "seq": [0]}}
    )
    assert zero.status_code == 422 and zero.json()["error"]["code"] == "invalid_options"


def test_past_the_waste_threshold_the_next_version_starts_by_itself_once(env, headers, compiled):
    job_id = _finished_job(env, headers, compiled)
    policy = env.client.put(
        f"/jobs/{job_id}/traffic/policy", headers=headers, json={"auto_respecialise_waste": 0.5}
    )
    assert policy.json() == {"job_id": job_id, "auto_respecialise_waste": 0.5, "max_buckets": None}
    first = env.client.post(f"/jobs/{job_id}/traffic", headers=headers, json=_served(compiled)).json()
    assert first["padding_waste"] > 0.5 and first["auto_respecialised_job_id"]
    second = env.client.post(f"/jobs/{job_id}/traffic", headers=headers, json=_served(compiled)).json()
    assert second["auto_respecialised_job_id"] is None  # one new version per version, not one per push
    child = env.job(first["auto_respecialised_job_id"])
    assert child.parent_job_id == job_id and "automatically" in child.events[0].message


def test_below_the_threshold_nothing_starts(env, headers, compiled):
    job_id = _finished_job(env, headers, compiled)
    env.client.put(f"/jobs/{job_id}/traffic/policy", headers=headers, json={"auto_respecialise_waste": 50})
    pushed = env.client.post(f"/jobs/{job_id}/traffic", headers=headers, json=_served(compiled)).json()
    assert pushed["auto_respecialised_job_id"] is None and env.enqueued == [job_id]


def test_many_pushes_are_folded_and_still_add_up(env, headers, compiled, monkeypatch):
    """A deployment pushing for months must not make every read sum every push: past FOLD_AFTER_PUSHES rows the
    pushes are folded into one, and the totals are the same as summed push by push."""
    import service.traffic.service
    from service.core.models import JobTraffic

    monkeypatch.setattr(service.traffic.service, "FOLD_AFTER_PUSHES", 4)
    job_id = _finished_job(env, headers, compiled)
    snapshot = _served(compiled)
    pushes = 11
    for _ in range(pushes):
        assert env.client.post(f"/jobs/{job_id}/traffic", headers=headers, json=snapshot).status_code == 201
    with env.sessions() as session:
        rows = session.query(JobTraffic).filter_by(job_id=job_id).count()
    assert rows <= 4
    summary = env.client.get(f"/jobs/{job_id}/traffic", headers=headers).json()
    assert summary["pushes"] == pushes
    assert summary["requests"] == pushes * sum(LENGTHS.values())
    assert {(h["value"], h["count"]) for h in summary["histogram"]["seq"]} == {
        (s, pushes * n) for s, n in LENGTHS.items()
    }


def test_shapes_past_the_fold_bound_are_counted_as_dropped(env, headers, compiled, monkeypatch):
    import service.traffic.service

    monkeypatch.setattr(service.traffic.service, "FOLD_AFTER_PUSHES", 1)
    monkeypatch.setattr(service.traffic.service, "MAX_FOLDED_SHAPES", 3)
    job_id = _finished_job(env, headers, compiled)
    for snapshot in (_served(compiled, {4: 5, 6: 4}), _served(compiled, {8: 3, 12: 2, 20: 1})):
        assert env.client.post(f"/jobs/{job_id}/traffic", headers=headers, json=snapshot).status_code == 201
    summary = env.client.get(f"/jobs/{job_id}/traffic", headers=headers).json()
    assert summary["requests"] == 15 and summary["dropped"] == 3  # 12 and 20, the least requested
    assert sorted(s["dims"]["seq"] for s in summary["shapes"]) == [4, 6, 8]


def test_traffic_pushes_and_proposals_are_rate_limited_per_tenant(env, headers, compiled, monkeypatch):
    limits = env.app.state.rate_limiter.per_minute
    monkeypatch.setitem(limits, "traffic", 2)
    monkeypatch.setitem(limits, "proposal", 1)
    # The windows are the clock's minutes: a minute turning between the pushes let the third through in CI.
    # The limiter's clock is held at one instant of a window, so every request below counts in it.
    frozen = (time.time() // WINDOW_S) * WINDOW_S + WINDOW_S / 2
    monkeypatch.setattr(ratelimit, "time", SimpleNamespace(time=lambda: frozen))
    job_id = _finished_job(env, headers, compiled)
    snapshot = _served(compiled, {4: 1})
    answers = [env.client.post(f"/jobs/{job_id}/traffic", headers=headers, json=snapshot) for _ in range(3)]
    assert [a.status_code for a in answers[:2]] == [201, 201]
    refused = answers[2]
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert refused.json()["error"]["details"]["action"] == "traffic"
    assert "FLEXDSA_TRAFFIC_RATE_PER_MINUTE" in refused.json()["error"]["message"]
    env.client.get(f"/jobs/{job_id}/respecialise", headers=headers)
    again = env.client.get(f"/jobs/{job_id}/respecialise", headers=headers)
    assert again.status_code == 429 and again.json()["error"]["details"]["action"] == "proposal"
    # Another tenant has its own count.
    other = env.new_key()
    other_job = _finished_job(env, other, compiled)
    assert env.client.post(f"/jobs/{other_job}/traffic", headers=other, json=snapshot).status_code == 201


def test_an_automatic_re_specialisation_is_tried_at_most_once_per_interval(env, headers, compiled, monkeypatch):
    """Each push past the threshold used to load the model for a proposal; now a job tries at most once per
    AUTO_INTERVAL_S, however often its deployment pushes."""
    import service.traffic.service

    loads = []
    real = service.traffic.service._propose
    monkeypatch.setattr(service.traffic.service, "_propose", lambda *a, **k: loads.append(1) or real(*a, **k))
    job_id = _finished_job(env, headers, compiled)
    policy = {"auto_respecialise_waste": 0.0001, "max_buckets": 1}
    assert env.client.put(f"/jobs/{job_id}/traffic/policy", headers=headers, json=policy).status_code == 200
    # Waste past the threshold, and one bucket allowed: the proposal is the bundle's own (no change, no child).
    snapshot = _served(compiled, {64: 60, 63: 60})
    for _ in range(5):
        assert env.client.post(f"/jobs/{job_id}/traffic", headers=headers, json=snapshot).status_code == 201
    assert len(loads) == 1 and env.enqueued == [job_id]  # tried once; no new version


def test_a_new_version_never_serves_less_unless_asked(env, headers, compiled):
    """Traffic whose longest sequence was 20 on a bundle serving 64: the proposal keeps 64 as its largest
    bucket, given buckets that stop short are refused naming what would be lost, and allow_narrower lets it."""
    job_id = _finished_job(env, headers, compiled)
    env.client.post(f"/jobs/{job_id}/traffic", headers=headers, json=_served(compiled, {4: 60, 6: 40, 20: 5}))
    proposal = env.client.get(f"/jobs/{job_id}/respecialise", headers=headers).json()
    assert proposal["proposed"]["buckets"]["seq"][-1] == 64 and proposal["coverage"]["narrower"] == []
    narrower = env.client.get(f"/jobs/{job_id}/respecialise", headers=headers, params={"allow_narrower": True}).json()
    assert narrower["proposed"]["buckets"]["seq"][-1] == 20 and narrower["coverage"]["narrower"] == ["seq"]
    given = {"shape_buckets": {"batch": [1], "seq": [8, 20]}}
    refused = env.client.post(f"/jobs/{job_id}/respecialise", headers=headers, json=given)
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "narrower_buckets"
    assert "seq 21-64 would be refused" in refused.json()["error"]["message"]
    accepted = env.client.post(f"/jobs/{job_id}/respecialise", headers=headers, json={**given, "allow_narrower": True})
    assert accepted.status_code == 202, accepted.text
