"""Job groups: one upload compared across several targets ("which chip?").

A spec that names ``targets`` (a list of built-in names, or ``"all"``) instead of ``target`` makes one group
and one job per target. Every target's spec is checked against the model before anything is stored or
queued (an unknown name, an option one target refuses: 422 naming the target), the model is stored once
(content-addressed), and the group and all its jobs are recorded in one transaction, so a refusal (quota)
leaves nothing behind. Each job is then an ordinary job: the workers, the whole-job cache, cancellation
and the job pages know nothing of groups.

A group's view reads each job's ``report_summary["comparison"]`` (``flexdsa_core.compare.comparison_row``,
written by the worker) and adds the bundle's size from the job's artifact rows.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from flexdsa_core import RequestSpec, TargetSpec, list_targets
from flexdsa_core.compare import resolve_targets
from service.core.config import Settings
from service.core.errors import InvalidRequest, NotFound, QuotaExceeded, storage_io
from service.core.input_checks import check_spec_json
from service.core.models import Artifact, Job, JobGroup, JobStatus, Tenant
from service.groups.schemas import GroupCreated, GroupJob, GroupOut
from service.jobs import service as jobs
from service.jobs.job_cache import refresh_requested
from service.jobs.upload import PendingUpload, ReceivedUpload
from service.storage.store import ArtifactStore


def builtin_target_names() -> list[str]:
    return [target.name for target in list_targets()]


def requested_targets(spec_json: str | None) -> list[str] | None:
    """The targets a spec names with ``targets`` (None when it names one ``target``); 422 for an unknown
    name (with the closest known ones) or for ``target`` and ``targets`` both given."""
    if spec_json is None:
        return None
    check_spec_json(spec_json)
    try:
        data = json.loads(spec_json)
    except ValueError:
        return None  # not JSON: the single-target parser says where it breaks
    if not isinstance(data, dict) or "targets" not in data:
        return None
    if "target" in data:
        raise InvalidRequest(
            "The spec names both 'target' and 'targets': give 'targets' (a list of names, or \"all\") to "
            "compare several, or 'target' for one.",
            code="invalid_spec",
            details=[{"loc": ["targets"], "msg": "'target' and 'targets' are exclusive"}],
        )
    requested = data["targets"]
    if not isinstance(requested, str | list) or (isinstance(requested, list) and not all(isinstance(n, str) for n in requested)):
        raise InvalidRequest(
            "'targets' is a list of built-in target names (GET /targets) or \"all\".",
            code="invalid_spec",
            details=[{"loc": ["targets"], "msg": "expected a list of strings or \"all\""}],
        )
    known = builtin_target_names()
    try:
        return resolve_targets(requested, known)
    except ValueError as err:
        raise InvalidRequest(
            str(err), code="unknown_target", details={"known": known, "requested": requested}
        ) from None


def spec_for(spec_json: str, target: str) -> str:
    """The single-target spec of one member of a group: the same options, ``target`` in place of ``targets``."""
    data = json.loads(spec_json)
    data.pop("targets", None)
    data["target"] = target
    return json.dumps(data)


# --- submission -------------------------------------------------------------------------------------------


def accept_upload(
    session: Session,
    settings: Settings,
    store: ArtifactStore,
    tenant: Tenant,
    pending: PendingUpload | ReceivedUpload,
    idempotency_key: str | None,
) -> tuple[Job | JobGroup, bool, int]:
    """``jobs.accept_upload`` for a submission that may name several targets: (the job, or the group when
    the spec names ``targets``; replayed; model bytes). The upload's temp files are gone when it returns."""
    upload = pending.complete() if isinstance(pending, PendingUpload) else pending
    targets = None
    try:
        targets = requested_targets(upload.spec)
        if targets is None:
            job, replayed = jobs.submit_job(session, settings, store, tenant, upload, idempotency_key)
        else:
            group, members, replayed = submit_group(
                session, settings, store, tenant, upload, targets, idempotency_key
            )
    finally:
        upload.discard()
    if targets is None:
        if not replayed and job.status == JobStatus.queued:
            jobs.enqueue(job.id, settings)
        return job, replayed, upload.size
    if not replayed:
        for member in members:
            if member.status == JobStatus.queued:
                jobs.enqueue(member.id, settings)
    return group, replayed, upload.size


def submit_group(
    session: Session,
    settings: Settings,
    store: ArtifactStore,
    tenant: Tenant,
    upload: ReceivedUpload,
    targets: list[str],
    idempotency_key: str | None,
) -> tuple[JobGroup, list[Job], bool]:
    """Check every target's spec, store the model once, record the group and its jobs in one commit:
    (group, jobs, replayed). The caller enqueues the queued ones after this returns."""
    jobs.check_model(upload)
    checked: list[tuple[RequestSpec, TargetSpec]] = []
    for name in targets:
        try:
            spec, target = jobs.parse_spec(spec_for(upload.spec, name))
            jobs.check_options(upload, spec, target)
            jobs.check_calibration_upload(upload, spec)
        except InvalidRequest as err:
            raise InvalidRequest(
                f"Target {name}: {err.message}", code=err.code, details={"target": name, "error": err.details}
            ) from None
        checked.append((spec, target))
    with storage_io():
        blob_key = store.put_file(upload.path, key=upload.sha256, move=True)
        calibration_key = None
        if upload.calibration is not None:
            calibration_key = store.put_file(upload.calibration.path, key=upload.calibration.sha256, move=True)
    with jobs._one_writer_at_a_time(session):
        return _record_group(
            session, settings, tenant, upload, checked, idempotency_key, blob_key, calibration_key
        )


