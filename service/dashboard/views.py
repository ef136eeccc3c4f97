"""What the dashboard's templates show, read from the database and the artifact store: one plain dict per
page, built from a job row, its events, its JSON artifacts (``report.json``, ``fusion_plan.json``,
``manifest.json``) and its models; the incidents for operators; the upload form's choices.

Nothing here knows about HTTP: the routes in ``service/dashboard/routes.py`` decide who may see what and hand
these dicts to the templates. A broken or unexpected artifact never takes a page down: it is logged and
left out. The graph pictures come from ``service.dashboard.graph_layout``, cached here by blob key.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from threading import Lock
from typing import Any
from urllib.parse import quote

from sqlalchemy import select
from sqlalchemy.orm import Session

from flexdsa_core.figures import figures_of
from service.core.models import Artifact, Incident, Job, JobEvent, Tenant
from service.dashboard.graph_layout import render_graph
from service.dashboard.layer_chart import layer_charts
from service.jobs import service as jobs
from service.jobs.schemas import JobStatusName
from service.storage.store import ArtifactStore

log = logging.getLogger("flexdsa.service")

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
# Above this the graph view is skipped: the model is not even read.
GRAPH_MAX_BYTES = 256 * 1024 * 1024
REPORT_MAX_BYTES = 32 * 1024 * 1024
SVG_CACHE_ENTRIES = 32


# --- the job list -----------------------------------------------------------------------------------------


def job_list_view(
    session: Session,
    tenant: Tenant,
    root: str,
    *,
    status: JobStatusName | None,
    cursor: str | None,
    limit: int,
) -> dict[str, Any]:
    """Everything jobs.html shows but the upload form: one page of this tenant's jobs."""
    rows, total, next_cursor = jobs.list_jobs(
        session, tenant, status=status, target=None, limit=limit, offset=0, cursor=cursor
    )
    return {
        "tenant": tenant.name,
        "jobs": [jobs.job_out(job, root) for job in rows],
        "total": total,
        "status": status,
        "statuses": STATUSES,
        "next_cursor": next_cursor,
        "limit": limit,
    }


# The target the form starts on: the one that runs here, measured, and needs nothing installed.
DEFAULT_TARGET = "cpu-ort"


def upload_form(max_upload_bytes: int) -> dict[str, Any]:
    """The upload form's choices: targets (int8-only ones marked: the form offers synthetic calibration when
    one is chosen), the default target, switchable fusion rules, the size limit."""
    targets = _targets()
    int8_only = [t["name"] for t in targets if t["int8_only"]]
    return {
        "targets": targets,
        "default_target": DEFAULT_TARGET,
        "int8_only_names": int8_only,
        "show_synthetic": DEFAULT_TARGET in int8_only,
        "rules": _rule_names(),
        "max_upload_mb": max_upload_bytes // (1024 * 1024),
    }


def _targets() -> list[dict]:
    """The built-in targets, as GET /targets lists them."""
    from flexdsa_core import list_targets
    from flexdsa_core.precision.formats import int8_only

    try:
        return [
            {"name": t.name, "vendor": t.vendor, "description": t.description, "int8_only": int8_only(t)}
            for t in list_targets()
        ]
    except Exception:
        log.exception("dashboard: cannot list targets")
        return []


def _rule_names() -> list[str]:
    """Fusion rules a request may switch off (GET /targets/{name} lists the same)."""
    try:
        from flexdsa_core.fusions import discover_rules

        return sorted(rule.name for rule in discover_rules())
    except Exception:
        log.exception("dashboard: cannot list fusion rules")
        return []


# --- one job ----------------------------------------------------------------------------------------------


def job_view(session: Session, store: ArtifactStore, job: Job, root: str) -> dict[str, Any]:
    """Everything job.html shows, read from the job row, its events and its JSON artifacts."""
    artifacts = list(
        session.scalars(select(Artifact).where(Artifact.job_id == job.id).order_by(Artifact.name))
    )
    events = list(session.scalars(select(JobEvent).where(JobEvent.job_id == job.id).order_by(JobEvent.id)))
    by_name = {a.name: a for a in artifacts}
    report = _read_json(store, by_name.get("report.json"))
    fusion_plan = _read_json(store, by_name.get("fusion_plan.json"))
    manifest = _read_json(store, by_name.get("manifest.json"))
    view: dict[str, Any] = {
        "job": jobs.job_out(job, root),
        "events": events,
        "artifacts": [
            {
                "name": a.name,
                "size": a.size,
                "content_type": a.content_type,
                "url": f"{root}/jobs/{job.id}/artifacts/{quote(a.name)}",
            }
            for a in artifacts
        ],
        "report": report,
        "spec_json": json.dumps(job.spec, indent=2, sort_keys=True),
        "incident_id": _incident_id(job.error),
    }
    if report:
        view.update(_report_view(report, fusion_plan))
    if job.status == "succeeded":
        view["graphs"] = _graph_views(store, job, by_name, manifest, report)
    return view


