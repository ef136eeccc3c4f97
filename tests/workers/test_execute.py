"""``execute_job`` called directly against real PostgreSQL and Redis (not Celery's eager mode)."""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import update

from service.core.db import session_factory_for
from service.core.models import Job
from service.jobs.gates import without_gates
from tests.workers.conftest import create_job, load_job, tiny_model
from workers.execute import execute_job

pytestmark = pytest.mark.services

ARTIFACTS = ["manifest.json", "model.onnx", "report.json"]


def _names(job) -> list[str]:
    return sorted(a.name for a in job.artifacts)


def _set(settings, job_id: str, **values) -> None:
    with session_factory_for(settings)() as session, session.begin():
        session.execute(update(Job).where(Job.id == job_id).values(**values))


def test_job_succeeds_with_artifacts_events_and_published_progress(settings, redis_client):
    job_id = create_job(settings)
    pubsub = redis_client.pubsub()
    pubsub.subscribe(f"flexdsa:job:{job_id}")

    assert execute_job(job_id, settings=settings, worker_id="t1") == "succeeded"

    job = load_job(settings, job_id)
    assert (job.status, job.progress, job.attempts, job.lease_owner) == ("succeeded", 1.0, 1, None)
    assert _names(job) == ARTIFACTS
    summary = without_gates(job.report_summary)  # the gates' figures and verdicts: tests/service/test_gates.py
    comparison = summary.pop("comparison")  # the job's row for a comparison across targets, from its report
    assert summary == {"kernels": 3, "cache_hits": 0}
    assert job.report_summary["requirements"] is None and job.report_summary["previous"] is None
    # The stand-in's report names no target and checks no output: the row says so rather than guessing.
    assert comparison["target"] is None and comparison["accuracy"]["detail"] == "outputs were not checked"
    kinds = [e.kind for e in job.events]
    assert kinds[:2] == ["queued", "started"] and kinds[-1] == "succeeded"
    # One progress event per stage change, not per progress call.
    stages = [e.stage for e in job.events if e.kind == "progress"]
    assert stages == ["ingest", "shapes", "passes", "fusion", "validate", "report"]
    published = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (not published or published[-1].get("status") != "succeeded"):
        message = pubsub.get_message(timeout=0.5)
        if message and message["type"] == "message":
            import json

            published.append(json.loads(message["data"]))
    assert published[-1]["status"] == "succeeded"
    assert {"job_id", "status", "stage", "progress", "message"} <= set(published[0])


