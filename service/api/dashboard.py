"""The web dashboard: server-rendered pages over the same job functions the JSON API uses.

``/``                 this tenant's jobs (filter by status), live progress, and the upload form
``/ui/jobs/{id}``     one job: state, the report (from ``report.json`` and ``fusion_plan.json``), a
                      before/after graph view rendered here as SVG, artifact downloads
``/ui/login``         distributed mode: paste an API key, kept in the ``flexdsa_key`` cookie (httponly)
``/ui/incidents[/{id}]`` operators only: internal errors with their tracebacks, by the id a failed job quotes
``/ui/operator``      paste the operator token, kept in the ``flexdsa_operator`` cookie (httponly, /ui/ only)
``/ui/static/{name}`` the stylesheet and the small script (no build step, nothing fetched from elsewhere)

Every page reads fine with JavaScript off; the script only adds live progress and submits the upload form
(``POST /optimize`` takes the spec as JSON, which a plain HTML form cannot build).

The graph view is a layered layout: each node sits one layer below the deepest node feeding it
(``layer(n) = 1 + max(layer(p) for p in producers(n))``), and within a layer nodes are ordered by the mean
x position of their producers, which keeps most edges short without a real crossing minimisation.
"""

from __future__ import annotations

import html
import json
import logging
from collections import OrderedDict
from pathlib import Path
from threading import Lock
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

from fastapi import APIRouter, Cookie, Form, Header, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from markupsafe import Markup
from sqlalchemy import select

from flexdsa_core import __version__
from service import jobs
from service.api.deps import (
    API_KEY_COOKIE,
    API_KEY_HEADER,
    SessionDep,
    SettingsDep,
    StoreDep,
    bearer_token,
    current_tenant,
    loopback_stands_in_for_operator,
    operator_token_matches,
)
from service.auth import authenticate
from service.errors import Unauthorized
from service.models import Artifact, Incident, Job, JobEvent, Tenant
from service.schemas import JobStatusName
from service.storage import ArtifactStore

log = logging.getLogger("flexdsa.service")

router = APIRouter(include_in_schema=False)

_HERE = Path(__file__).resolve().parent.parent
STATIC_DIR = _HERE / "static"
templates = Jinja2Templates(directory=str(_HERE / "templates"))


def _number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _filesize(size: int | None) -> str:
    if not _number(size):
        return "–"
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def _seconds(value: float | None) -> str:
    if not _number(value):
        return "–"
    if value < 1e-3:
        return f"{value * 1e6:.1f} µs"
    if value < 1:
        return f"{value * 1e3:.3g} ms"
    return f"{value:.2f} s" if value < 120 else f"{value / 60:.1f} min"


def _when(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value is not None else "–"


templates.env.filters.update(filesize=_filesize, seconds=_seconds, when=_when)

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
# Above these the graph view is skipped: the SVG would be unreadable and slow to build.
GRAPH_MAX_NODES = 1500
GRAPH_MAX_BYTES = 256 * 1024 * 1024
REPORT_MAX_BYTES = 32 * 1024 * 1024
COOKIE_MAX_AGE_S = 30 * 24 * 3600


# --- who is asking ----------------------------------------------------------------------------------------


def _tenant_or_none(
    session: SessionDep,
    settings: SettingsDep,
    x_api_key: str | None,
    flexdsa_key: str | None,
) -> Tenant | None:
    """The API's own tenant rule (deps.current_tenant); a page answers a login redirect instead of a 401."""
    try:
        return current_tenant(session, settings, x_api_key, flexdsa_key)
    except Unauthorized:
        return None


def _login_redirect(request: Request) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"{_root(request)}/ui/login?next={quote(target)}", status_code=303)


def _root(request: Request) -> str:
    return request.scope.get("root_path", "")


KeyHeader = Annotated[str | None, Header(alias=API_KEY_HEADER)]
KeyCookie = Annotated[str | None, Cookie(alias=API_KEY_COOKIE)]


OPERATOR_COOKIE = "flexdsa_operator"


