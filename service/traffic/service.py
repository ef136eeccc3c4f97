"""Run-time traffic and re-specialisation, behind ``service/traffic/routes.py`` and the dashboard.

A deployed bundle's runtime (``flexdsa_runtime``) counts the shapes it served, per (dims, bucket) with the
input elements before and after padding, and pushes that snapshot here (``POST /jobs/{id}/traffic``,
``flexdsa traffic push``). Each push is one ``job_traffic`` row; reads add them up.

From the summed traffic the Shape Tracker's planner (``choose_traffic_buckets``) proposes at most K buckets
minimising the expected cost per request under the target's cost model, and the same cost function prices
the bundle's current buckets and the target's default ones on the same traffic, so the three compare
(``proposal``). ``respecialise`` compiles the proposal (or buckets the caller gives) as a new job on the
same stored model: the next ``bundle_version``, linked by ``parent_job_id``, compiled against the same
kernel cache (a bucket the old version had costs only cache hits). A job with ``auto_respecialise_waste`` set
does so by itself after a push that leaves the traffic's padding waste above it (in input elements, as the
runtime measured it; at least ``AUTO_MIN_REQUESTS`` requests, once per version).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections import Counter, OrderedDict
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from flexdsa_core import RequestSpec
from flexdsa_core.errors import FlexDSAError
from service.core.body_limit import TRAFFIC_LIMIT
from service.core.config import Settings
from service.core.errors import Conflict, InvalidRequest, PayloadTooLarge
from service.core.input_checks import check_spec_json
from service.core.models import Artifact, Job, JobStatus, JobTraffic, Tenant
from service.jobs import service as jobs
from service.storage.store import ArtifactStore
from service.traffic.schemas import RespecialiseIn, TrafficIn, TrafficPolicyIn

log = logging.getLogger("flexdsa.service")

# A push is at most 4096 entries of a few dims each: well under this many bytes of JSON.
MAX_BODY_BYTES = TRAFFIC_LIMIT
AUTO_MIN_REQUESTS = 100
# A job's pushes are folded into one row past this many, keeping at most this many distinct (dims, bucket).
FOLD_AFTER_PUSHES = 32
MAX_FOLDED_SHAPES = 16384
DEFAULT_MAX_BUCKETS = 3
MANIFEST = "manifest.json"
# The proposal specialises the model once per distinct traffic value in the API process (a BERT-base, 435 MB:
# 15 s and about twice its size in memory); past this, the caller gives the buckets.
PROPOSAL_MAX_MODEL_BYTES = 1 << 30
MANIFEST_MAX_BYTES = 16 * 1024 * 1024


# --- reading a push -------------------------------------------------------------------------------------


def parse_push(raw: bytes) -> TrafficIn:
    """The body of ``POST /jobs/{id}/traffic``, refused with 413 past ``MAX_BODY_BYTES`` and 422 when invalid."""
    if len(raw) > MAX_BODY_BYTES:
        raise PayloadTooLarge(
            f"A traffic push is at most {MAX_BODY_BYTES} bytes; push more often (the runtime's snapshot holds "
            "at most 4096 entries).",
            details={"limit": MAX_BODY_BYTES},
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequest("The traffic body is not UTF-8 JSON.", code="invalid_traffic") from None
    try:  # the spec's edge rules: no control characters (PostgreSQL refuses NUL in JSON), int64, finite numbers
        check_spec_json(text)
    except InvalidRequest as err:
        raise InvalidRequest(
            "The traffic body" + err.message.removeprefix("spec"), code="invalid_traffic", details=err.details
        ) from None
    try:
        return TrafficIn.model_validate_json(text)
    except ValidationError as err:
        details = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
            for e in err.errors(include_url=False)
        ]
        raise InvalidRequest(
            "The body is not a traffic snapshot (flexdsa_runtime's Traffic.snapshot()); see details.",
            code="invalid_traffic",
            details=details,
        ) from None


def _succeeded(job: Job, doing: str) -> None:
    if job.status != JobStatus.succeeded:
        raise Conflict(
            f"Job {job.id} is {job.status}: {doing} needs a succeeded job (its bundle).",
            code="job_not_finished",
        )


def manifest_of(session: Session, store: ArtifactStore, job: Job) -> dict[str, Any]:
    """The job's ``manifest.json``; 409 when the bundle predates the deploy contract (no run-time section)."""
    row = session.scalar(select(Artifact).where(Artifact.job_id == job.id, Artifact.name == MANIFEST))
    if row is None or row.size > MANIFEST_MAX_BYTES:
        raise Conflict(f"Job {job.id} has no {MANIFEST}.", code="no_manifest")
    manifest = json.loads(store.read_bytes(row.blob_key))
    if "runtime" not in manifest:
        raise Conflict(
            f"Job {job.id}'s bundle predates the run-time contract (its manifest has no 'runtime' section): "
            "submit the model again to deploy it with flexdsa_runtime.",
            code="no_runtime_manifest",
        )
    return manifest


