"""Job logic behind the routes: submission (quota, idempotency, whole-job cache), cancellation, listing,
and the hand-off to the workers after the database commit.

The whole-job cache key is ``sha256(model sha256 | target spec hash | canonical request JSON | compiler
version)``: the same bytes, asked the same thing of the same target by the same compiler, give the same
artifacts, so a later identical request is answered at once with copies of the earlier job's artifact
rows (the blobs themselves are shared, being content-addressed).
"""

from __future__ import annotations

import base64
import fcntl
import json
import logging
import os
import threading
from contextlib import contextmanager
from datetime import datetime

from pydantic import ValidationError
from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, object_session

from flexdsa_core import FlexDSAError, RequestSpec, TargetSpec
from flexdsa_core.calibration import check_calibration_file
from flexdsa_core.errors import InvalidOptionsError
from flexdsa_core.preflight import check_request
from flexdsa_core.spec_check import SpecError, check_calibration_use, parse_request
from service.core.config import Settings
from service.core.errors import Conflict, InvalidRequest, QuotaExceeded, storage_io
from service.core.input_checks import check_spec_json
from service.core.models import Artifact, Job, JobStatus, Tenant, utcnow
from service.jobs import gates
from service.jobs.dispatch import enqueue as dispatch
from service.jobs.job_cache import job_cache_key, job_cache_source, refresh_requested
from service.jobs.schemas import JobError, JobLinks, JobOut
from service.jobs.upload import NotOnnxError, ReceivedUpload, check_onnx_structure
from service.storage.store import ArtifactStore

log = logging.getLogger("flexdsa.service")

JOB_CHANNEL = "flexdsa:job:{job_id}"


def job_channel(job_id: str) -> str:
    return JOB_CHANNEL.format(job_id=job_id)


# --- validation -------------------------------------------------------------------------------------------


def parse_spec(spec_json: str) -> tuple[RequestSpec, TargetSpec]:
    """The request spec and its target, or ``InvalidRequest`` (422) naming every field error: the sentence
    ``flexdsa optimize`` and ``flexdsa submit`` print for the same mistake (``flexdsa_core.spec_check``)."""
    check_spec_json(spec_json)  # control characters, int64 overflow: refused before anything else sees them
    try:
        spec = parse_request(spec_json, "The 'spec' field")
    except SpecError as err:
        raise InvalidRequest(err.message, code=err.code, details=err.details) from None
    try:
        target = spec.target_spec()
    except ValidationError as err:
        raise InvalidRequest(
            "The custom target spec is invalid; see details.",
            code="invalid_target",
            details=[{"loc": ["target", *e["loc"]], "msg": e["msg"]} for e in err.errors()],
        ) from None
    except FlexDSAError as err:
        # An unknown target inside a request is a bad request (422), not a missing resource.
        raise InvalidRequest(err.message, code=err.code, details=err.details) from None
    return spec, target


def check_model(upload: ReceivedUpload) -> None:
    try:
        check_onnx_structure(upload.path)
    except NotOnnxError as err:
        raise InvalidRequest(
            f"{upload.filename!r} is not a usable ONNX model: {err}. Upload the .onnx file itself "
            "(protobuf ModelProto).",
            code="invalid_model",
            details={"filename": upload.filename, "reason": str(err)},
        ) from None


def check_options(upload: ReceivedUpload, spec: RequestSpec, target: TargetSpec) -> None:
    """Unknown rule names, shape buckets the model cannot run, accuracy metrics naming outputs it lacks and an
    int8-only target without calibration samples are the user's to fix: 422 before queuing."""
    try:
        check_request(upload.weightless(), spec.options(), target, has_samples=upload.calibration is not None)
    except InvalidOptionsError as err:
        raise InvalidRequest(err.message, code=err.code, details=err.details) from None