def _is_operator(request: Request) -> bool:
    """The API's operator rule (deps.require_operator): the operator token, here as a bearer header or the
    cookie ``/ui/operator`` sets, or, with no token configured, a loopback client in embedded mode. A wrong
    token is no operator: the page reads as missing, exactly as for a tenant."""
    settings = request.app.state.settings
    token = bearer_token(request) or request.cookies.get(OPERATOR_COOKIE)
    return operator_token_matches(settings, token) or loopback_stands_in_for_operator(request, settings)


def _page(request: Request, name: str, status_code: int = 200, **context) -> HTMLResponse:
    settings = request.app.state.settings
    context.update(
        root=_root(request),
        version=__version__,
        mode=settings.mode,
        auth=settings.auth,
        logged_in=API_KEY_COOKIE in request.cookies or OPERATOR_COOKIE in request.cookies,
        operator=_is_operator(request),
    )
    return templates.TemplateResponse(request, name, context, status_code=status_code)


# --- pages ------------------------------------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
def job_list_page(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    x_api_key: KeyHeader = None,
    flexdsa_key: KeyCookie = None,
    status: JobStatusName | None = None,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
):
    tenant = _tenant_or_none(session, settings, x_api_key, flexdsa_key)
    if tenant is None:
        return _login_redirect(request)
    rows, total, next_cursor = jobs.list_jobs(
        session, tenant, status=status, target=None, limit=limit, offset=0, cursor=cursor
    )
    return _page(
        request,
        "jobs.html",
        tenant=tenant.name,
        jobs=[jobs.job_out(job, _root(request)) for job in rows],
        total=total,
        status=status,
        statuses=STATUSES,
        next_cursor=next_cursor,
        limit=limit,
        targets=_targets(),
        rules=_rule_names(),
        max_upload_mb=settings.max_upload_bytes // (1024 * 1024),
    )


@router.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
def job_page(
    request: Request,
    job_id: str,
    session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
    x_api_key: KeyHeader = None,
    flexdsa_key: KeyCookie = None,
):
    tenant = _tenant_or_none(session, settings, x_api_key, flexdsa_key)
    if tenant is None:
        return _login_redirect(request)
    job = session.get(Job, job_id)
    if job is None or job.tenant_id != tenant.id:  # another tenant's job reads exactly as a missing one
        return _page(request, "not_found.html", status_code=404, job_id=job_id, tenant=tenant.name)
    view = job_view(request, session, store, job)
    try:
        return _page(request, "job.html", tenant=tenant.name, **view)
    except Exception:
        # A report of a shape this page does not know must not hide the job: show it without the report.
        log.exception("dashboard: cannot render the report of job %s", job.id)
        view.update(report=None, report_error=True)
        return _page(request, "job.html", tenant=tenant.name, **view)


@router.get("/ui/login", response_class=HTMLResponse)
def login_page(request: Request, next: str = "/"):
    return _page(request, "login.html", next=_safe_next(next), error=None)