def test_redelivery_runs_once_and_keeps_one_set_of_artifacts(settings):
    job_id = create_job(settings)
    results: list[str] = []
    threads = [
        threading.Thread(target=lambda n=n: results.append(execute_job(job_id, settings=settings, worker_id=f"w{n}")))
        for n in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    # Exactly one delivery won the claim; the others saw a live lease (running) or the result.
    assert results.count("succeeded") >= 1
    assert execute_job(job_id, settings=settings, worker_id="late") == "succeeded"
    job = load_job(settings, job_id)
    assert job.attempts == 1
    assert _names(job) == ARTIFACTS
    assert [e.kind for e in job.events].count("started") == 1

    # A delivery after the lease lapsed mid-run (the row says running, owner gone) runs again and
    # replaces the artifact rows rather than adding to them.
    _set(settings, job_id, status="running", lease_owner="dead", lease_expires_at=None)
    assert execute_job(job_id, settings=settings, worker_id="w-again") == "succeeded"
    job = load_job(settings, job_id)
    assert job.attempts == 2 and _names(job) == ARTIFACTS


def test_live_lease_blocks_a_second_worker(settings):
    from datetime import timedelta

    from service.core.models import utcnow

    job_id = create_job(settings)
    _set(settings, job_id, status="running", lease_owner="other", lease_expires_at=utcnow() + timedelta(minutes=5),
         attempts=1)
    assert execute_job(job_id, settings=settings, worker_id="me") == "running"
    job = load_job(settings, job_id)
    assert (job.lease_owner, job.attempts) == ("other", 1)


def test_flexdsa_error_fails_at_once_without_retry(settings):
    job_id = create_job(settings, b"bad bytes")
    assert execute_job(job_id, settings=settings, worker_id="t1") == "failed"
    job = load_job(settings, job_id)
    assert job.error["code"] == "invalid_model"
    assert "protobuf" in job.error["message"]
    assert job.attempts == 1 and job.artifacts == []


def test_exhausted_attempts_fail_with_the_last_reason(settings):
    job_id = create_job(settings, max_attempts=2)
    # Two attempts whose workers died: running, lease lapsed, attempts used up.
    _set(settings, job_id, status="running", lease_owner="gone", lease_expires_at=None, attempts=2, stage="fusion")
    assert execute_job(job_id, settings=settings, worker_id="t1") == "failed"
    job = load_job(settings, job_id)
    assert job.error["message"] == "gave up after 2 attempts: worker lost during stage 'fusion' (lease expired)"


def test_crash_is_retried_then_given_up(settings, monkeypatch):
    monkeypatch.setenv("FLEXDSA_TEST_CHILD_ABORT", "1")
    job_id = create_job(settings, max_attempts=2)
    # First crash: re-queued (and published again) with the reason recorded.
    assert execute_job(job_id, settings=settings, worker_id="t1") == "queued"
    assert execute_job(job_id, settings=settings, worker_id="t1") == "failed"
    job = load_job(settings, job_id)
    assert job.error["code"] == "pipeline_crashed"
    assert job.error["message"].startswith("gave up after 2 attempts: pipeline process crashed (signal 6); incident ")
    assert [e.kind for e in job.events].count("retry") == 1
    incidents = _incidents(settings, job_id)
    assert [i.code for i in incidents] == ["pipeline_crashed", "pipeline_crashed"]  # one per crashed attempt
    assert job.error["details"]["incident"] in {i.id for i in incidents}
    # The crashed attempts' temporary folders were removed by the worker.
    import tempfile
    from pathlib import Path

    assert not list(Path(tempfile.gettempdir()).glob(f"flexdsa-job-{job_id[:8]}-*"))


def test_cancel_while_running_kills_the_pipeline(settings, monkeypatch):
    """Cancelled once the pipeline has reached its second stage: the job stops there, by its events (no later
    stage ran, no artifacts), not by a wall-clock bound. How soon after the request it stops is measured by
    ``python -m bench.mechanics`` (cancel), against the same job run to its end."""
    monkeypatch.setenv("FLEXDSA_TEST_STAGE_DELAY_S", "2.0")  # each stage outlasts the worker's cancel check
    job_id = create_job(settings)
    requested_during = []

    def cancel_at_the_second_stage() -> None:
        deadline = time.monotonic() + 60  # a hang guard: the stage comes within seconds
        while time.monotonic() < deadline:
            stage = load_job(settings, job_id).stage
            if stage == "shapes":
                _set(settings, job_id, cancel_requested=True)
                requested_during.append(stage)
                return
            time.sleep(0.05)

    canceller = threading.Thread(target=cancel_at_the_second_stage)
    canceller.start()
    assert execute_job(job_id, settings=settings, worker_id="t1") == "cancelled"
    canceller.join(10)
    assert requested_during == ["shapes"]
    job = load_job(settings, job_id)
    assert job.artifacts == [] and job.error["code"] == "cancelled"
    stages = [e.stage for e in job.events if e.kind == "progress"]
    assert stages[:2] == ["ingest", "shapes"] and "validate" not in stages and "report" not in stages, stages
    [cancelled] = [e for e in job.events if e.kind == "cancelled"]
    assert cancelled.message in ("stopped during stage 'shapes'", "stopped during stage 'passes'"), cancelled.message
    assert execute_job(job_id, settings=settings, worker_id="t2") == "cancelled"


def test_cancelled_before_start_never_runs(settings):
    job_id = create_job(settings)
    _set(settings, job_id, cancel_requested=True)
    assert execute_job(job_id, settings=settings, worker_id="t1") == "cancelled"
    assert load_job(settings, job_id).attempts == 0


def test_hard_time_limit_fails_the_job(settings, monkeypatch):
    monkeypatch.setenv("FLEXDSA_TEST_STAGE_DELAY_S", "3.0")
    limited = settings.model_copy(update={"job_soft_time_limit_s": 1, "job_hard_time_limit_s": 2})
    job_id = create_job(settings)
    assert execute_job(job_id, settings=limited, worker_id="t1") == "failed"
    job = load_job(settings, job_id)
    assert job.error["message"] == "time limit exceeded" and job.attempts == 1


def test_identical_submission_is_served_from_the_job_cache(settings):
    """The second, identical job reuses the first's work: its artifacts are the first's blobs and no stage of
    the pipeline ran for it (no progress event). How much faster that is lives in ``python -m bench.mechanics``
    (job cache) and, through the whole service, ``python -m bench.service`` (cached resubmission)."""
    first = create_job(settings)
    assert execute_job(first, settings=settings, worker_id="t1") == "succeeded"
    second = create_job(settings)
    assert execute_job(second, settings=settings, worker_id="t1") == "succeeded"

    a, b = load_job(settings, first), load_job(settings, second)
    assert a.cached_from_job_id is None and b.cached_from_job_id == first
    assert {(x.name, x.blob_key) for x in a.artifacts} == {(x.name, x.blob_key) for x in b.artifacts}
    assert b.report_summary == a.report_summary
    assert "progress" in [e.kind for e in a.events]
    kinds = [e.kind for e in b.events]
    assert "cached" in kinds and "progress" not in kinds, kinds  # served, not run again

    # Another tenant's identical upload is not answered from this tenant's job.
    other = create_job(settings, tenant="other")
    assert execute_job(other, settings=settings, worker_id="t1") == "succeeded"
    assert load_job(settings, other).cached_from_job_id is None


def test_a_refresh_job_runs_the_pipeline_although_a_twin_succeeded(settings):
    first = create_job(settings)
    assert execute_job(first, settings=settings, worker_id="t1") == "succeeded"
    refresh = create_job(settings, spec={"target": "cpu-ort", "cache": "refresh"})
    assert load_job(settings, refresh).job_cache_key == load_job(settings, first).job_cache_key
    assert execute_job(refresh, settings=settings, worker_id="t1") == "succeeded"
    job = load_job(settings, refresh)
    assert job.cached_from_job_id is None and "cached" not in [e.kind for e in job.events]
    assert [e.stage for e in job.events if e.kind == "progress"][0] == "ingest"


def test_models_sharing_layers_hit_the_kernel_cache(settings, redis_client):
    from service.cache.stats import read_cache_stats

    first = create_job(settings, tiny_model((0.1, 0.2, 0.3)))
    assert execute_job(first, settings=settings, worker_id="t1") == "succeeded"
    assert load_job(settings, first).report_summary["cache_hits"] == 0
    # A new pipeline process (empty LRU) with two of the three layers in common: hits come from Redis.
    second = create_job(settings, tiny_model((0.1, 0.2, 0.7)))
    assert execute_job(second, settings=settings, worker_id="t1") == "succeeded"
    assert load_job(settings, second).report_summary["cache_hits"] == 2

    stats = read_cache_stats(settings)
    assert (stats["hits"], stats["misses"]) == (2, 4)
    assert stats["hits_by_layer"] == {"redis": 2}
    assert stats["seconds_saved"] > 0
    assert stats["entries"] == 4  # the durable layer holds every kernel

    # With Redis emptied, the durable layer still answers.
    redis_client.flushdb()
    third = create_job(settings, tiny_model((0.3, 0.7)))
    assert execute_job(third, settings=settings, worker_id="t1") == "succeeded"
    assert load_job(settings, third).report_summary["cache_hits"] == 2


def test_database_blips_during_a_run_are_tolerated(settings, monkeypatch):
    from sqlalchemy.exc import OperationalError

    from workers.execute import _JobRun

    monkeypatch.setenv("FLEXDSA_TEST_STAGE_DELAY_S", "0.6")
    real_renew = _JobRun._renew_lease
    calls = {"n": 0}

    def flaky_renew(self):
        calls["n"] += 1
        if calls["n"] == 1:
            raise OperationalError("UPDATE jobs", {}, Exception("connection reset"))
        return real_renew(self)

    monkeypatch.setattr(_JobRun, "_renew_lease", flaky_renew)
    job_id = create_job(settings)
    assert execute_job(job_id, settings=settings, worker_id="t1") == "succeeded"
    assert calls["n"] >= 2


def test_a_worker_cut_off_from_the_database_runs_on_but_never_writes_over_its_successor(settings):
    """A worker that cannot renew its lease (partitioned from the database) keeps its child running: in a
    whole-database outage nobody else can take the job, and its result must not be thrown away. If another
    worker did take the job over meanwhile, the cut-off worker's final write finds the lease gone and
    writes nothing: one run's result, one set of artifacts."""
    from sqlalchemy.engine import make_url

    from tests.relay import Relay

    url = make_url(settings.database_url)
    relay = Relay((url.host or "127.0.0.1", url.port or 5432))
    cut_off = settings.model_copy(
        update={"database_url": url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)}
    )
    job_id = create_job(settings, tiny_model(tuple(0.001 * n for n in range(1, 301))))  # ~6 s of kernels
    results: dict[str, str] = {}
    first = threading.Thread(target=lambda: results.update(t1=execute_job(job_id, settings=cut_off, worker_id="t1")))
    try:
        first.start()
        deadline = time.monotonic() + 60
        while load_job(settings, job_id).stage != "validate":
            assert time.monotonic() < deadline, "the job never reached its last stage"
            time.sleep(0.05)
        relay.cut()
        time.sleep(settings.lease_seconds + 0.5)  # t1's lease lapses; t2 reaches the database and takes over
        results["t2"] = execute_job(job_id, settings=settings, worker_id="t2")
        relay.restore()
        first.join(60)
    finally:
        relay.close()
    assert results == {"t1": "succeeded", "t2": "succeeded"}
    job = load_job(settings, job_id)
    assert (job.status, job.attempts) == ("succeeded", 2)
    assert _names(job) == ARTIFACTS
    assert [e.kind for e in job.events].count("succeeded") == 1


