"""End to end through real Celery worker processes (``celery -A workers.app worker``), real PostgreSQL and a
dedicated Redis database: delivery, worker loss, crashing pipelines, cancellation, lost messages."""

from __future__ import annotations

from datetime import timedelta

import psutil
import pytest
from sqlalchemy import update

from service.core.db import session_factory_for
from service.core.models import Job, utcnow
from service.jobs.dispatch import enqueue
from service.jobs.task_queue import PRIORITY_STEPS, QUEUE
from tests.workers.conftest import create_job, load_job, tiny_model, wait_for, wait_status

pytestmark = pytest.mark.services

ARTIFACTS = ["manifest.json", "model.onnx", "report.json"]


def _pipeline_pids(worker) -> list[int]:
    """The worker's pipeline processes, oldest first: the running job's, then the warm spare."""
    try:
        children = [p for p in psutil.Process(worker.process.pid).children(recursive=True)
                    if any(m in " ".join(p.cmdline()) for m in ("workers.child", "workers.hooked_child"))]
        return [p.pid for p in sorted(children, key=lambda p: p.create_time())]
    except psutil.NoSuchProcess:
        return []


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _queue_lists() -> list[str]:
    """The broker's lists for the flexdsa queue: kombu keeps one per priority step (step 0 is the bare name)."""
    return [QUEUE if step == 0 else f"{QUEUE}\x06\x16{step}" for step in PRIORITY_STEPS]


def _queue_drained(redis_client) -> bool:
    return sum(redis_client.llen(name) for name in _queue_lists()) == 0 and redis_client.hlen("unacked") == 0


def test_submitted_job_succeeds_once(settings, start_worker, redis_client):
    start_worker("w1")
    job_id = create_job(settings)
    assert enqueue(job_id, settings) is True
    job = wait_status(settings, job_id, {"succeeded", "failed"}, 60)
    assert job.status == "succeeded", job.error
    assert sorted(a.name for a in job.artifacts) == ARTIFACTS
    assert job.attempts == 1
    # A duplicate message (re-delivery) is a no-op: still one run, one set of artifacts.
    enqueue(job_id, settings)
    wait_for(lambda: _queue_drained(redis_client), 30, "the duplicate to be consumed")
    job = load_job(settings, job_id)
    assert job.attempts == 1 and sorted(a.name for a in job.artifacts) == ARTIFACTS


def test_worker_killed_mid_job_is_taken_over_after_the_lease(settings, start_worker, redis_client):
    first = start_worker("w1", FLEXDSA_TEST_STAGE_DELAY_S="1.5")
    job_id = create_job(settings)
    enqueue(job_id, settings)
    wait_for(lambda: (j := load_job(settings, job_id)).status == "running" and j.stage in {"passes", "fusion"},
             45, "the job to be running on w1")
    pipeline = wait_for(lambda: _pipeline_pids(first), 10, "w1's pipeline process")
    first.kill()  # SIGKILL to the whole worker: main process, pool process and pipeline
    wait_for(lambda: all(_gone(pid) for pid in pipeline), 10, "the orphaned pipeline (and spare) to die")
    owner = load_job(settings, job_id).lease_owner

    start_worker("w2", FLEXDSA_TEST_STAGE_DELAY_S="0.2")
    job = wait_status(settings, job_id, {"succeeded", "failed"}, 60)
    assert job.status == "succeeded", job.error
    assert job.attempts == 2
    started = [e.message for e in job.events if e.kind == "started"]
    assert len(started) == 2 and owner in started[0] and owner not in started[1]
    assert [e.kind for e in job.events].count("succeeded") == 1
    assert sorted(a.name for a in job.artifacts) == ARTIFACTS