def _incident_id(error: dict | None) -> str | None:
    details = (error or {}).get("details") if isinstance(error, dict) else None
    incident = details.get("incident") if isinstance(details, dict) else None
    return incident if isinstance(incident, str) and incident else None


def _read_json(store: ArtifactStore, artifact: Artifact | None) -> dict | None:
    if artifact is None or artifact.size > REPORT_MAX_BYTES:
        return None
    try:
        return json.loads(store.read_bytes(artifact.blob_key))
    except Exception as err:  # a missing blob or odd bytes must not take the page down
        log.warning("dashboard: cannot read %s: %s", artifact.name, err)
        return None


def _report_view(report: dict, fusion_plan: dict | None) -> dict[str, Any]:
    nodes = report.get("nodes") or {}
    before = nodes.get("before") or {}
    after_by_bucket = nodes.get("after") or {}
    bucket, after = next(iter(after_by_bucket.items()), (None, {}))
    ops = sorted(set(before) | set(after), key=lambda op: (-max(before.get(op, 0), after.get(op, 0)), op))
    top = max([*before.values(), *after.values(), 1])
    op_rows = [
        {
            "op": op,
            "before": before.get(op, 0),
            "after": after.get(op, 0),
            "before_pct": round(100 * before.get(op, 0) / top, 1),
            "after_pct": round(100 * after.get(op, 0) / top, 1),
            "changed": before.get(op, 0) != after.get(op, 0),
        }
        for op in ops
    ]
    candidates = _fusion_candidates(report, fusion_plan)
    matched = [c for c in candidates if c.get("matches") or c.get("decision") not in (None, "no match")]
    unmatched = [c for c in candidates if c not in matched]
    # Whatever the platform adapter wrote about partitioning, CPU fallback or legalisation (the keys vary
    # by adapter; an empty section is not shown).
    notes = {
        key: report[key]
        # "partition" is not here: the page shows it as tables (#partition), not as a key/value dump.
        for key in ("fallback", "legalisation", "legalization", "adapter", "target_notes")
        if report.get(key)
    }
    return {
        # The job's one latency, energy and accuracy per bucket, as the report, the API and the CLI give them.
        "figures": figures_of(report),
        "layer_charts": layer_charts(report),
        "node_costs": _node_cost_rows(report),
        "op_rows": op_rows,
        "after_bucket": bucket,
        "other_buckets": list(after_by_bucket)[1:],
        "fusions_matched": matched,
        "fusions_unmatched": unmatched,
        "target_notes": notes,
    }


def _node_cost_rows(report: dict) -> list[dict]:
    """The cost model's node-by-node cost of the original and the optimised graph per bucket (what the Fusion
    Switcher compares and the estimated speed-up divides), as a ratio to the original's: not a latency."""
    rows = []
    for bucket, estimate in ((report.get("estimates") or {}).get("per_bucket") or {}).items():
        before, after = estimate.get("before") or {}, estimate.get("after") or {}
        if not before and not after:
            rows.append({"bucket": bucket, "note": estimate.get("note") or "no estimate"})
            continue
        base = before.get("seconds")
        for side, found in (("original", before), ("optimised", after)):
            relative = found.get("seconds") / base if base and found.get("seconds") is not None else None
            rows.append({"bucket": bucket, "model": side, "flops": found.get("flops"), "bytes": found.get("bytes"),
                         "kernels": found.get("kernels"), "relative": relative, "basis": found.get("basis")})  # fmt: skip
    return rows


def _fusion_candidates(report: dict, fusion_plan: dict | None) -> list[dict]:
    """The Fusion Switcher's candidates, from fusion_plan.json (per bucket) or else the report's copy."""
    if isinstance(fusion_plan, dict) and fusion_plan:
        lines = []
        for bucket, plan in fusion_plan.items():
            if isinstance(plan, dict):
                lines.extend(
                    {"bucket": bucket, **c} for c in plan.get("candidates", []) if isinstance(c, dict)
                )
        if lines:
            return lines
    return [c for c in (report.get("fusions") or {}).get("candidates", []) if isinstance(c, dict)]


# --- the job's graphs, before and after -------------------------------------------------------------------


