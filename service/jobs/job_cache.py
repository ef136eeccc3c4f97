"""The whole-job cache: a job identical to one its tenant already ran (same model bytes, spec, target
version, compiler version, calibration samples and vendor toolchain state) reuses that job's artifacts
instead of running again.

The toolchain state is part of "identical": a bundle made while the target's vendor toolchain was missing
holds no vendor binary, so once ``flexdsa toolchains install`` makes it ready (or installs other versions)
the same submission must compile again. A spec with ``"cache": "refresh"`` never reads the cache (its own
run then answers later identical requests).

``job_cache_key`` is the one definition of "identical" (the API stores it on the job row; tests build rows
with it too) and ``job_cache_source`` the one lookup: the API asks it before queuing, a worker again before
running, since a twin may have finished meanwhile.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from flexdsa_core import RequestSpec, TargetSpec, __version__
from flexdsa_core.options import REQUEST_ONLY
from flexdsa_core.toolchains import get_toolchain
from service.core.models import Job, JobStatus


def toolchain_state(target: TargetSpec, toolchains_dir: Path | None) -> str:
    """What the target's vendor toolchain is here, as the cache key sees it: none, not ready, or ready
    with the versions its install recorded (``ready.json``, the same test as GET /targets)."""
    if not target.toolchain:
        return "none"
    if toolchains_dir is None:
        return f"{target.toolchain}:unknown"
    status = get_toolchain(target.toolchain).status(Path(toolchains_dir))
    if not status.ready:
        return f"{target.toolchain}:not-ready"
    return f"{target.toolchain}:ready:{json.dumps(status.versions, sort_keys=True)}"


def job_cache_key(
    model_sha256: str,
    spec: RequestSpec,
    target: TargetSpec,
    calibration_sha256: str | None = None,
    toolchains_dir: Path | None = None,
) -> str:
    # What the pipeline computes from: not the target (named below), the cache policy, nor what the service
    # does around the job (its model name and requirements are judged afresh for each job).
    canonical = json.dumps(spec.model_dump(mode="json", exclude=REQUEST_ONLY), sort_keys=True, separators=(",", ":"))
    body = (
        f"{model_sha256}|{target.name}@{target.version}:{target.content_sha256}|{canonical}|{__version__}"
        f"|toolchain:{toolchain_state(target, toolchains_dir)}"
    )
    if calibration_sha256:  # other samples judge (and calibrate) another model
        body += f"|calibration:{calibration_sha256}"
    return hashlib.sha256(body.encode()).hexdigest()


def refresh_requested(spec: dict | RequestSpec) -> bool:
    """The spec asks for a fresh run (``"cache": "refresh"``): no earlier job answers it."""
    value = spec.cache if isinstance(spec, RequestSpec) else (spec or {}).get("cache")
    return value == "refresh"


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