def check_calibration_upload(upload: ReceivedUpload, spec: RequestSpec) -> None:
    """Calibration samples that cannot be read or do not fit the model's inputs: 422 before queuing. Judged
    from the .npz's headers and the model without its weights: the API holds neither the samples nor the
    weights (a 1 MB compressed .npz can unpack to a GiB)."""
    if upload.calibration is None:
        return
    try:
        check_calibration_use(spec, has_calibration=True)
        check_calibration_file(upload.weightless(), upload.calibration.path)
    except InvalidOptionsError as err:
        raise InvalidRequest(err.message, code=err.code, details=err.details) from None


# --- submission -------------------------------------------------------------------------------------------


def find_by_idempotency_key(session: Session, tenant: Tenant, key: str | None) -> Job | None:
    if not key:
        return None
    return session.scalar(select(Job).where(Job.tenant_id == tenant.id, Job.idempotency_key == key))


def admit_submit(
    session: Session, settings: Settings, tenant: Tenant, rate_limiter, idempotency_key: str | None
) -> Job | None:
    """Everything decided from the key before the body is read, in one call (one thread hand-off for the
    route): the job of an earlier request with the same ``Idempotency-Key`` (the answer, body unread), else
    the rate limit and the quota (429). Ends the read transaction: the upload may take minutes, and an
    idle-in-transaction connection would sit in the pool all that time."""
    existing = find_by_idempotency_key(session, tenant, idempotency_key)
    if existing is None:
        rate_limiter.check(tenant.id)
        check_quota_before_upload(session, settings, tenant)
    session.commit()  # expire_on_commit=False keeps the tenant and the job readable
    return existing


def check_quota_before_upload(session: Session, settings: Settings, tenant: Tenant) -> None:
    """Refuse (429) a tenant already at its quota before its body is read: an over-quota client must not
    make the service receive, hash and store a model only to be refused. Not locked: the locked check in
    ``submit_job`` still decides a race; this one only spares the bytes."""
    _raise_if_over_quota(session, settings, tenant)


def _check_quota(session: Session, settings: Settings, tenant: Tenant) -> None:
    # Serialise this tenant's submissions so two concurrent ones cannot both squeeze under the limit: a row
    # lock on Postgres; SQLite has no FOR UPDATE, so a no-op write takes its database write lock instead.
    if session.get_bind().dialect.name == "sqlite":
        session.execute(update(Tenant).where(Tenant.id == tenant.id).values(name=Tenant.name))
    else:
        session.execute(select(Tenant.id).where(Tenant.id == tenant.id).with_for_update())
    _raise_if_over_quota(session, settings, tenant)


def _raise_if_over_quota(session: Session, settings: Settings, tenant: Tenant) -> None:
    """The quota counts the tenant's queued and running jobs: a tenant whose jobs start quickly must not
    be able to keep every worker busy by submitting again as soon as each one leaves the queue."""
    limit = (
        tenant.max_queued_jobs if tenant.max_queued_jobs is not None else settings.max_queued_jobs_per_tenant
    )
    counts = dict(
        session.execute(
            select(Job.status, func.count())
            .where(Job.tenant_id == tenant.id, Job.status.in_([JobStatus.queued, JobStatus.running]))
            .group_by(Job.status)
        ).all()
    )
    queued, running = counts.get(JobStatus.queued.value, 0), counts.get(JobStatus.running.value, 0)
    if queued + running >= limit:
        raise QuotaExceeded(
            f"This tenant already has {queued + running} jobs queued or running (limit {limit}). Wait for "
            "some to finish, or cancel some.",
            details={"active": queued + running, "queued": queued, "running": running, "limit": limit},
            headers={"Retry-After": "30"},
        )