def _check_against_bundle(payload: TrafficIn, manifest: dict[str, Any]) -> None:
    dims = set(manifest["runtime"].get("dims") or {})
    buckets = {b["name"] for b in manifest["buckets"]}
    for index, entry in enumerate(payload.entries):
        if set(entry.dims) != dims:
            raise InvalidRequest(
                f"entries[{index}] gives dims {sorted(entry.dims)}; this bundle's dynamic dims are {sorted(dims)}. "
                "Push the traffic of this job's bundle (flexdsa_runtime counts exactly these).",
                code="invalid_traffic",
                details={"entry": index, "dims": sorted(entry.dims), "expected": sorted(dims)},
            )
        bad = [name for name, value in entry.dims.items() if not 1 <= value <= 2**31 - 1]
        if bad:
            raise InvalidRequest(f"entries[{index}] dim {bad[0]!r} must be >= 1.", code="invalid_traffic")
        if entry.bucket is not None and entry.bucket not in buckets:
            raise InvalidRequest(
                f"entries[{index}] names bucket {entry.bucket!r}, which this job's bundle does not have "
                f"({', '.join(sorted(buckets))}): is the runtime serving another version?",
                code="invalid_traffic",
                details={"entry": index, "bucket": entry.bucket},
            )


# --- storing and summing ----------------------------------------------------------------------------------


def record_push(
    session: Session, settings: Settings, store: ArtifactStore, tenant: Tenant, job: Job, payload: TrafficIn
) -> dict[str, Any]:
    """Store one push; then, past the job's waste threshold, start the next version by itself."""
    _succeeded(job, "recording traffic")
    manifest = manifest_of(session, store, job)
    _check_against_bundle(payload, manifest)
    requests = sum(entry.count for entry in payload.entries) + payload.dropped
    session.add(
        JobTraffic(
            job_id=job.id,
            tenant_id=tenant.id,
            bundle_version=payload.bundle_version,
            requests=requests,
            dropped=payload.dropped,
            entries=[entry.model_dump() for entry in payload.entries],
        )
    )
    session.flush()
    rows = _fold_if_many(session, job)
    session.commit()
    totals = _aggregate(rows)
    auto = _maybe_auto(session, settings, store, tenant, job, totals)
    return {
        "job_id": job.id,
        "stored_entries": len(payload.entries),
        "requests": totals["requests"],
        "padding_waste": totals["padding_waste"],
        "auto_respecialised_job_id": auto.id if auto is not None else None,
    }


def _fold_if_many(session: Session, job: Job) -> list[JobTraffic]:
    """The job's traffic rows; past ``FOLD_AFTER_PUSHES`` of them, folded into one (under a lock on the job's
    row, so two API processes never fold the same pushes twice). A job's traffic is then at most
    ``FOLD_AFTER_PUSHES`` rows of at most ``MAX_ENTRIES`` entries and one of at most ``MAX_FOLDED_SHAPES``:
    what a read sums is bounded however long the deployment pushes."""
    rows = _rows(session, job)
    if len(rows) <= FOLD_AFTER_PUSHES:
        return rows
    session.execute(select(Job.id).where(Job.id == job.id).with_for_update())
    rows = _rows(session, job)
    if len(rows) <= FOLD_AFTER_PUSHES:  # another process folded them while this one waited
        return rows
    entries, overflow = _folded_entries(rows)
    folded = JobTraffic(
        job_id=job.id,
        tenant_id=rows[-1].tenant_id,
        bundle_version=rows[-1].bundle_version,
        requests=sum(row.requests for row in rows),
        dropped=sum(row.dropped for row in rows) + overflow,
        entries=entries,
        pushes=sum(row.pushes or 1 for row in rows),
    )
    for row in rows:
        session.delete(row)
    session.add(folded)
    session.flush()
    return [folded]