def test_requeued_job_runs_before_jobs_queued_earlier(settings, start_worker, redis_client):
    # A is running on w1 when w1 dies; B1..B6 are queued after A but before A's lease lapses. The reconciler
    # of w2 publishes A again: A must run next (after at most the job w2 already holds), not after all of B.
    first = start_worker("w1", FLEXDSA_TEST_STAGE_DELAY_S="1.5")
    requeued = create_job(settings)
    enqueue(requeued, settings)
    wait_for(lambda: load_job(settings, requeued).status == "running", 45, "the job to be running on w1")
    first.kill()
    queued_earlier = [create_job(settings, tiny_model((0.1, 0.2, 0.01 * (index + 1)))) for index in range(6)]
    for job_id in queued_earlier:
        enqueue(job_id, settings)
    assert redis_client.llen(_queue_lists()[2]) == 6  # new jobs wait at NEW_JOB_PRIORITY

    start_worker("w2", FLEXDSA_TEST_STAGE_DELAY_S="0.3")
    job = wait_status(settings, requeued, {"succeeded", "failed"}, 90)
    assert job.status == "succeeded", job.error
    assert job.attempts == 2
    requeued_at = next(e.at for e in job.events if e.kind == "requeued")
    restarted_at = [e.at for e in job.events if e.kind == "started"][1]
    others = [wait_status(settings, job_id, {"succeeded", "failed"}, 120) for job_id in queued_earlier]
    assert all(other.status == "succeeded" for other in others), [other.error for other in others]
    started = {other.id: next(e.at for e in other.events if e.kind == "started") for other in others}
    between = [job_id for job_id, at in started.items() if requeued_at < at < restarted_at]
    after = [job_id for job_id, at in started.items() if at > restarted_at]
    # First in, first out would have run all six before A; with A's priority at most one slips in between
    # (the one w2 had already taken when A was published), and those still queued wait for A.
    assert len(between) <= 1, (between, started, requeued_at, restarted_at)
    assert len(after) >= 3, (after, started, requeued_at, restarted_at)
    # Nothing left waiting (w1's own unacknowledged delivery stays in 'unacked' until the visibility timeout).
    assert sum(redis_client.llen(name) for name in _queue_lists()) == 0


def test_crashing_pipeline_fails_after_max_attempts_and_the_queue_drains(settings, start_worker, redis_client):
    worker = start_worker("w1", FLEXDSA_TEST_CHILD_ABORT="1")
    job_id = create_job(settings)
    enqueue(job_id, settings)
    job = wait_status(settings, job_id, {"succeeded", "failed"}, 90)
    assert job.status == "failed"
    assert job.error["message"].startswith("gave up after 3 attempts: pipeline process crashed (signal 6); incident ")
    assert job.attempts == 3
    assert [e.kind for e in job.events].count("retry") == 2
    assert worker.alive(), "a crashing pipeline must not take the worker down"
    wait_for(lambda: _queue_drained(redis_client), 30, "the queue to drain")


def test_cancel_stops_a_running_job(settings, start_worker):
    worker = start_worker("w1", FLEXDSA_TEST_STAGE_DELAY_S="3")
    job_id = create_job(settings)
    enqueue(job_id, settings)
    wait_for(lambda: load_job(settings, job_id).stage is not None, 45, "the job to start")
    running = _pipeline_pids(worker)[0]
    with session_factory_for(settings)() as session, session.begin():
        session.execute(update(Job).where(Job.id == job_id).values(cancel_requested=True))
    job = wait_status(settings, job_id, {"cancelled", "succeeded", "failed"}, 15)
    assert job.status == "cancelled" and job.artifacts == []
    wait_for(lambda: _gone(running), 10, "the pipeline process to be killed")


def test_job_whose_message_was_lost_is_republished(settings, start_worker):
    # Committed but never published (the broker was down at submit time, or restarted empty).
    job_id = create_job(settings)
    with session_factory_for(settings)() as session, session.begin():
        session.execute(update(Job).where(Job.id == job_id).values(updated_at=utcnow() - timedelta(minutes=5)))
    start_worker("w1")
    job = wait_status(settings, job_id, {"succeeded", "failed"}, 60)
    assert job.status == "succeeded" and job.attempts == 1