def submit_job(
    session: Session,
    settings: Settings,
    store: ArtifactStore,
    tenant: Tenant,
    upload: ReceivedUpload,
    idempotency_key: str | None,
) -> tuple[Job, bool]:
    """Validate, store and record one job; returns (job, replayed). The caller enqueues after this commits."""
    spec, target = parse_spec(upload.spec)
    check_model(upload)
    check_options(upload, spec, target)
    check_calibration_upload(upload, spec)
    # Stored before the job is recorded and outside the tenant's lock: an object store's upload takes as long
    # as the bytes take, and must not hold up the tenant's other submits (a rename on a local store). Only
    # once the store has the bytes is a job recorded that points at them; should the quota then refuse,
    # the blob stays (content-addressed, harmless, and the client's retry finds it there).
    with storage_io():
        blob_key = store.put_file(upload.path, key=upload.sha256, move=True)
        calibration_key = None
        if upload.calibration is not None:
            calibration = upload.calibration
            calibration_key = store.put_file(calibration.path, key=calibration.sha256, move=True)
    with _one_writer_at_a_time(session):
        return _record_job(
            session, tenant, upload, idempotency_key, spec, target, settings, blob_key, calibration_key
        )


# SQLite takes one writer at a time, and a writer that finds the lock taken waits in SQLite's busy handler,
# which sleeps 1, 2, 5, 10 ... 100 ms between tries however soon the lock is free again: twenty big uploads
# recording their jobs together made a small submit wait 120-160 ms for its turn (bench.ingest). Submissions
# queue on a lock instead and each is woken as the one before commits: a thread lock inside a process, and
# an flock on a file beside the database between the processes of `flexdsa serve --workers N` (the kernel
# wakes a blocked flock at once). Other writers still meet SQLite's own lock; PostgreSQL needs none of this.
_submit_thread_lock = threading.Lock()
_submit_lock_files: dict[str, int] = {}


@contextmanager
def _one_writer_at_a_time(session: Session):
    url = session.get_bind().url
    if url.get_backend_name() != "sqlite":
        yield
        return
    with _submit_thread_lock:
        fd = _submit_lock_file(url.database)
        if fd is None:
            yield
            return
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def _submit_lock_file(database: str | None) -> int | None:
    """This process's descriptor of ``<database>.submit-lock`` (opened once); None for an in-memory database.
    Called with ``_submit_thread_lock`` held."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    if database not in _submit_lock_files:
        _submit_lock_files[database] = os.open(f"{database}.submit-lock", os.O_RDWR | os.O_CREAT, 0o600)
    return _submit_lock_files[database]


def _record_job(
    session: Session,
    tenant: Tenant,
    upload: ReceivedUpload,
    idempotency_key: str | None,
    spec: RequestSpec,
    target: TargetSpec,
    settings: Settings,
    blob_key: str,
    calibration_key: str | None,
) -> tuple[Job, bool]:
    _check_quota(session, settings, tenant)
    try:
        job = new_job(
            session, settings, tenant, spec, target,
            calibration_identity=upload.calibration and upload.calibration.sha256,
            message=f"Queued for {target.name}.",
            use_cache=not refresh_requested(spec),
            **upload_columns(upload, blob_key, calibration_key),
            idempotency_key=idempotency_key,
        )  # fmt: skip
        session.commit()
    except IntegrityError:
        # The same Idempotency-Key raced us; that request's job is the answer.
        session.rollback()
        existing = find_by_idempotency_key(session, tenant, idempotency_key)
        if existing is None:
            raise
        return existing, True
    return job, False


def upload_columns(upload: ReceivedUpload, blob_key: str, calibration_key: str | None) -> dict:
    """The job row's columns that name its stored model and calibration samples."""
    return {
        "model_sha256": upload.sha256,
        "model_blob_key": blob_key,
        "model_filename": upload.filename,
        "model_size": upload.size,
        "calibration_blob_key": calibration_key,
    }


