"""The web dashboard: server-rendered pages over the same job functions the JSON API uses.

``/``                 this tenant's jobs (filter by status), live progress, and the upload form
``/ui/jobs/{id}``     one job: state, the report (from ``report.json`` and ``fusion_plan.json``), a
                      before/after graph view rendered as SVG, artifact downloads
``/ui/jobs/{id}/respecialise`` (POST) the traffic section's button: the next bundle version, then its page
``/ui/jobs/{id}/traffic-policy`` (POST) the padding waste past which a traffic push re-specialises by itself
``/ui/login``         distributed mode: paste an API key, kept in the ``flexdsa_key`` cookie (httponly)
``/ui/incidents[/{id}]`` operators only: internal errors with their tracebacks, by the id a failed job quotes
``/ui/operator``      paste the operator token, kept in the ``flexdsa_operator`` cookie (httponly, /ui/ only)
``/ui/static/{name}`` the stylesheet and the small script (no build step, nothing fetched from elsewhere)

Every page reads fine with JavaScript off; the script only adds live progress and submits the upload form
(``POST /optimize`` takes the spec as JSON, which a plain HTML form cannot build).

The routes only decide who may see what and which template answers. Who is asking and the login cookies:
``service/auth/sessions.py``; templates and their shared context: ``service/dashboard/pages.py``; what a page shows
(read from the job, its report and artifacts): ``service/dashboard/views.py``; the graph picture:
``service/dashboard/graph_layout.py``.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from service.auth.keys import authenticate
from service.auth.sessions import (
    CROSS_SITE,
    PageJob,
    PageOperator,
    PageTenant,
    forget_both,
    remember_api_key,
    remember_operator_token,
    safe_next,
    same_origin,
)
from service.core.errors import ServiceError
from service.core.models import Incident
from service.core.ratelimit import PROPOSAL
from service.dashboard import views
from service.dashboard.pages import STATIC_DIR, login_redirect, not_found, render, root
from service.deps import SessionDep, SettingsDep, StoreDep, operator_token_matches
from service.jobs.schemas import JobStatusName
from service.traffic import service as traffic_service
from service.traffic import views as traffic_views
from service.traffic.schemas import RespecialiseIn, TrafficPolicyIn

log = logging.getLogger("flexdsa.service")

router = APIRouter(include_in_schema=False)


# --- tenants: jobs ----------------------------------------------------------------------------------------


@router.get("/", response_class=HTMLResponse)
def job_list_page(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    tenant: PageTenant,
    status: JobStatusName | None = None,
    cursor: str | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
):
    if tenant is None:
        return login_redirect(request)
    jobs = views.job_list_view(session, tenant, root(request), status=status, cursor=cursor, limit=limit)
    return render(request, "jobs.html", **jobs, **views.upload_form(settings.max_upload_bytes))


@router.get("/ui/jobs/{job_id}", response_class=HTMLResponse)
def job_page(
    request: Request, job_id: str, session: SessionDep, store: StoreDep, tenant: PageTenant, job: PageJob
):
    if tenant is None:
        return login_redirect(request)
    if job is None:
        return render(request, "not_found.html", status_code=404, job_id=job_id, tenant=tenant.name)
    view = views.job_view(session, store, job, root(request))
    try:
        view["traffic"] = traffic_views.traffic_view(session, store, job, root(request))
    except Exception:  # a traffic section that cannot be read must not hide the job
        log.exception("dashboard: cannot read the traffic of job %s", job.id)
        view["traffic"] = None
    try:
        return render(request, "job.html", tenant=tenant.name, **view)
    except Exception:
        # A report of a shape this page does not know must not hide the job: show it without the report.
        log.exception("dashboard: cannot render the report of job %s", job.id)
        view.update(report=None, report_error=True)
        return render(request, "job.html", tenant=tenant.name, **view)


# --- tenants: traffic and bundle versions ----------------------------------------------------------------


@router.post("/ui/jobs/{job_id}/respecialise", response_class=HTMLResponse)
def respecialise_from_page(
    request: Request,
    job_id: str,
    session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
    tenant: PageTenant,
    job: PageJob,
    max_buckets: Annotated[int | None, Form(ge=1, le=16)] = None,
):
    """The job page's "Re-specialise" button: the next version, then its page."""
    if tenant is None:
        return login_redirect(request)
    if job is None:
        return render(request, "not_found.html", status_code=404, job_id=job_id, tenant=tenant.name)
    if not same_origin(request):
        return _job_page_with(request, session, store, tenant, job, CROSS_SITE, 403)
    try:
        request.app.state.rate_limiter.check(tenant.id, PROPOSAL)
        child = traffic_service.respecialise(
            session, settings, store, tenant, job, RespecialiseIn(max_buckets=max_buckets)
        )
    except ServiceError as err:
        return _job_page_with(request, session, store, tenant, job, err.message, err.status)
    return RedirectResponse(f"{root(request)}/ui/jobs/{child.id}", status_code=303)


