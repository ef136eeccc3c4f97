"""The whole-job cache: a job identical to one its tenant already ran (same model bytes, spec, target
version, compiler version and calibration samples) reuses that job's artifacts instead of running again.

``job_cache_key`` is the one definition of "identical" (the API stores it on the job row; tests build rows
with it too) and ``job_cache_source`` the one lookup: the API asks it before queuing, a worker again before
running, since a twin may have finished meanwhile.
"""

from __future__ import annotations

import hashlib
import json

from sqlalchemy import select
from sqlalchemy.orm import Session

from flexdsa_core import RequestSpec, TargetSpec, __version__
from service.models import Job, JobStatus


def job_cache_key(
    model_sha256: str, spec: RequestSpec, target: TargetSpec, calibration_sha256: str | None = None
) -> str:
    canonical = json.dumps(
        spec.model_dump(mode="json", exclude={"target"}), sort_keys=True, separators=(",", ":")
    )
    body = f"{model_sha256}|{target.name}@{target.version}:{target.spec_hash()}|{canonical}|{__version__}"
    if calibration_sha256:  # other samples judge (and calibrate) another model
        body += f"|calibration:{calibration_sha256}"
    return hashlib.sha256(body.encode()).hexdigest()


def job_cache_source(
    session: Session, tenant_id: int, cache_key: str, *, exclude_job_id: str | None = None
) -> Job | None:
    """The tenant's latest succeeded job with this ``job_cache_key`` (an original run before a copy served
    from the cache), whose artifacts an identical job may reuse. The one lookup of the whole-job cache: the
    API asks it before queuing, a worker again before running (a twin may have finished meanwhile)."""
    query = select(Job).where(
        Job.tenant_id == tenant_id, Job.job_cache_key == cache_key, Job.status == JobStatus.succeeded
    )
    if exclude_job_id is not None:
        query = query.where(Job.id != exclude_job_id)
    return session.scalar(
        query.order_by(Job.cached_from_job_id.is_not(None), Job.finished_at.desc()).limit(1)
    )