def new_job(
    session: Session,
    settings: Settings,
    tenant: Tenant,
    spec: RequestSpec,
    target: TargetSpec,
    *,
    calibration_identity: str | None,
    message: str,
    use_cache: bool,
    **columns,
) -> Job:
    """A job for ``spec`` on ``target``, added to the session (not committed): queued with ``message``, or,
    with ``use_cache`` and an identical earlier job that succeeded (``job_cache_key``: the model, the spec,
    the target and its toolchain's state, the calibration samples), answered from it. ``columns``: the stored
    model's (``upload_columns``) and the row's others (idempotency key, group, lineage)."""
    cache_key = job_cache_key(columns["model_sha256"], spec, target, calibration_identity, settings.toolchains_dir)
    job = Job(
        tenant_id=tenant.id,
        status=JobStatus.queued.value,
        progress=0.0,
        target=target.name,
        spec=spec.model_dump(mode="json"),
        job_cache_key=cache_key,
        attempts=0,
        max_attempts=settings.max_attempts,
        model_name=gates.model_name_of(spec.model_name, columns.get("model_filename")),
        **columns,
    )
    with session.no_autoflush:
        source = job_cache_source(session, tenant.id, cache_key) if use_cache else None
    session.add(job)
    if source is None:
        job.record("queued", message)
    else:
        _answer_from_cache(job, source)
    return job


def _answer_from_cache(job: Job, source: Job) -> None:
    now = utcnow()
    job.status = JobStatus.succeeded.value
    job.stage = "done"
    job.progress = 1.0
    job.cached_from_job_id = source.id
    job.report_summary = source.report_summary
    # One instant for all three: the row's own default would stamp created_at after these (negative queue time).
    job.created_at = job.started_at = job.finished_at = now
    job.artifacts = [
        Artifact(name=a.name, blob_key=a.blob_key, size=a.size, content_type=a.content_type, created_at=now)
        for a in source.artifacts
    ]
    # Judged as itself: its own requirements, against its own model's previous job (not its source's verdicts).
    gates.conclude(object_session(source), job, sum(a.size for a in job.artifacts))
    job.record("cached", f"Identical to job {source.id}; its artifacts are reused.")


def create_derived_job(
    session: Session, settings: Settings, tenant: Tenant, parent: Job, spec: RequestSpec, message: str
) -> Job:
    """A new version of ``parent``'s bundle: the same stored model and calibration samples under another spec
    (re-specialised buckets), linked by ``parent_job_id`` with the next ``bundle_version``; quota and the
    whole-job cache apply as to a submission. Committed; the caller enqueues it when it is queued."""
    target = spec.target_spec()
    with _one_writer_at_a_time(session):
        _check_quota(session, settings, tenant)
        job = new_job(
            session, settings, tenant, spec, target,
            calibration_identity=parent.calibration_blob_key,
            message=message,
            use_cache=True,
            model_sha256=parent.model_sha256,
            model_blob_key=parent.model_blob_key,
            model_filename=parent.model_filename,
            model_size=parent.model_size,
            calibration_blob_key=parent.calibration_blob_key,
            parent_job_id=parent.id,
            bundle_version=parent.bundle_version + 1,
            respecialise_max_buckets=parent.respecialise_max_buckets,
        )  # fmt: skip
        session.commit()
    return job


def enqueue(job_id: str, settings: Settings) -> None:
    """Hand a committed job to the workers. A failure leaves it queued: the reconciler picks it up later."""
    try:
        dispatch(job_id, settings)
    except Exception:
        log.exception("job %s left queued: enqueue failed", job_id)


def publish(redis_client, job: Job, kind: str) -> None:
    """Nudge progress streams following this job (they re-read the database; the message is only a hint)."""
    if redis_client is None:
        return
    try:
        redis_client.publish(
            job_channel(job.id), json.dumps({"job_id": job.id, "kind": kind, "status": job.status})
        )
    except Exception as err:
        log.warning("could not publish %s for job %s: %s", kind, job.id, err)


# --- cancellation -----------------------------------------------------------------------------------------