@router.post("/ui/login", response_class=HTMLResponse)
def login(
    request: Request,
    session: SessionDep,
    api_key: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "/",
):
    if not _same_origin(request):
        return _page(request, "login.html", status_code=403, next="/", error=CROSS_SITE)
    key = api_key.strip()
    tenant = authenticate(session, key) if key else None
    if tenant is None:
        error = "That key is not valid (unknown, malformed or revoked)." if key else "Paste an API key."
        return _page(request, "login.html", status_code=401, next=_safe_next(next), error=error)
    response = RedirectResponse(_root(request) + _safe_next(next), status_code=303)
    response.set_cookie(
        API_KEY_COOKIE,
        key,
        max_age=COOKIE_MAX_AGE_S,
        httponly=True,
        samesite="lax",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/ui/logout")
def logout(request: Request):
    if not _same_origin(request):
        return _page(request, "login.html", status_code=403, next="/", error=CROSS_SITE)
    response = RedirectResponse(f"{_root(request)}/ui/login", status_code=303)
    response.delete_cookie(API_KEY_COOKIE, path="/", httponly=True, samesite="lax")
    response.delete_cookie(OPERATOR_COOKIE, path=OPERATOR_COOKIE_PATH, httponly=True, samesite="strict")
    return response


CROSS_SITE = "This form was posted from another site; log in from this page instead."


def _same_origin(request: Request) -> bool:
    """A login or logout posted by another site's page is refused (it could swap the visitor's tenant).
    Browsers send Origin on every cross-site POST; a request without one is not from a foreign page."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    # Behind a proxy that rewrites Host, X-Forwarded-Host names the site (a foreign form cannot set it).
    hosts = {request.headers.get("host"), request.headers.get("x-forwarded-host")}
    return urlsplit(origin).netloc in hosts - {None}


def _safe_next(target: str) -> str:
    # Only paths on this site: "//evil.example" or "https://..." would make the login an open redirect.
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


# --- operators: incidents ---------------------------------------------------------------------------------

# The operator cookie opens these pages only: the JSON API keeps taking the token as a bearer header.
OPERATOR_COOKIE_PATH = "/ui/"
INCIDENT_NOT_FOUND = "There is nothing at this address."


def _not_found(request: Request) -> HTMLResponse:
    # One answer for a tenant, a wrong token and an unknown id alike: incident ids cannot be probed.
    return _page(request, "not_found.html", status_code=404, heading="Not found", message=INCIDENT_NOT_FOUND)


@router.get("/ui/incidents", response_class=HTMLResponse)
def incident_list_page(
    request: Request, session: SessionDep, limit: Annotated[int, Query(ge=1, le=500)] = 100
):
    if not _is_operator(request):
        return _not_found(request)
    rows = list(session.scalars(select(Incident).order_by(Incident.created_at.desc()).limit(limit)))
    return _page(request, "incidents.html", incidents=rows, tenants=_tenant_names(session, rows), limit=limit)


@router.get("/ui/incidents/{incident_id}", response_class=HTMLResponse)
def incident_page(request: Request, incident_id: str, session: SessionDep):
    if not _is_operator(request):
        return _not_found(request)
    row = session.get(Incident, incident_id)
    if row is None:
        return _not_found(request)
    job = session.get(Job, row.job_id) if row.job_id else None
    # A job that crashed on every attempt leaves one incident per attempt: an operator compares them.
    siblings = (
        list(session.scalars(select(Incident).where(Incident.job_id == row.job_id).order_by(Incident.attempt)))
        if row.job_id
        else [row]
    )
    return _page(
        request,
        "incident.html",
        incident=row,
        job=job,
        tenant_name=_tenant_names(session, [row]).get(row.tenant_id),
        siblings=siblings,
    )


@router.get("/ui/operator", response_class=HTMLResponse)
def operator_login_page(request: Request, next: str = "/ui/incidents"):
    return _page(request, "operator_login.html", next=_safe_next(next), error=None)


@router.post("/ui/operator", response_class=HTMLResponse)
def operator_login(
    request: Request,
    settings: SettingsDep,
    token: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "/ui/incidents",
):
    if not _same_origin(request):
        return _page(request, "operator_login.html", status_code=403, next="/ui/incidents", error=CROSS_SITE)
    if not operator_token_matches(settings, token.strip()):
        error = (
            "That is not the operator token (FLEXDSA_OPERATOR_TOKEN)."
            if settings.operator_token is not None
            else "No operator token is configured here (FLEXDSA_OPERATOR_TOKEN)."
        )
        return _page(request, "operator_login.html", status_code=401, next=_safe_next(next), error=error)
    response = RedirectResponse(_root(request) + _safe_next(next), status_code=303)
    response.set_cookie(
        OPERATOR_COOKIE,
        token.strip(),
        max_age=COOKIE_MAX_AGE_S,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=OPERATOR_COOKIE_PATH,
    )
    return response


def _tenant_names(session, incidents) -> dict[int, str]:
    ids = {i.tenant_id for i in incidents if i.tenant_id is not None}
    if not ids:
        return {}
    return dict(session.execute(select(Tenant.id, Tenant.name).where(Tenant.id.in_(ids))).all())


_STATIC_TYPES = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml"}


@router.get("/ui/static/{name}")
def static_file(name: str) -> Response:
    path = STATIC_DIR / name
    # Only the files that sit directly in static/, by their plain name: no path ever leaves the folder.
    if "/" in name or name.startswith(".") or path.suffix not in _STATIC_TYPES or not path.is_file():
        return Response("Not found", status_code=404, media_type="text/plain")
    return FileResponse(path, media_type=_STATIC_TYPES[path.suffix], headers={"Cache-Control": "no-cache"})


# --- the job page's data ----------------------------------------------------------------------------------


def job_view(request: Request, session, store: ArtifactStore, job: Job) -> dict[str, Any]:
    """Everything job.html shows, read from the job row, its events and its JSON artifacts."""
    root = _root(request)
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
        view["graphs"] = _graph_views(store, job, by_name, manifest)
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
        for key in ("partition", "fallback", "legalisation", "legalization", "adapter", "target_notes")
        if report.get(key)
    }
    return {
        "op_rows": op_rows,
        "after_bucket": bucket,
        "other_buckets": list(after_by_bucket)[1:],
        "fusions_matched": matched,
        "fusions_unmatched": unmatched,
        "target_notes": notes,
    }


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


# --- graph view -------------------------------------------------------------------------------------------


def _graph_views(store: ArtifactStore, job: Job, by_name: dict[str, Artifact], manifest: dict | None) -> list:
    optimised = _optimised_model_artifact(by_name, manifest)
    sides = [("Original", job.model_blob_key, job.model_size, job.model_filename)]
    if optimised is not None:
        sides.append((f"Optimised ({optimised.name})", optimised.blob_key, optimised.size, optimised.name))
    return [
        {"title": title, "file": filename, **graph_svg(store, blob_key, size)}
        for title, blob_key, size, filename in sides
    ]


def _optimised_model_artifact(by_name: dict[str, Artifact], manifest: dict | None) -> Artifact | None:
    for bucket in (manifest or {}).get("buckets", []) if isinstance(manifest, dict) else []:
        artifact = by_name.get(str(bucket.get("file", "")))
        if artifact is not None:
            return artifact
    return next((a for name, a in sorted(by_name.items()) if name.endswith(".onnx")), None)


_svg_cache: OrderedDict[str, dict] = OrderedDict()
_svg_lock = Lock()
SVG_CACHE_ENTRIES = 32


def graph_svg(store: ArtifactStore, blob_key: str, size: int) -> dict:
    """``{"svg": Markup | None, "nodes": n, "note": str}`` for the model stored under ``blob_key``.

    Blobs are content-addressed, so a rendered SVG stays right for its key forever; a few are kept.
    """
    with _svg_lock:
        if blob_key in _svg_cache:
            _svg_cache.move_to_end(blob_key)
            return _svg_cache[blob_key]
    if size > GRAPH_MAX_BYTES:
        view = {
            "svg": None,
            "nodes": None,
            "note": f"Model larger than {GRAPH_MAX_BYTES >> 20} MB: no graph view.",
        }
    else:
        try:
            view = _render_graph(store.read_bytes(blob_key))
        except Exception as err:
            log.warning("dashboard: no graph view for %s: %s", blob_key, err)
            view = {"svg": None, "nodes": None, "note": f"The graph could not be read: {err}"}
    with _svg_lock:
        _svg_cache[blob_key] = view
        while len(_svg_cache) > SVG_CACHE_ENTRIES:
            _svg_cache.popitem(last=False)
    return view


BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 128, 24, 14, 30, 12
# Ops that only compute shapes or move data: drawn pale, so the compute ops stand out.
SHAPE_OPS = frozenset(
    "Shape Gather Unsqueeze Squeeze Concat Reshape Slice Cast Expand Range ConstantOfShape Flatten "
    "Identity Transpose Split Where Equal Size".split()
)


def _render_graph(data: bytes) -> dict:
    import onnx

    model = onnx.load_model_from_string(data)
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    hidden = len(model.graph.node) - len(nodes)
    if len(nodes) > GRAPH_MAX_NODES:
        return {"svg": None, "nodes": len(nodes), "note": f"{len(nodes)} nodes: too many to draw here."}
    layers, preds = _layer_nodes(nodes)
    positions = _place(layers, preds)
    svg = _draw(nodes, layers, preds, positions)
    note = f"{len(nodes)} nodes" + (f"; {hidden} Constant nodes not drawn" if hidden else "")
    note += ". Hover a box for its name, inputs and outputs."
    return {"svg": svg, "nodes": len(nodes), "note": note}


def _layer_nodes(nodes) -> tuple[list[list[int]], list[list[int]]]:
    producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    preds = [
        sorted({producer[x] for x in node.input if x in producer and producer[x] != i})
        for i, node in enumerate(nodes)
    ]
    # Kahn's order, so a file whose nodes are not topologically sorted still lays out; a cycle (invalid
    # ONNX) leaves its nodes on layer 0 rather than looping.
    users: list[list[int]] = [[] for _ in nodes]
    waiting = [len(p) for p in preds]
    for i, p in enumerate(preds):
        for j in p:
            users[j].append(i)
    order = [i for i, w in enumerate(waiting) if w == 0]
    depth = [0] * len(nodes)
    for i in order:  # order grows while it is walked
        for user in users[i]:
            depth[user] = max(depth[user], depth[i] + 1)
            waiting[user] -= 1
            if waiting[user] == 0:
                order.append(user)
    # A node fed only by graph inputs or initializers (a Shape, a Gather of an embedding) would otherwise
    # crowd layer 0: draw it just above its first user instead.
    for i in reversed(order):
        if not preds[i] and users[i]:
            depth[i] = max(0, min(depth[u] for u in users[i]) - 1)
    layers: list[list[int]] = [[] for _ in range(max(depth, default=-1) + 1)]
    placed = set(order)
    for i in order + [i for i in range(len(nodes)) if i not in placed]:
        layers[depth[i]].append(i)
    return layers, preds


def _place(layers: list[list[int]], preds: list[list[int]]) -> dict[int, tuple[float, float]]:
    """Each node as near as it can get to the mean x of its producers, pushed right to avoid overlap."""
    positions: dict[int, tuple[float, float]] = {}
    step = BOX_W + GAP_X
    for depth, layer in enumerate(layers):
        wanted = {}
        for slot, i in enumerate(layer):
            xs = [positions[p][0] for p in preds[i] if p in positions]
            wanted[i] = sum(xs) / len(xs) if xs else PAD + slot * step
        x = PAD - step
        for i in sorted(layer, key=lambda i: wanted[i]):
            x = max(wanted[i], x + step)
            positions[i] = (x, PAD + depth * (BOX_H + GAP_Y))
    return positions


def _box_class(node) -> str:
    if node.domain not in ("", "ai.onnx"):
        return "op fused"
    return "op shape" if node.op_type in SHAPE_OPS else "op"


def _draw(nodes, layers, preds, positions) -> Markup:
    width = max((x for x, _ in positions.values()), default=0) + BOX_W + PAD
    height = len(layers) * (BOX_H + GAP_Y) - GAP_Y + 2 * PAD
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img">'
    ]
    for i, p in enumerate(preds):
        x2, y2 = positions[i][0] + BOX_W / 2, positions[i][1]
        for j in p:
            x1, y1 = positions[j][0] + BOX_W / 2, positions[j][1] + BOX_H
            bend = (y2 - y1) / 2
            parts.append(
                f'<path class="edge" d="M{x1:.0f},{y1:.0f} C{x1:.0f},{y1 + bend:.0f} {x2:.0f},{y2 - bend:.0f} {x2:.0f},{y2:.0f}"/>'
            )
    for i, node in enumerate(nodes):
        x, y = positions[i]
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.op_type}"
        label = op if len(op) <= 18 else op[:17] + "…"
        tip = (
            f"{node.domain + '::' if node.domain else ''}{node.op_type} {node.name}\n"
            f"in: {', '.join(node.input)}\nout: {', '.join(node.output)}"
        )
        parts.append(
            f'<g class="{_box_class(node)}"><title>{html.escape(tip)}</title>'
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="4"/>'
            f'<text x="{x + BOX_W / 2:.0f}" y="{y + BOX_H / 2 + 4:.0f}">{html.escape(label)}</text></g>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))


# --- form choices -----------------------------------------------------------------------------------------


def _targets() -> list[dict]:
    """The built-in targets, as GET /targets lists them."""
    from flexdsa_core import list_targets

    try:
        return [{"name": t.name, "vendor": t.vendor, "description": t.description} for t in list_targets()]
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