def _record_group(
    session: Session,
    settings: Settings,
    tenant: Tenant,
    upload: ReceivedUpload,
    checked: list[tuple[RequestSpec, TargetSpec]],
    idempotency_key: str | None,
    blob_key: str,
    calibration_key: str | None,
) -> tuple[JobGroup, list[Job], bool]:
    jobs._check_quota(session, settings, tenant)  # takes the tenant's lock, refuses one already at its limit
    _check_room_for(session, settings, tenant, len(checked))
    group = JobGroup(
        tenant_id=tenant.id,
        targets=[target.name for _, target in checked],
        model_filename=upload.filename,
        model_sha256=upload.sha256,
    )
    session.add(group)
    session.flush()
    members = []
    for index, (spec, target) in enumerate(checked):
        job = jobs.new_job(
            session, settings, tenant, spec, target,
            calibration_identity=upload.calibration and upload.calibration.sha256,
            message=f"Queued for {target.name} (one of {len(checked)} targets compared).",
            use_cache=not refresh_requested(spec),
            **jobs.upload_columns(upload, blob_key, calibration_key),
            group_id=group.id,
            # The group's first job carries the key: a retry finds it, and through it the group.
            idempotency_key=idempotency_key if index == 0 else None,
        )  # fmt: skip
        members.append(job)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()  # the same Idempotency-Key raced us: that request's group is the answer
        existing = jobs.find_by_idempotency_key(session, tenant, idempotency_key)
        if existing is None or existing.group_id is None:
            raise
        group = session.get(JobGroup, existing.group_id)
        return group, list(group.jobs), True
    return group, members, False


def _check_room_for(session: Session, settings: Settings, tenant: Tenant, adding: int) -> None:
    """A group adds one job per target at once: all of them must fit under the tenant's quota."""
    limit = tenant.max_queued_jobs if tenant.max_queued_jobs is not None else settings.max_queued_jobs_per_tenant
    active = session.scalar(
        select(func.count()).select_from(Job).where(
            Job.tenant_id == tenant.id, Job.status.in_([JobStatus.queued, JobStatus.running])
        )
    )
    if active + adding > limit:
        raise QuotaExceeded(
            f"Comparing {adding} targets queues {adding} jobs, and this tenant already has {active} queued or "
            f"running (limit {limit}). Name fewer targets, or wait for some jobs to finish.",
            details={"active": active, "adding": adding, "limit": limit},
            headers={"Retry-After": "30"},
        )


# --- reading ----------------------------------------------------------------------------------------------


def group_of_tenant(session: Session, tenant: Tenant, group_id: str, missing: str | None = None) -> JobGroup:
    """The tenant's group, or 404 with ``missing`` (the same sentence whether or not the id exists)."""
    group = session.get(JobGroup, group_id)
    if group is None or group.tenant_id != tenant.id:
        raise NotFound(missing or f"No job group {group_id!r} for this tenant.", code="group_not_found")
    return group


def group_status(statuses: list[str]) -> str:
    """queued / running while any job is; then succeeded (all), failed (none succeeded) or partial."""
    if any(s == JobStatus.running for s in statuses) or (
        any(s == JobStatus.queued for s in statuses) and not all(s == JobStatus.queued for s in statuses)
    ):
        return "running"
    if all(s == JobStatus.queued for s in statuses):
        return "queued"
    if all(s == JobStatus.succeeded for s in statuses):
        return "succeeded"
    if not any(s == JobStatus.succeeded for s in statuses):
        return "failed"
    return "partial"


def comparison(job: Job, bundle_bytes: int | None) -> dict[str, Any]:
    """One row of the group's comparison: the worker's row with the bundle size, or the job's state."""
    row: dict[str, Any] = {"target": job.target, "job_id": job.id, "status": job.status}
    if job.status != JobStatus.succeeded:
        if job.error:
            row["error"] = job.error.get("message") or job.error.get("code")
        return row
    found = (job.report_summary or {}).get("comparison")
    if found is None:  # a job from before comparisons were kept
        row["error"] = "no comparison recorded for this job (it ran before comparisons were kept)"
        return row
    return {**found, **row, "bundle_bytes": None if bundle_bytes is None else int(bundle_bytes)}


def group_created(group: JobGroup, root_path: str = "") -> GroupCreated:
    return GroupCreated(
        group_id=group.id,
        status_url=f"{root_path}/groups/{group.id}",
        jobs=[_group_job(job, root_path) for job in group.jobs],
    )


def _group_job(job: Job, root_path: str) -> GroupJob:
    return GroupJob(
        job_id=job.id,
        target=job.target,
        status=job.status,
        progress=job.progress,
        status_url=f"{root_path}/jobs/{job.id}",
        cached=job.cached_from_job_id is not None,
    )


def group_out(session: Session, group: JobGroup, root_path: str = "") -> GroupOut:
    members = list(group.jobs)
    sizes = dict(
        session.execute(
            select(Artifact.job_id, func.sum(Artifact.size))
            .where(Artifact.job_id.in_([job.id for job in members]))
            .group_by(Artifact.job_id)
        ).all()
    )
    order = {name: index for index, name in enumerate(group.targets)}
    members.sort(key=lambda job: order.get(job.target, len(order)))
    return GroupOut(
        id=group.id,
        status=group_status([job.status for job in members]),
        model_filename=group.model_filename,
        model_sha256=group.model_sha256,
        targets=group.targets,
        created_at=group.created_at,
        jobs=[_group_job(job, root_path) for job in members],
        comparison=[comparison(job, sizes.get(job.id)) for job in members],
    )