def _graph_views(
    store: ArtifactStore, job: Job, by_name: dict[str, Artifact], manifest: dict | None, report: dict | None
) -> list:
    optimised = _optimised_model_artifact(by_name, manifest)
    views = [{"title": "Original", "file": job.model_filename, "placed": False,
              **graph_svg(store, job.model_blob_key, job.model_size)}]  # fmt: skip
    if optimised is not None:
        placement = _placement_of(optimised.name, manifest, report)
        views.append({
            "title": f"Optimised ({optimised.name})", "file": optimised.name, "placed": bool(placement),
            **graph_svg(store, optimised.blob_key, optimised.size, placement),
        })  # fmt: skip
    return views


def _placement_of(file: str, manifest: dict | None, report: dict | None) -> dict[str, str] | None:
    """The Subgraph Mapper's device per node name for the bucket whose model is ``file`` (accelerators)."""
    partition = (report or {}).get("partition") if isinstance(report, dict) else None
    if not isinstance(partition, dict) or not partition:
        return None
    buckets = (manifest or {}).get("buckets", []) if isinstance(manifest, dict) else []
    bucket = next((b.get("name") for b in buckets if isinstance(b, dict) and b.get("file") == file), None)
    part = partition.get(bucket) if bucket in partition else next(iter(partition.values()))
    placement = part.get("placement") if isinstance(part, dict) else None
    return placement if isinstance(placement, dict) and placement else None


def _optimised_model_artifact(by_name: dict[str, Artifact], manifest: dict | None) -> Artifact | None:
    for bucket in (manifest or {}).get("buckets", []) if isinstance(manifest, dict) else []:
        artifact = by_name.get(str(bucket.get("file", "")))
        if artifact is not None:
            return artifact
    return next((a for name, a in sorted(by_name.items()) if name.endswith(".onnx")), None)


_svg_cache: OrderedDict[str, dict] = OrderedDict()
_svg_lock = Lock()


def graph_svg(store: ArtifactStore, blob_key: str, size: int, placement: dict[str, str] | None = None) -> dict:
    """``{"svg": Markup | None, "nodes": n, "note": str}`` for the model stored under ``blob_key``, its nodes
    coloured by ``placement`` (node name -> device) when given.

    Blobs are content-addressed, so a rendered SVG stays right for its key (and placement) forever; a few
    are kept.
    """
    cache_key = blob_key
    if placement:
        digest = hashlib.sha256(json.dumps(placement, sort_keys=True).encode()).hexdigest()[:16]
        cache_key = f"{blob_key}|{digest}"
    with _svg_lock:
        if cache_key in _svg_cache:
            _svg_cache.move_to_end(cache_key)
            return _svg_cache[cache_key]
    if size > GRAPH_MAX_BYTES:
        view = {
            "svg": None,
            "nodes": None,
            "note": f"Model larger than {GRAPH_MAX_BYTES >> 20} MB: no graph view.",
        }
    else:
        try:
            view = render_graph(store.read_bytes(blob_key), placement)
        except Exception as err:
            log.warning("dashboard: no graph view for %s: %s", blob_key, err)
            view = {"svg": None, "nodes": None, "note": f"The graph could not be read: {err}"}
    with _svg_lock:
        _svg_cache[cache_key] = view
        while len(_svg_cache) > SVG_CACHE_ENTRIES:
            _svg_cache.popitem(last=False)
    return view


# --- operators: incidents ---------------------------------------------------------------------------------


def incident_list_view(session: Session, limit: int) -> dict[str, Any]:
    """incidents.html: the latest internal errors, newest first, with their tenants' names."""
    rows = list(session.scalars(select(Incident).order_by(Incident.created_at.desc()).limit(limit)))
    return {"incidents": rows, "tenants": _tenant_names(session, rows), "limit": limit}


def incident_view(session: Session, incident: Incident) -> dict[str, Any]:
    """incident.html: one internal error, its job, and the incidents of that job's other attempts."""
    job = session.get(Job, incident.job_id) if incident.job_id else None
    # A job that crashed on every attempt leaves one incident per attempt: an operator compares them.
    siblings = (
        list(
            session.scalars(
                select(Incident).where(Incident.job_id == incident.job_id).order_by(Incident.attempt)
            )
        )
        if incident.job_id
        else [incident]
    )
    return {
        "incident": incident,
        "job": job,
        "tenant_name": _tenant_names(session, [incident]).get(incident.tenant_id),
        "siblings": siblings,
    }


def _tenant_names(session: Session, incidents) -> dict[int, str]:
    ids = {i.tenant_id for i in incidents if i.tenant_id is not None}
    if not ids:
        return {}
    return dict(session.execute(select(Tenant.id, Tenant.name).where(Tenant.id.in_(ids))).all())
