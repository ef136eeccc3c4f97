"""Gates for pipelines, when a job ends: its figures, the comparison with the previous successful job of the
same model on the same target, and a verdict per requirement of its spec (``flexdsa_core.requirements``
defines each figure and rule).

``conclude`` writes them into the job's report summary, under ``gate_figures``, ``previous`` and ``requirements``
(``figures`` there is the report's own: latency, energy and accuracy per bucket, ``flexdsa_core.figures``):
the worker calls it as it records a succeeded job, and the API as it answers a job from the whole-job cache
(a cached job is compared and judged as itself, never with its source's verdicts). A job that misses a
requirement still succeeds: its artifacts are real and downloadable; ``flexdsa submit`` exits 3 on it.

A job's model is ``model_name`` (the spec's, else the uploaded file's name without its suffix); its
predecessor is the latest job of that model, target and tenant, submitted before it, that succeeded.
"""

from __future__ import annotations

import logging
from pathlib import PurePath

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from flexdsa_core.requirements import compare_with_previous, evaluate, figures
from service.core.models import Artifact, Job, JobStatus

log = logging.getLogger("flexdsa.service")
# What ``conclude`` adds to a report summary.
GATE_KEYS = ("gate_figures", "previous", "requirements")


def without_gates(summary: dict | None) -> dict:
    """The summary as the pipeline wrote it: without what ``conclude`` added."""
    return {key: value for key, value in (summary or {}).items() if key not in GATE_KEYS}


def model_name_of(spec_model_name: str | None, filename: str | None) -> str:
    """The spec's ``model_name``, else the file's stem (``resnet50.onnx`` -> ``resnet50``)."""
    if spec_model_name:
        return spec_model_name
    stem = PurePath(filename or "").stem
    return (stem or "model")[:255]


def predecessor(session: Session, job: Job) -> Job | None:
    """The latest earlier successful job of the same model on the same target, of the same tenant."""
    if not job.model_name:
        return None
    query = select(Job).where(
        Job.tenant_id == job.tenant_id,
        Job.model_name == job.model_name,
        Job.target == job.target,
        Job.status == JobStatus.succeeded.value,
        Job.created_at <= job.created_at,
    )
    if job.id is not None:
        query = query.where(Job.id != job.id)
    return session.scalar(query.order_by(Job.created_at.desc(), Job.id.desc()).limit(1))


def bundle_bytes(session: Session, job_id: str) -> int | None:
    """Every artifact of the job together (PostgreSQL sums to a Decimal: made an int)."""
    total = session.scalar(select(func.sum(Artifact.size)).where(Artifact.job_id == job_id))
    return None if total is None else int(total)


def conclude(session: Session, job: Job, artifact_bytes: int | None) -> None:
    """Write the job's figures, its comparison with its predecessor and its requirements' verdicts into its
    report summary. Never fails the job: a summary this cannot read is logged and left as it was."""
    try:
        with session.no_autoflush:
            _conclude(session, job, artifact_bytes)
    except Exception:  # noqa: BLE001 - a verdict that cannot be made must not undo a finished job
        log.exception("job %s: could not judge its requirements", job.id)


def _conclude(session: Session, job: Job, artifact_bytes: int | None) -> None:
    summary = dict(job.report_summary or {})
    current = figures(summary, artifact_bytes)
    previous = None
    before = predecessor(session, job)
    if before is not None:
        earlier = (before.report_summary or {}).get("gate_figures") or figures(
            before.report_summary, bundle_bytes(session, before.id)
        )
        previous = {"job_id": before.id, "rows": compare_with_previous(current, earlier)}
    summary["gate_figures"] = current
    summary["previous"] = previous
    requirements = (job.spec or {}).get("requirements") or []
    summary["requirements"] = evaluate(requirements, current, previous) if requirements else None
    job.report_summary = summary  # a new dict: the JSON column sees the change