def cancel_job(session: Session, job: Job) -> tuple[Job, str]:
    """Cancel ``job``: queued ones at once, running ones by request. Returns (job, event kind)."""
    now = utcnow()
    cancelled = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status == JobStatus.queued)
        .values(
            status=JobStatus.cancelled.value,
            finished_at=now,
            updated_at=now,
            cancel_requested=True,
            error={"code": "cancelled", "message": "Cancelled before it started.", "details": {}},
        )
    ).rowcount
    if cancelled:
        session.refresh(job)
        job.record("cancelled", "Cancelled before it started.")
        session.commit()
        return job, "cancelled"
    requested = session.execute(
        update(Job)
        .where(Job.id == job.id, Job.status == JobStatus.running)
        .values(cancel_requested=True, updated_at=now)
    ).rowcount
    session.refresh(job)
    if requested:
        job.record("cancel_requested", "Cancel requested; the worker stops at its next checkpoint.")
        session.commit()
        return job, "cancel_requested"
    session.rollback()
    raise Conflict(
        f"Job {job.id} has already finished ({job.status}); there is nothing to cancel.",
        code="job_finished",
        details={"status": job.status},
    )


# --- reading ----------------------------------------------------------------------------------------------


def _job_error(error: dict | None) -> JobError | None:
    # Written by workers; read defensively so one odd row never turns GET /jobs into a 500.
    if not error:
        return None
    return JobError(
        code=str(error.get("code", "error")),
        message=str(error.get("message", "")),
        details=error.get("details"),
    )


def job_out(job: Job, root_path: str = "") -> JobOut:
    now = utcnow()
    queued_s = (job.started_at - job.created_at).total_seconds() if job.started_at else None
    run_s = ((job.finished_at or now) - job.started_at).total_seconds() if job.started_at else None
    base = f"{root_path}/jobs/{job.id}"
    summary = job.report_summary if isinstance(job.report_summary, dict) else {}
    return JobOut(
        id=job.id,
        status=job.status,
        stage=job.stage,
        progress=job.progress,
        progress_percent=round(job.progress * 100, 1),
        target=job.target,
        model_filename=job.model_filename,
        model_size=job.model_size,
        model_sha256=job.model_sha256,
        spec=job.spec,
        attempts=job.attempts,
        max_attempts=job.max_attempts,
        cancel_requested=job.cancel_requested,
        cached_from_job_id=job.cached_from_job_id,
        created_at=job.created_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        updated_at=job.updated_at,
        queued_seconds=queued_s,
        run_seconds=run_s,
        report_summary=job.report_summary,
        parent_job_id=job.parent_job_id,
        bundle_version=job.bundle_version or 1,
        group_id=job.group_id,
        model_name=job.model_name,
        requirements=summary.get("requirements") if job.status == JobStatus.succeeded else None,
        previous=summary.get("previous") if job.status == JobStatus.succeeded else None,
        error=_job_error(job.error),
        links=JobLinks(self=base, events=f"{base}/events", artifacts=f"{base}/artifacts"),
    )


def encode_cursor(job: Job) -> str:
    raw = json.dumps([job.created_at.isoformat(), job.id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        created, job_id = json.loads(base64.urlsafe_b64decode(padded))
        return datetime.fromisoformat(created), str(job_id)
    except Exception:
        raise InvalidRequest("The cursor is not one this service issued.", code="invalid_cursor") from None


def list_jobs(
    session: Session,
    tenant: Tenant,
    *,
    status: str | None,
    target: str | None,
    limit: int,
    offset: int,
    cursor: str | None,
) -> tuple[list[Job], int, str | None]:
    filters = [Job.tenant_id == tenant.id]
    if status:
        filters.append(Job.status == status)
    if target:
        filters.append(Job.target == target)
    total = session.scalar(select(func.count()).select_from(Job).where(*filters))
    query = select(Job).where(*filters).order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)
    if cursor:
        created, job_id = decode_cursor(cursor)
        query = query.where(or_(Job.created_at < created, and_(Job.created_at == created, Job.id < job_id)))
    else:
        query = query.offset(offset)
    rows = list(session.scalars(query))
    next_cursor = encode_cursor(rows[limit - 1]) if len(rows) > limit else None
    return rows[:limit], total, next_cursor