def _folded_entries(rows: list[JobTraffic]) -> tuple[list[dict[str, Any]], int]:
    """Every row's entries added up per (dims, bucket), the ``MAX_FOLDED_SHAPES`` most requested kept; the
    requests of the rest are returned to be counted as dropped (as the runtime counts shapes past its bound)."""
    summed: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        for entry in row.entries:
            key = (tuple(sorted(entry["dims"].items())), entry.get("bucket"))
            total = summed.setdefault(
                key, {"dims": dict(key[0]), "bucket": key[1], "count": 0, "elements": 0, "padded_elements": 0}
            )
            for field in ("count", "elements", "padded_elements"):
                total[field] += entry.get(field, 0)
    ranked = sorted(summed.values(), key=lambda entry: entry["count"], reverse=True)
    return ranked[:MAX_FOLDED_SHAPES], sum(entry["count"] for entry in ranked[MAX_FOLDED_SHAPES:])


def _rows(session: Session, job: Job) -> list[JobTraffic]:
    return list(
        session.scalars(select(JobTraffic).where(JobTraffic.job_id == job.id).order_by(JobTraffic.id))
    )


def _aggregate(rows: list[JobTraffic]) -> dict[str, Any]:
    """Every push added up: per distinct shape its count, elements, padded elements and buckets."""
    shapes: dict[tuple, dict[str, Any]] = {}
    dropped = 0
    for row in rows:
        dropped += row.dropped
        for entry in row.entries:
            key = tuple(sorted(entry["dims"].items()))
            shape = shapes.setdefault(
                key,
                {"dims": dict(key), "count": 0, "elements": 0, "padded_elements": 0, "buckets": Counter()},
            )
            shape["count"] += entry["count"]
            shape["elements"] += entry.get("elements", 0)
            shape["padded_elements"] += entry.get("padded_elements", 0)
            shape["buckets"][entry.get("bucket")] += entry["count"]
    served = [s for s in shapes.values() if any(b is not None for b in s["buckets"])]
    real = sum(s["elements"] for s in served if None not in s["buckets"])
    padded = sum(s["padded_elements"] for s in served if None not in s["buckets"])
    refused = sum(s["buckets"].get(None, 0) for s in shapes.values())
    requests = sum(s["count"] for s in shapes.values())
    return {
        "shapes": shapes,
        "requests": requests + dropped,
        "served": requests - refused,
        "refused": refused,
        "dropped": dropped,
        "pushes": sum(row.pushes or 1 for row in rows),
        "padding_waste": (padded - real) / real if real else 0.0,
    }


def traffic_summary(session: Session, store: ArtifactStore, job: Job) -> dict[str, Any]:
    """What the job's deployments served: per shape, per bucket, per dim value, and the padding waste."""
    manifest = manifest_of(session, store, job)
    totals = _aggregate(_rows(session, job))
    dims = list(manifest["runtime"].get("dims") or {})
    per_bucket: Counter = Counter()
    histogram: dict[str, Counter] = {dim: Counter() for dim in dims}
    shapes = []
    for shape in sorted(totals["shapes"].values(), key=lambda s: tuple(s["dims"].get(d, 0) for d in dims)):
        for bucket, count in shape["buckets"].items():
            per_bucket[bucket] += count
        for dim in dims:
            histogram[dim][shape["dims"].get(dim)] += shape["count"]
        waste = (
            (shape["padded_elements"] - shape["elements"]) / shape["elements"] if shape["elements"] else 0.0
        )
        shapes.append(
            {
                "dims": shape["dims"],
                "count": shape["count"],
                "buckets": {str(b): n for b, n in shape["buckets"].items()},
                "padding_waste": waste if None not in shape["buckets"] else None,
            }
        )
    return {
        "job_id": job.id,
        **{k: totals[k] for k in ("requests", "served", "refused", "dropped", "pushes", "padding_waste")},
        "dims": dims,
        "buckets": [
            {"name": b["name"], "dims": b.get("dims", {}), "requests": per_bucket.get(b["name"], 0)}
            for b in manifest["buckets"]
        ],
        "shapes": shapes,
        "histogram": {
            dim: [{"value": v, "count": n} for v, n in sorted(counts.items()) if v is not None]
            for dim, counts in histogram.items()
        },
    }


