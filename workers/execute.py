"""Run one job, idempotently: ``execute_job(job_id, settings=..., worker_id=...) -> final status``.

Every delivery of a job id (Celery task, re-delivery after a worker died, the reconciler's re-publish, the
embedded thread) ends here, and only a delivery that wins the claim does anything:

1. **Claim** in one conditional UPDATE: the job is ``queued``, or ``running`` with a lapsed lease; it is not
   cancelled; ``attempts < max_attempts``. The winner sets ``running``, its ``lease_owner``, a lease
   expiry and ``attempts + 1``. A loser returns the job's current status untouched, except that it settles
   jobs nobody may claim any more (attempts used up -> failed "gave up after N attempts: ...").
2. **Whole-job cache**: a succeeded job of the same tenant with the same ``job_cache_key`` (model hash,
   spec hash, compiler version) lends its artifact rows (content-addressed blobs, so no copy) -> succeeded.
3. **Pipeline in a child process** (``workers.child``, started by ``workers.pipeline_process``): a model that crashes ONNX Runtime kills the child,
   not the worker. While it runs the worker renews the lease, writes progress to the row (and an event per
   stage change), publishes it on Redis ``flexdsa:job:{id}``, stops the child on cancellation and on the
   time limits.
4. **Commit**: every final write is conditional on still holding the lease, and success replaces the job's
   artifact rows in the same transaction, so a re-delivered job ends with exactly one set of artifacts.

Failure policy: a ``FlexDSAError`` (bad model, validation failure) or a bug in the core is final. A crash of
the child (signal, unexpected exit) or a lost worker is retried until ``max_attempts``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import and_, bindparam, delete, func, insert, or_, select, update
from sqlalchemy.exc import InterfaceError, OperationalError

from service.core.db import session_factory_for
from service.core.logs import job_context
from service.core.models import Artifact, Incident, Job, JobEvent, JobStatus, UTCDateTime, utcnow
from service.jobs import gates
from workers.child import STORE_UNAVAILABLE
from workers.pipeline_process import PipelineProcess

log = logging.getLogger(__name__)

POLL_S = 0.2
CANCEL_CHECK_S = 1.0
PROGRESS_WRITE_S = 0.5


@dataclass
class ClaimedJob:
    id: str
    tenant_id: int
    attempts: int
    max_attempts: int
    job_cache_key: str
    model_blob_key: str
    model_filename: str
    spec: dict
    calibration_blob_key: str | None = None


class LeaseLost(Exception):
    """Another worker took the job over (our lease lapsed) or the row went away: stop, write nothing."""


def execute_job(job_id: str, *, settings, worker_id: str, requeue: Callable[[str], object] | None = None) -> str:
    """Run the job if this delivery wins the claim; return the job's status afterwards. ``requeue`` hands a
    crashed job back for another attempt (the caller's dispatch); without it the reconciler picks it up."""
    sessions = session_factory_for(settings)
    job = _claim(sessions, job_id, settings, worker_id)
    if job is None:
        return _settle_unclaimable(sessions, job_id)
    with job_context(job_id, job.tenant_id):  # every log line of this job carries its id and tenant
        log.info("job %s: claimed by %s (attempt %d/%d)", job_id, worker_id, job.attempts, job.max_attempts)
        runner = _JobRun(job, settings, worker_id, sessions, requeue)
        try:
            if runner.serve_from_job_cache():
                return JobStatus.succeeded.value
            return runner.run_pipeline()
        except LeaseLost:
            log.warning("job %s: lease lost by %s; leaving the job to its new owner", job_id, worker_id)
            return _current_status(sessions, job_id)
        finally:
            runner.close()


# --- claim --------------------------------------------------------------------------------------------


def _claim(sessions, job_id: str, settings, worker_id: str) -> ClaimedJob | None:
    now = utcnow()
    claimable = and_(
        Job.id == job_id,
        Job.cancel_requested.is_(False),
        Job.attempts < Job.max_attempts,
        or_(
            Job.status == JobStatus.queued.value,
            and_(
                Job.status == JobStatus.running.value,
                or_(Job.lease_expires_at.is_(None), Job.lease_expires_at < now),
            ),
        ),
    )
    statement = (
        update(Job)
        .where(claimable)
        .values(
            status=JobStatus.running.value,
            lease_owner=worker_id,
            lease_expires_at=now + timedelta(seconds=settings.lease_seconds),
            attempts=Job.attempts + 1,
            stage=None,  # a retry starts over; the events keep where the last attempt got to
            progress=0.0,
            started_at=func.coalesce(Job.started_at, bindparam("now", now, type_=UTCDateTime())),
            updated_at=now,
        )
        .returning(
            Job.id,
            Job.tenant_id,
            Job.attempts,
            Job.max_attempts,
            Job.job_cache_key,
            Job.model_blob_key,
            Job.model_filename,
            Job.spec,
            Job.calibration_blob_key,
        )
        .execution_options(synchronize_session=False)
    )
    with sessions() as session, session.begin():
        row = session.execute(statement).one_or_none()
        if row is None:
            return None
        job = ClaimedJob(*row)
        _add_event(
            session,
            job.id,
            "started",
            JobStatus.running,
            None,
            0.0,
            f"attempt {job.attempts}/{job.max_attempts} on {worker_id}",
        )
    return job


def _settle_unclaimable(sessions, job_id: str) -> str:
    """The claim failed: report the status, and close out a job that nobody can ever claim again."""
    now = utcnow()
    with sessions() as session, session.begin():
        job = session.get(Job, job_id, with_for_update=True)
        if job is None:
            log.warning("job %s: no such job; dropping the delivery", job_id)
            return "missing"
        if job.is_terminal:
            return job.status
        lapsed = job.status == JobStatus.queued.value or (
            job.lease_expires_at is None or job.lease_expires_at < now
        )
        if not lapsed:
            return job.status  # another worker holds a live lease
        if job.cancel_requested:
            _finish(job, JobStatus.cancelled, error={"code": "cancelled", "message": "cancelled on request"})
            job.record("cancelled", "cancelled before a worker started it")
        elif job.attempts >= job.max_attempts:
            reason = _last_attempt_reason(session, job)
            message = f"gave up after {job.attempts} attempts: {reason}"
            _finish(job, JobStatus.failed, error={"code": "attempts_exhausted", "message": message})
            job.record("failed", message)
            log.warning("job %s: %s", job_id, message)
        return job.status


def _last_attempt_reason(session, job: Job) -> str:
    if job.status == JobStatus.running.value:
        # The last attempt never reported back: its worker died and the lease lapsed.
        where = f" during stage '{job.stage}'" if job.stage else ""
        return f"worker lost{where} (lease expired)"
    message = session.scalar(
        select(JobEvent.message)
        .where(JobEvent.job_id == job.id, JobEvent.kind == "retry")
        .order_by(JobEvent.id.desc())
        .limit(1)
    )
    return message or "worker lost (lease expired)"


def _current_status(sessions, job_id: str) -> str:
    with sessions() as session:
        return session.scalar(select(Job.status).where(Job.id == job_id)) or "missing"


# --- one claimed run ----------------------------------------------------------------------------------


class _JobRun:
    def __init__(self, job: ClaimedJob, settings, worker_id: str, sessions, requeue=None) -> None:
        self.job = job
        self.requeue = requeue
        self.settings = settings
        self.worker_id = worker_id
        self.sessions = sessions
        self.publisher = _Publisher(settings.redis_url, job.id)
        self.stage: str | None = None
        self.progress = 0.0

    def close(self) -> None:
        self.publisher.close()

    # A statement that only touches the row while we still hold the lease.
    def _ours(self):
        return and_(
            Job.id == self.job.id, Job.lease_owner == self.worker_id, Job.status == JobStatus.running.value
        )

    def _locked_job(self, session) -> Job:
        job = session.scalar(select(Job).where(self._ours()).with_for_update())
        if job is None:
            raise LeaseLost(self.job.id)
        return job

    # -- whole-job cache --

    def serve_from_job_cache(self) -> bool:
        from service.jobs.job_cache import job_cache_source, refresh_requested
        from service.storage.store import StoreUnavailableError, make_store

        if refresh_requested(self.job.spec):  # the user asked for a fresh run
            return False
        with self.sessions() as session:
            source = job_cache_source(
                session, self.job.tenant_id, self.job.job_cache_key, exclude_job_id=self.job.id
            )
            if source is None:
                return False
            artifacts = [
                {"name": a.name, "blob_key": a.blob_key, "size": a.size, "content_type": a.content_type}
                for a in source.artifacts
            ]
            source_id, summary = source.id, source.report_summary
        store = make_store(self.settings)
        try:
            complete = bool(artifacts) and all(store.exists(a["blob_key"]) for a in artifacts)
        except StoreUnavailableError as err:  # cannot tell now: the pipeline waits for the store instead
            log.warning("job %s: cannot check cached job %s's blobs (%s); running the pipeline", self.job.id, source_id, err)
            return False
        if not complete:
            log.warning(
                "job %s: cached job %s has missing blobs; running the pipeline", self.job.id, source_id
            )
            return False
        self._succeed(artifacts, summary, cached_from=source_id)
        return True

    # -- pipeline --

    def run_pipeline(self) -> str:
        work_dir = tempfile.mkdtemp(prefix=f"flexdsa-job-{self.job.id[:8]}-")
        try:
            return self._run_child(work_dir)
        finally:
            shutil.rmtree(work_dir, ignore_errors=True)  # also after a crash: nothing of a job lingers

    def _run_child(self, work_dir: str) -> str:
        child = PipelineProcess.start(self._child_request(work_dir), warm=self.settings.warm_pipeline)
        heartbeat_s = max(1.0, min(self.settings.lease_seconds / 3, 10.0))
        started = time.monotonic()
        next_heartbeat = started + heartbeat_s
        next_cancel_check = started + CANCEL_CHECK_S
        last_progress_write = 0.0
        final: dict | None = None
        try:
            while True:
                for message in child.messages(POLL_S):
                    if message.get("type") == "progress":
                        last_progress_write = self._tolerate_db(
                            self._on_progress, message, last_progress_write, default=last_progress_write
                        )
                    elif message.get("type") in ("result", "error"):
                        final = message
                if child.finished():
                    break
                now = time.monotonic()
                if now >= next_heartbeat:
                    # While the database is unreachable nobody can re-claim the job, so the child runs
                    # on; the first renewal after its return says whether the job is still ours
                    # (LeaseLost if another worker took it over meanwhile).
                    self._tolerate_db(self._renew_lease, default=False)
                    next_heartbeat = now + heartbeat_s
                if now >= next_cancel_check:
                    next_cancel_check = now + CANCEL_CHECK_S
                    if self._tolerate_db(self._cancel_requested, default=False):
                        child.kill()
                        return self._cancel()
                elapsed = now - started
                if elapsed >= self.settings.job_hard_time_limit_s:
                    child.kill()
                    return self._time_limit_exceeded(elapsed)
                if elapsed >= self.settings.job_soft_time_limit_s:
                    child.terminate()  # ask politely first; the hard limit kills
        except LeaseLost:
            child.kill()
            raise
        except Exception as err:
            child.kill()
            if type(err).__name__ == "SoftTimeLimitExceeded":  # Celery's own limit, as a last resort
                return self._time_limit_exceeded(time.monotonic() - started)
            raise  # e.g. the database went away: the lease lapses and the reconciler re-queues the job
        finally:
            child.close()

        if final is not None and final["type"] == "result":
            self._record_cache_stats(final)
            self._durably(self._succeed, final["artifacts"], final.get("report_summary"))
            return JobStatus.succeeded.value
        if final is not None and final.get("code") == STORE_UNAVAILABLE:
            self._record_cache_stats(final)
            return self._durably(self._retry_or_fail, final.get("message") or "artifact store unavailable")
        if final is not None:
            self._record_cache_stats(final)
            error = {
                "code": final.get("code") or "flexdsa_error",
                "message": final.get("message") or "",
                "details": final.get("details") or {},
            }
            return self._durably(self._fail, error, final.get("incident_traceback"))
        if child.terminated:  # it ended because we stopped it at the soft limit
            return self._durably(self._time_limit_exceeded, time.monotonic() - started)
        return self._durably(self._crashed, child)

    def _durably(self, action, *args):
        """A final write outlives a database outage as long as the job's own time limit: the result is
        computed and its artifacts are in the store, so it is kept on this worker and written once the
        database is back, never dropped for a re-run."""
        return _retrying(action, *args, patience_s=float(self.settings.job_hard_time_limit_s))

    def _tolerate_db(self, action, *args, default):
        """Run a database call of the watch loop; a blip (connection lost, failover) is logged and skipped
        rather than killing a long job. ``LeaseLost`` still propagates."""
        try:
            return action(*args)
        except LeaseLost:
            raise
        except OperationalError as err:
            log.warning("job %s: database unavailable during the run (%s); retrying", self.job.id, err)
            return default

    def _child_request(self, work_dir: str) -> dict:
        request = {
            "work_dir": work_dir,
            "job_id": self.job.id,
            "tenant_id": self.job.tenant_id,  # the kernel cache it reads and writes is its tenant's
            "model_blob_key": self.job.model_blob_key,
            "model_filename": self.job.model_filename,
            "spec": self.job.spec,
            "calibration_blob_key": self.job.calibration_blob_key,
            # The pipeline has no use for the operator token (and a dumped secret reads '**********').
            "settings": self.settings.model_dump(mode="json", exclude={"operator_token"}),
        }
        return request

    def _on_progress(self, message: dict, last_write: float) -> float:
        stage = str(message.get("stage") or "")[:64] or None
        fraction = min(1.0, max(0.0, float(message.get("fraction") or 0.0)))
        text = message.get("message") or ""
        stage_changed = stage != self.stage
        now = time.monotonic()
        if not stage_changed and now - last_write < PROGRESS_WRITE_S:
            return last_write
        self.stage, self.progress = stage, max(self.progress, fraction)
        with self.sessions() as session, session.begin():
            result = session.execute(
                update(Job)
                .where(self._ours())
                .values(stage=self.stage, progress=self.progress, updated_at=utcnow())
                .execution_options(synchronize_session=False)
            )
            if result.rowcount == 0:
                raise LeaseLost(self.job.id)
            if stage_changed:
                _add_event(
                    session, self.job.id, "progress", JobStatus.running, self.stage, self.progress, text
                )
        self.publisher.publish(JobStatus.running.value, self.stage, self.progress, text)
        return now

    def _renew_lease(self) -> bool:
        now = utcnow()
        with self.sessions() as session, session.begin():
            result = session.execute(
                update(Job)
                .where(self._ours())
                .values(lease_expires_at=now + timedelta(seconds=self.settings.lease_seconds))
                .execution_options(synchronize_session=False)
            )
            if result.rowcount == 0:
                raise LeaseLost(self.job.id)
        return True

    def _cancel_requested(self) -> bool:
        with self.sessions() as session:
            return bool(session.scalar(select(Job.cancel_requested).where(Job.id == self.job.id)))

    # -- final states --

    def _succeed(self, artifacts: list[dict], summary: dict | None, cached_from: str | None = None) -> None:
        with self.sessions() as session, session.begin():
            job = self._locked_job(session)
            # Replace, not add: a re-delivered job keeps exactly one set of artifacts.
            session.execute(delete(Artifact).where(Artifact.job_id == job.id))
            if artifacts:
                now = utcnow()
                session.execute(
                    insert(Artifact),
                    [
                        {
                            "job_id": job.id,
                            "name": a["name"],
                            "blob_key": a["blob_key"],
                            "size": int(a["size"]),
                            "content_type": a.get("content_type") or "application/octet-stream",
                            "created_at": now,
                        }
                        for a in artifacts
                    ],
                )
            job.report_summary = summary
            job.cached_from_job_id = cached_from
            job.stage = "done"
            job.progress = 1.0
            _finish(job, JobStatus.succeeded)
            # Its figures, the comparison with its model's previous job, and its requirements' verdicts.
            gates.conclude(session, job, sum(int(a["size"]) for a in artifacts))
            if cached_from:
                job.record("cached", f"served from the job cache (job {cached_from})")
            job.record("succeeded", f"{len(artifacts)} artifacts")
        self.publisher.publish(JobStatus.succeeded.value, "done", 1.0, "succeeded")
        log.info("job %s: succeeded%s", self.job.id, f" from cache ({cached_from})" if cached_from else "")

    def _fail(self, error: dict, incident_traceback: str | None = None) -> str:
        incident = (error.get("details") or {}).get("incident")
        with self.sessions() as session, session.begin():
            job = self._locked_job(session)
            _finish(job, JobStatus.failed, error=error)
            job.record("failed", error["message"])
            if incident:
                self._record_incident(session, incident, error, incident_traceback or "")
        if incident:
            log.error(
                "job %s: internal error, incident %s: %s\n%s", self.job.id, incident, error["message"],
                incident_traceback or "(no traceback)", extra={"incident": incident},
            )
        self.publisher.publish(JobStatus.failed.value, self.stage, self.progress, error["message"])
        log.info("job %s: failed (%s): %s", self.job.id, error["code"], error["message"])
        return JobStatus.failed.value

    def _cancel(self) -> str:
        with self.sessions() as session, session.begin():
            job = self._locked_job(session)
            _finish(job, JobStatus.cancelled, error={"code": "cancelled", "message": "cancelled on request"})
            job.record("cancelled", f"stopped during stage '{self.stage}'" if self.stage else "stopped")
        self.publisher.publish(JobStatus.cancelled.value, self.stage, self.progress, "cancelled")
        log.info("job %s: cancelled", self.job.id)
        return JobStatus.cancelled.value

    def _time_limit_exceeded(self, elapsed_s: float) -> str:
        return self._fail(
            {
                "code": "time_limit_exceeded",
                "message": "time limit exceeded",
                "details": {
                    "elapsed_s": round(elapsed_s, 1),
                    "limit_s": self.settings.job_hard_time_limit_s,
                    "stage": self.stage,
                },
            }
        )

    def _retry_or_fail(self, reason: str) -> str:
        """The attempt could not reach the artifact store (past the patience): the service's failure, not
        the job's, so it runs again while attempts remain; its blobs are content-addressed, so a re-run
        stores nothing twice."""
        if self.job.attempts >= self.job.max_attempts:
            message = f"gave up after {self.job.attempts} attempts: {reason}"
            return self._fail({"code": STORE_UNAVAILABLE, "message": message, "details": {}})
        with self.sessions() as session, session.begin():
            job = self._locked_job(session)
            job.status = JobStatus.queued.value
            job.lease_owner = None
            job.lease_expires_at = None
            job.updated_at = utcnow()
            job.record("retry", reason)
        log.warning("job %s: %s; re-queued (attempt %d/%d)", self.job.id, reason, self.job.attempts, self.job.max_attempts)
        self.publisher.publish(JobStatus.queued.value, self.stage, self.progress, reason)
        if self.requeue is not None:
            self.requeue(self.job.id)
        return JobStatus.queued.value

    def _crashed(self, child: PipelineProcess) -> str:
        code = child.returncode
        if code is not None and code < 0:
            reason = f"pipeline process crashed (signal {-code})"
        else:
            reason = f"pipeline process exited with status {code} without a result"
        stderr_tail = child.stderr_tail()
        incident = uuid.uuid4().hex[:12]
        details = {"stage": self.stage, "incident": incident}
        retry = self.job.attempts < self.job.max_attempts
        with self.sessions() as session, session.begin():
            job = self._locked_job(session)
            if retry:
                job.status = JobStatus.queued.value
                job.lease_owner = None
                job.lease_expires_at = None
                job.updated_at = utcnow()
                job.record("retry", reason)
            else:
                message = f"gave up after {job.attempts} attempts: {reason}; incident {incident} is recorded for the operators"
                _finish(
                    job,
                    JobStatus.failed,
                    error={"code": "pipeline_crashed", "message": message, "details": details},
                )
                job.record("failed", message)
            # Every crash is an incident (the last lines the process wrote), a retried one too: a model that
            # crashes the pipeline three times leaves three, which is what an operator wants to compare.
            self._record_incident(session, incident, {"code": "pipeline_crashed", "message": reason}, stderr_tail)
        log.warning(
            "job %s: %s (attempt %d/%d)%s; incident %s, the process's last output:\n%s",
            self.job.id,
            reason,
            self.job.attempts,
            self.job.max_attempts,
            "; re-queued" if retry else "; giving up",
            incident,
            stderr_tail[-4000:],
            extra={"incident": incident},
        )
        if retry:
            self.publisher.publish(JobStatus.queued.value, self.stage, self.progress, reason)
            if self.requeue is not None:
                self.requeue(self.job.id)
            return JobStatus.queued.value
        self.publisher.publish(JobStatus.failed.value, self.stage, self.progress, reason)
        return JobStatus.failed.value

    def _record_incident(self, session, incident: str, error: dict, trace: str) -> None:
        session.add(
            Incident(
                id=incident, job_id=self.job.id, tenant_id=self.job.tenant_id, attempt=self.job.attempts,
                code=str(error.get("code") or "internal_error")[:64], summary=str(error.get("message") or "")[:1000],
                traceback=trace[-200_000:],
            )
        )

    def _record_cache_stats(self, final: dict) -> None:
        if final.get("cache_stats"):
            from service.cache.stats import record_cache_stats

            record_cache_stats(
                self.settings, final["cache_stats"], self.sessions, tenant_id=self.job.tenant_id
            )


FINAL_WRITE_MAX_DELAY_S = 2.0  # once the database is back, the result is written within this


def _retrying(action, *args, patience_s: float = 4.0):
    """Retry ``action`` while the database is unreachable, backing off from 0.25 s to
    ``FINAL_WRITE_MAX_DELAY_S``, for up to ``patience_s``; then the error propagates (the lease lapses and
    the job runs again). The short cap matters: after an outage the result must land before another worker,
    seeing the lapsed lease, re-claims the job (the reconciler sweeps every ``reconcile_interval_s``)."""
    deadline = time.monotonic() + patience_s
    delay_s = 0.25
    while True:
        try:
            return action(*args)
        except (OperationalError, InterfaceError) as err:
            if time.monotonic() + delay_s > deadline:
                raise
            log.warning("final write failed (%s); database unavailable, retrying in %.2f s", err, delay_s)
            time.sleep(delay_s)
            delay_s = min(delay_s * 2, FINAL_WRITE_MAX_DELAY_S)


def _finish(job: Job, status: JobStatus, *, error: dict | None = None) -> None:
    now = utcnow()
    job.status = status.value
    job.error = error
    job.lease_owner = None
    job.lease_expires_at = None
    job.finished_at = now
    job.updated_at = now


def _add_event(
    session,
    job_id: str,
    kind: str,
    status: JobStatus,
    stage: str | None,
    progress: float,
    message: str | None,
) -> None:
    session.add(
        JobEvent(
            job_id=job_id,
            kind=kind,
            status=status.value,
            stage=stage,
            progress=progress,
            message=message,
            at=utcnow(),
        )
    )


# --- progress on Redis --------------------------------------------------------------------------------


class _Publisher:
    """Publishes ``{"job_id", "status", "stage", "progress", "message"}`` on ``flexdsa:job:{id}``."""

    def __init__(self, redis_url: str | None, job_id: str) -> None:
        self.channel = f"flexdsa:job:{job_id}"
        self.job_id = job_id
        self._client = None
        self._warned = False
        if redis_url:
            import redis

            self._client = redis.Redis.from_url(redis_url, socket_timeout=1, socket_connect_timeout=1)

    def publish(self, status: str, stage: str | None, progress: float, message: str = "") -> None:
        if self._client is None:
            return
        payload = json.dumps(
            {
                "job_id": self.job_id,
                "status": status,
                "stage": stage,
                "progress": round(progress, 4),
                "message": message,
            }
        )
        try:
            self._client.publish(self.channel, payload)
        except Exception as err:  # live progress is best effort; the job row is the truth
            if not self._warned:
                self._warned = True
                log.warning("job %s: cannot publish progress on Redis (%s)", self.job_id, err)

    def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