def test_job_succeeds_with_redis_down(settings):
    """Redis only carries live progress and the hot cache layer: without it a job still runs."""
    down = settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    job_id = create_job(settings)
    assert execute_job(job_id, settings=down, worker_id="t1") == "succeeded"
    assert load_job(settings, job_id).report_summary["kernels"] == 3


def test_finished_result_survives_a_database_outage_longer_than_the_old_retries(settings):
    """Issue 12: the database goes away (10 s) while the job finishes; the result is written once it is
    back: succeeded on the first attempt, one set of artifacts, no re-run."""
    from sqlalchemy.engine import make_url

    from tests.relay import Relay

    url = make_url(settings.database_url)
    relay = Relay((url.host or "127.0.0.1", url.port or 5432))
    relayed = settings.model_copy(
        update={"database_url": url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False)}
    )
    # 150 distinct kernels at 20 ms each: the child measures for ~3 s after its last stage is reported.
    job_id = create_job(settings, tiny_model(tuple(0.001 * n for n in range(1, 151))))
    results: list[str] = []
    runner = threading.Thread(
        target=lambda: results.append(execute_job(job_id, settings=relayed, worker_id="outage"))
    )
    try:
        runner.start()
        deadline = time.monotonic() + 60
        while load_job(settings, job_id).stage != "validate":  # read past the relay
            assert time.monotonic() < deadline, "the job never reached its last stage"
            time.sleep(0.05)
        relay.cut()
        time.sleep(10)
        assert runner.is_alive(), "the worker gave up on its result during the outage"
        relay.restore()
        runner.join(60)
    finally:
        relay.close()
    assert results == ["succeeded"]
    job = load_job(settings, job_id)
    assert (job.status, job.attempts) == ("succeeded", 1)
    assert _names(job) == ARTIFACTS
    assert [e.kind for e in job.events].count("started") == 1


