"""The reconciler: publishes again the jobs whose delivery was lost.

Two ways a job falls through the cracks, both repaired from the jobs table (the source of truth):

- **queued, message lost**: the broker restarted without persistence, or ``enqueue`` failed. A job still
  ``queued`` after ``queued_after_s`` is published again, but only while the broker queue is empty: a
  non-empty queue means messages are still flowing, and re-publishing a long backlog would only fill the
  queue with duplicates.
- **running, worker lost**: the worker died (SIGKILL, machine lost) and stopped renewing its lease. A job
  whose lease has lapsed is published again; ``execute_job`` re-claims it, or marks it failed once its
  attempts are used up.

Several reconcilers (one per worker) may run at once. Each candidate is taken with a conditional UPDATE that
bumps ``updated_at``, so one reconciler publishes a given job at most once per interval. Duplicate deliveries
are harmless anyway: ``execute_job`` claims with a lease.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import and_, or_, update

from service.core.db import session_factory_for
from service.core.models import Job, JobEvent, JobStatus, utcnow

log = logging.getLogger(__name__)


def reconcile_once(
    settings,
    publish: Callable[[str], object],
    *,
    queued_after_s: float | None = None,
    broker_backlog: Callable[[], int | None] | None = None,
) -> list[str]:
    """Publish stale jobs once; return their ids. ``broker_backlog`` (messages waiting, None if unknown)
    defaults to the Redis broker's queue length in distributed mode."""
    interval_s = settings.reconcile_interval_s
    if queued_after_s is None:
        queued_after_s = 4 * interval_s
    if broker_backlog is None:
        broker_backlog = _redis_broker_backlog(settings) if settings.mode == "distributed" else lambda: 0
    now = utcnow()
    recently_touched = Job.updated_at >= now - timedelta(seconds=interval_s)
    lapsed_lease = and_(
        Job.status == JobStatus.running.value,
        or_(Job.lease_expires_at.is_(None), Job.lease_expires_at < now),
        ~recently_touched,
    )
    backlog = broker_backlog()
    if backlog == 0 or backlog is None:
        stale_queued = and_(
            Job.status == JobStatus.queued.value, Job.updated_at < now - timedelta(seconds=queued_after_s)
        )
        candidates = or_(lapsed_lease, stale_queued)
    else:
        candidates = lapsed_lease
    sessions = session_factory_for(settings)
    with sessions() as session, session.begin():
        rows = session.execute(
            update(Job).where(candidates).values(updated_at=now).returning(Job.id, Job.status, Job.stage, Job.progress)
            .execution_options(synchronize_session=False)
        ).all()
        job_ids = [row.id for row in rows]
        for row in rows:
            if row.status == JobStatus.running.value:  # the dashboard and the soak see when a lost job went back
                session.add(JobEvent(
                    job_id=row.id, kind="requeued", status=row.status, stage=row.stage, progress=row.progress,
                    message="worker lost (lease expired); published again", at=now,
                ))  # fmt: skip
    for job_id in job_ids:
        log.info("reconciler: publishing job %s again", job_id)
        publish(job_id)
    return job_ids


def _redis_broker_backlog(settings) -> Callable[[], int | None]:
    """Messages waiting in the Redis broker queue (kombu keeps one list per priority step)."""

    def backlog() -> int | None:
        if not (settings.broker_url or "").startswith(("redis://", "rediss://")):
            return None
        import redis

        from service.jobs.task_queue import QUEUE

        try:
            client = redis.Redis.from_url(settings.broker_url, socket_timeout=2, socket_connect_timeout=2)
            try:
                names = [QUEUE] + [f"{QUEUE}\x06\x16{step}" for step in range(1, 10)]
                return sum(client.llen(name) for name in names)
            finally:
                client.close()
        except Exception as err:
            log.warning("reconciler: cannot read the broker queue length (%s)", err)
            return None

    return backlog


class ReconcilerThread:
    """Runs ``reconcile_once`` every ``settings.reconcile_interval_s`` in a daemon thread until stopped."""

    def __init__(self, settings, publish: Callable[[str], object], *,
                 first_queued_after_s: float | None = None) -> None:
        self.settings = settings
        self.publish = publish  # handed in (service.jobs.dispatch.enqueue, or the embedded worker's submit)
        # The first sweep may take every queued job at once (the embedded worker after a restart).
        self._first_queued_after_s = first_queued_after_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="flexdsa-reconciler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        queued_after_s = self._first_queued_after_s
        while True:
            try:
                reconcile_once(self.settings, self.publish, queued_after_s=queued_after_s)
            except Exception as err:  # the database is down: try again next interval
                log.warning("reconciler: sweep failed (%s)", err)
            queued_after_s = None
            if self._stop.wait(self.settings.reconcile_interval_s):
                return