# --- the proposal -----------------------------------------------------------------------------------------

_proposals: OrderedDict[str, dict[str, Any]] = OrderedDict()
_proposals_lock = threading.Lock()
PROPOSAL_CACHE_ENTRIES = 32


def proposal(
    session: Session, store: ArtifactStore, job: Job, max_buckets: int | None = None, allow_narrower: bool = False
) -> dict[str, Any]:
    """Buckets chosen from the job's traffic, and the expected cost per request and padding waste of the
    current, the target's default and the proposed buckets, all priced by the target's cost model
    (``flexdsa_core.respecialise.propose``). Cached per job, push set and ``max_buckets``."""
    _succeeded(job, "a re-specialisation proposal")
    manifest = manifest_of(session, store, job)
    rows = _rows(session, job)
    if not rows:
        raise Conflict(
            f"Job {job.id} has no traffic yet: push the runtime's snapshot (POST /jobs/{job.id}/traffic or "
            "`flexdsa traffic push`) first.",
            code="no_traffic",
        )
    if job.model_size > PROPOSAL_MAX_MODEL_BYTES:
        raise Conflict(
            f"The model is {job.model_size / 2**30:.1f} GiB: the API does not load models over "
            f"{PROPOSAL_MAX_MODEL_BYTES // 2**30} GiB to price a proposal. Give the buckets yourself (POST "
            f"/jobs/{job.id}/respecialise with shape_buckets), or run flexdsa_core.respecialise.propose locally.",
            code="model_too_large_to_propose",
        )
    k = max_buckets or job.respecialise_max_buckets or DEFAULT_MAX_BUCKETS
    digest = hashlib.sha256(f"{job.id}|{k}|{allow_narrower}|{[r.id for r in rows]}".encode()).hexdigest()
    with _proposals_lock:
        if digest in _proposals:
            _proposals.move_to_end(digest)
            return _proposals[digest]
    found = _propose(store, job, manifest, _aggregate(rows), k, allow_narrower)
    with _proposals_lock:
        _proposals[digest] = found
        while len(_proposals) > PROPOSAL_CACHE_ENTRIES:
            _proposals.popitem(last=False)
    return found


def _propose(
    store: ArtifactStore, job: Job, manifest: dict, totals: dict, k: int, allow_narrower: bool
) -> dict[str, Any]:
    import onnx
    import onnx_ir as ir

    from flexdsa_core.respecialise import propose

    spec = RequestSpec.model_validate(job.spec)
    model = ir.from_proto(onnx.load_from_string(store.read_bytes(job.model_blob_key)))
    observed = [(dict(shape["dims"]), shape["count"]) for shape in totals["shapes"].values()]
    exact = [
        d for d, rule in (manifest["runtime"].get("padding") or {}).items() if rule.get("tolerated") is False
    ]
    try:
        found = propose(
            model,
            spec.target_spec(),
            observed,
            manifest["buckets"],
            k,
            input_shapes=spec.input_shapes,
            exact_dims=exact,
            allow_narrower=allow_narrower,
            anchor=figure_anchor(job),
        )
    except FlexDSAError as err:
        raise InvalidRequest(err.message, code=err.code, details=err.details) from None
    return {"job_id": job.id, **found, "requests": totals["requests"]}