def _incidents(settings, job_id: str):
    from sqlalchemy import select

    from service.core.models import Incident

    with session_factory_for(settings)() as session:
        return session.scalars(select(Incident).where(Incident.job_id == job_id).order_by(Incident.attempt)).all()


def test_internal_error_is_an_incident_with_its_traceback_for_operators_only(settings):
    """Issue 9: the user sees a plain sentence and the incident id; the traceback is stored with the job and
    shown to an operator by that id (API with the operator token, and ``flexdsa incidents show``)."""
    import os
    import subprocess
    import sys

    from fastapi.testclient import TestClient
    from pydantic import SecretStr

    from stack import create_app

    job_id = create_job(settings, b"bug: not a model the core can handle")
    assert execute_job(job_id, settings=settings, worker_id="t1") == "failed"
    job = load_job(settings, job_id)
    assert job.error["code"] == "internal_error"
    incident = job.error["details"]["incident"]
    assert f"incident {incident}" in job.error["message"] and "Traceback" not in job.error["message"]
    (row,) = _incidents(settings, job_id)
    assert row.id == incident and "deliberate bug in the stand-in optimizer" in row.traceback

    app = create_app(settings.model_copy(update={"operator_token": SecretStr("op-token"), "embedded_worker": False}))
    with TestClient(app) as client:
        shown = client.get(f"/incidents/{incident}", headers={"Authorization": "Bearer op-token"})
        assert shown.status_code == 200, shown.text
        assert shown.json()["job_id"] == job_id and "RuntimeError" in shown.json()["traceback"]
        listed = client.get("/incidents", headers={"Authorization": "Bearer op-token"}).json()
        assert incident in [i["id"] for i in listed]
        assert client.get(f"/incidents/{incident}").status_code in (401, 404)  # not for tenants
        assert client.get("/incidents/ffffffffffff", headers={"Authorization": "Bearer op-token"}).status_code == 404

    env = dict(os.environ, FLEXDSA_DATABASE_URL=settings.database_url, FLEXDSA_BROKER_URL=settings.broker_url)
    done = subprocess.run(
        [sys.executable, "-m", "flexdsa_core.cli", "incidents", "show", incident],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert job_id in done.stdout and "deliberate bug in the stand-in optimizer" in done.stdout


def test_a_job_over_its_memory_limit_fails_saying_which_limit(settings):
    """Issue 9: the pipeline process has an address-space limit; a job that needs more fails with the
    limit and what to change (not a crash, not an internal error), and the worker goes on."""
    tight = settings.model_copy(update={"job_memory_limit_mb": 256})
    job_id = create_job(settings, tiny_model(tuple(0.001 * n for n in range(1, 40))))
    assert execute_job(job_id, settings=tight, worker_id="t1") == "failed"
    job = load_job(settings, job_id)
    assert job.error["code"] == "memory_limit_exceeded", job.error
    assert "256 MiB" in job.error["message"] and "FLEXDSA_JOB_MEMORY_LIMIT_MB" in job.error["message"]
    other = create_job(settings)
    assert execute_job(other, settings=settings, worker_id="t1") == "succeeded"