@router.post("/ui/jobs/{job_id}/traffic-policy", response_class=HTMLResponse)
def traffic_policy_from_page(
    request: Request,
    job_id: str,
    session: SessionDep,
    store: StoreDep,
    tenant: PageTenant,
    job: PageJob,
    waste_percent: Annotated[str, Form()] = "",
):
    """The job page's threshold form: re-specialise by itself past this padding waste (empty: off)."""
    if tenant is None:
        return login_redirect(request)
    if job is None:
        return render(request, "not_found.html", status_code=404, job_id=job_id, tenant=tenant.name)
    if not same_origin(request):
        return _job_page_with(request, session, store, tenant, job, CROSS_SITE, 403)
    text = waste_percent.strip()
    try:
        waste = None if not text else float(text) / 100
        policy = TrafficPolicyIn(auto_respecialise_waste=waste, max_buckets=job.respecialise_max_buckets)
    except ValueError:
        message = f"{text!r} is not a percentage: give a number such as 20, or leave it empty to switch it off."
        return _job_page_with(request, session, store, tenant, job, message, 422)
    traffic_service.set_policy(session, job, policy)
    return RedirectResponse(f"{root(request)}/ui/jobs/{job.id}#traffic", status_code=303)


def _job_page_with(request, session, store, tenant, job, message: str, status_code: int):
    view = views.job_view(session, store, job, root(request))
    view["traffic"] = traffic_views.traffic_view(session, store, job, root(request))
    view["traffic"]["error"] = message
    return render(request, "job.html", status_code=status_code, tenant=tenant.name, **view)


# --- tenants: login ---------------------------------------------------------------------------------------


@router.get("/ui/login", response_class=HTMLResponse)
def login_page(request: Request, next: str = "/"):
    return render(request, "login.html", next=safe_next(next), error=None)


@router.post("/ui/login", response_class=HTMLResponse)
def login(
    request: Request,
    session: SessionDep,
    api_key: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "/",
):
    if not same_origin(request):
        return render(request, "login.html", status_code=403, next="/", error=CROSS_SITE)
    key = api_key.strip()
    tenant = authenticate(session, key) if key else None
    if tenant is None:
        error = "That key is not valid (unknown, malformed or revoked)." if key else "Paste an API key."
        return render(request, "login.html", status_code=401, next=safe_next(next), error=error)
    response = RedirectResponse(root(request) + safe_next(next), status_code=303)
    remember_api_key(response, request, key)
    return response


@router.post("/ui/logout")
def logout(request: Request):
    if not same_origin(request):
        return render(request, "login.html", status_code=403, next="/", error=CROSS_SITE)
    response = RedirectResponse(f"{root(request)}/ui/login", status_code=303)
    forget_both(response)
    return response


# --- operators: incidents ---------------------------------------------------------------------------------


@router.get("/ui/incidents", response_class=HTMLResponse)
def incident_list_page(
    request: Request,
    session: SessionDep,
    operator: PageOperator,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
):
    if not operator:
        return not_found(request)
    return render(request, "incidents.html", **views.incident_list_view(session, limit))


@router.get("/ui/incidents/{incident_id}", response_class=HTMLResponse)
def incident_page(request: Request, incident_id: str, session: SessionDep, operator: PageOperator):
    incident = session.get(Incident, incident_id) if operator else None
    if incident is None:
        return not_found(request)
    return render(request, "incident.html", **views.incident_view(session, incident))


@router.get("/ui/operator", response_class=HTMLResponse)
def operator_login_page(request: Request, next: str = "/ui/incidents"):
    return render(request, "operator_login.html", next=safe_next(next), error=None)


@router.post("/ui/operator", response_class=HTMLResponse)
def operator_login(
    request: Request,
    settings: SettingsDep,
    token: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = "/ui/incidents",
):
    if not same_origin(request):
        return render(request, "operator_login.html", status_code=403, next="/ui/incidents", error=CROSS_SITE)
    if not operator_token_matches(settings, token.strip()):
        error = (
            "That is not the operator token (FLEXDSA_OPERATOR_TOKEN)."
            if settings.operator_token is not None
            else "No operator token is configured here (FLEXDSA_OPERATOR_TOKEN)."
        )
        return render(request, "operator_login.html", status_code=401, next=safe_next(next), error=error)
    response = RedirectResponse(root(request) + safe_next(next), status_code=303)
    remember_operator_token(response, request, token.strip())
    return response


# --- static files -----------------------------------------------------------------------------------------

_STATIC_TYPES = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml"}


@router.get("/ui/static/{name}")
def static_file(name: str) -> Response:
    path = STATIC_DIR / name
    # Only the files that sit directly in static/, by their plain name: no path ever leaves the folder.
    if "/" in name or name.startswith(".") or path.suffix not in _STATIC_TYPES or not path.is_file():
        return Response("Not found", status_code=404, media_type="text/plain")
    return FileResponse(path, media_type=_STATIC_TYPES[path.suffix], headers={"Cache-Control": "no-cache"})