def figure_anchor(job: Job) -> dict[str, Any] | None:
    """The job's latency figure for its headline bucket, with the dims it is for: what the proposal's expected
    costs are scaled to, so that they are in the job's own terms (``flexdsa_core.respecialise``). None for a
    job recorded before figures were kept, or one with no latency figure."""
    figures = (job.report_summary or {}).get("figures") or {}
    bucket = figures.get("bucket")
    found = (figures.get("per_bucket") or {}).get(bucket) or {}
    latency = found.get("latency") or {}
    if latency.get("seconds") is None:
        return None
    return {"bucket": bucket, "dims": found.get("dims") or {}, "seconds": latency["seconds"],
            "complete": latency.get("complete", True), "label": latency.get("label")}  # fmt: skip


# --- re-specialising --------------------------------------------------------------------------------------


def respecialise(
    session: Session,
    settings: Settings,
    store: ArtifactStore,
    tenant: Tenant,
    job: Job,
    request: RespecialiseIn,
    *,
    automatic: bool = False,
) -> Job:
    """A new version of the job's bundle, compiled for the proposal's buckets (or ``request.shape_buckets``)."""
    _succeeded(job, "re-specialisation")
    manifest = manifest_of(session, store, job)
    dims = set(manifest["runtime"].get("dims") or {})
    if request.shape_buckets is not None:
        if set(request.shape_buckets) != dims:
            raise InvalidRequest(
                f"shape_buckets names {sorted(request.shape_buckets)}; this model's dynamic dims are {sorted(dims)}.",
                code="invalid_options",
            )
        bad = {
            d: v for d, v in request.shape_buckets.items() if not v or any(not 1 <= x <= 2**31 - 1 for x in v)
        }
        if bad:
            raise InvalidRequest(
                f"shape_buckets {bad}: give at least one size per dim, each >= 1.", code="invalid_options"
            )
        if math.prod(len(set(v)) for v in request.shape_buckets.values()) > 64:
            raise InvalidRequest(
                "shape_buckets make more than 64 buckets; give fewer values.", code="invalid_options"
            )
        if not request.allow_narrower:
            _refuse_narrower(manifest, request.shape_buckets)
        chosen, why = request.shape_buckets, "buckets given in the request"
    else:
        found = proposal(session, store, job, request.max_buckets, request.allow_narrower)
        chosen = found["proposed"]["buckets"]
        if not found["gain"]["changes_buckets"]:
            raise Conflict(
                f"The traffic of job {job.id} is already served by its buckets {chosen}: nothing to re-specialise.",
                code="no_change",
                details={"buckets": chosen},
            )
        why = (
            f"{found['requests']} requests of traffic: expected cost {_ratio_text(found['gain']['cost_vs_current'])} "
            f"of the current buckets', padding waste {found['gain']['waste_current']:.1%} -> "
            f"{found['gain']['waste_proposed']:.1%}"
        )
    spec_data = {
        **job.spec,
        "shape_buckets": {d: sorted(set(v)) for d, v in chosen.items()},
        "observed_shapes": None,
    }
    try:
        spec = RequestSpec.model_validate(spec_data)
    except ValidationError as err:
        raise InvalidRequest(
            "The re-specialised spec is invalid; see details.",
            code="invalid_spec",
            details=[{"loc": list(e["loc"]), "msg": e["msg"]} for e in err.errors(include_url=False)],
        ) from None
    how = "automatically (padding waste past the job's threshold)" if automatic else "on request"
    message = f"Re-specialised {how} from job {job.id} (version {job.bundle_version}): {why}."
    child = jobs.create_derived_job(session, settings, tenant, job, spec, message)
    job.record("respecialised", f"Version {child.bundle_version}: job {child.id} ({how}).")
    session.commit()
    if child.status == JobStatus.queued:
        jobs.enqueue(child.id, settings)
    return child


def _refuse_narrower(manifest: dict, buckets: dict[str, list[int]]) -> None:
    """Given buckets that reach less far than the bundle's current ones in some dim: 422 naming what would be
    lost, unless the request allows it."""
    reach: dict[str, int] = {}
    for bucket in manifest["buckets"]:
        for dim, value in (bucket.get("dims") or {}).items():
            reach[dim] = max(reach.get(dim, value), value)
    lost = {d: (max(values), reach[d]) for d, values in buckets.items() if d in reach and max(values) < reach[d]}
    if lost:
        raise InvalidRequest(
            "shape_buckets serve less than the current version: "
            + ", ".join(f"{d} up to {new} (the current version serves up to {old}: {d} {new + 1}-{old} would be "
                        "refused)" for d, (new, old) in lost.items())
            + ". Add the larger value, or send allow_narrower: true to accept it.",
            code="narrower_buckets",
            details={"lost": {d: {"proposed": new, "current": old} for d, (new, old) in lost.items()}},
        )  # fmt: skip


def _ratio_text(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def _maybe_auto(
    session: Session, settings: Settings, store: ArtifactStore, tenant: Tenant, job: Job, totals: dict
) -> Job | None:
    threshold = job.auto_respecialise_waste
    if threshold is None or totals["requests"] < AUTO_MIN_REQUESTS:
        return None
    if totals["padding_waste"] <= threshold and not totals["refused"]:
        return None
    if not _auto_due(job.id):
        return None
    has_child = session.scalar(
        select(func.count())
        .select_from(Job)
        .where(Job.parent_job_id == job.id, Job.status.in_(["queued", "running", "succeeded"]))
    )
    if has_child:
        return None
    try:
        return respecialise(session, settings, store, tenant, job, RespecialiseIn(), automatic=True)
    except Conflict as err:  # no better buckets, or over quota: the push itself still succeeded
        log.info("job %s: automatic re-specialisation skipped: %s", job.id, err.message)
        return None


# A push past the threshold tries an automatic re-specialisation (the proposal loads the model) at most this
# often per job and API process: a deployment pushing every second must not reload the model every second.
AUTO_INTERVAL_S = 600
_auto_tried: dict[str, float] = {}
_auto_lock = threading.Lock()


def _auto_due(job_id: str, now: float | None = None) -> bool:
    """True at most once per ``AUTO_INTERVAL_S`` for ``job_id`` (and then noted)."""
    now = time.monotonic() if now is None else now
    with _auto_lock:
        for stale in [key for key, when in _auto_tried.items() if now - when >= AUTO_INTERVAL_S]:
            del _auto_tried[stale]
        if job_id in _auto_tried:
            return False
        _auto_tried[job_id] = now
        return True


def set_policy(session: Session, job: Job, request: TrafficPolicyIn) -> dict[str, Any]:
    job.auto_respecialise_waste = request.auto_respecialise_waste
    job.respecialise_max_buckets = request.max_buckets
    session.commit()
    return {
        "job_id": job.id,
        "auto_respecialise_waste": job.auto_respecialise_waste,
        "max_buckets": job.respecialise_max_buckets,
    }


# --- versions ---------------------------------------------------------------------------------------------


def lineage(session: Session, job: Job) -> list[Job]:
    """Every version of the job's bundle (its ancestors, itself and their descendants), oldest first."""
    root = job
    seen = {job.id}
    while root.parent_job_id is not None:
        parent = session.get(Job, root.parent_job_id)
        if parent is None or parent.tenant_id != job.tenant_id or parent.id in seen:
            break
        seen.add(parent.id)
        root = parent
    found = [root]
    frontier = [root.id]
    while frontier:
        children = list(
            session.scalars(
                select(Job).where(Job.parent_job_id.in_(frontier), Job.tenant_id == job.tenant_id)
            )
        )
        children = [c for c in children if c.id not in {f.id for f in found}]
        found.extend(children)
        frontier = [c.id for c in children]
    return sorted(found, key=lambda j: (j.bundle_version or 1, j.created_at))


def version_buckets(session: Session, store: ArtifactStore, job: Job) -> list[dict[str, Any]] | None:
    try:
        return [
            {"name": b["name"], "dims": b.get("dims", {})}
            for b in manifest_of(session, store, job)["buckets"]
        ]
    except (Conflict, ValueError, OSError, KeyError):
        return None
