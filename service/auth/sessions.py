"""Who is asking, for the dashboard's pages, and the cookies that remember it.

A page follows the JSON API's rules (``deps.current_tenant``, ``deps.operator_token_matches``) but answers
differently when they fail: no tenant means a redirect to the login page rather than a 401, and no operator
means the page reads as missing. The dependencies here wrap those rules for routes to declare
(``tenant: PageTenant``, ``job: PageJob``, ``operator: PageOperator``).

The API key is kept in the ``flexdsa_key`` cookie (httponly, SameSite=Lax, whole site), the operator token
in ``flexdsa_operator`` (httponly, SameSite=Strict, ``/ui/`` only: the JSON API keeps taking the token as a
bearer header). A login or logout posted from another site's page is refused, and the page to go back to
after a login is only ever a path on this site.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from fastapi import Cookie, Depends, Header, Request
from fastapi.responses import Response

from service.core.errors import Unauthorized
from service.core.models import Job, Tenant
from service.deps import (
    API_KEY_COOKIE,
    API_KEY_HEADER,
    LOOPBACK_HOSTS,
    SessionDep,
    SettingsDep,
    bearer_token,
    current_tenant,
    loopback_stands_in_for_operator,
    operator_token_matches,
)

OPERATOR_COOKIE = "flexdsa_operator"
# The operator cookie opens these pages only: the JSON API keeps taking the token as a bearer header.
OPERATOR_COOKIE_PATH = "/ui/"
COOKIE_MAX_AGE_S = 30 * 24 * 3600
CROSS_SITE = "This form was posted from another site; log in from this page instead."

KeyHeader = Annotated[str | None, Header(alias=API_KEY_HEADER)]
KeyCookie = Annotated[str | None, Cookie(alias=API_KEY_COOKIE)]


def page_tenant(
    session: SessionDep,
    settings: SettingsDep,
    x_api_key: KeyHeader = None,
    flexdsa_key: KeyCookie = None,
) -> Tenant | None:
    """The API's own tenant rule (deps.current_tenant); None where the API would answer 401, so that the
    page can redirect to the login page instead."""
    try:
        return current_tenant(session, settings, x_api_key, flexdsa_key)
    except Unauthorized:
        return None


PageTenant = Annotated[Tenant | None, Depends(page_tenant)]


def page_job(job_id: str, tenant: PageTenant, session: SessionDep) -> Job | None:
    """The job, if it is the current tenant's: another tenant's job reads exactly as a missing one."""
    job = session.get(Job, job_id) if tenant is not None else None
    return job if job is not None and job.tenant_id == tenant.id else None


PageJob = Annotated[Job | None, Depends(page_job)]


def is_operator(request: Request) -> bool:
    """The API's operator rule (deps.require_operator): the operator token, here as a bearer header or the
    cookie ``/ui/operator`` sets, or, with no token configured, a loopback client in embedded mode. A wrong
    token is no operator: the page reads as missing, exactly as for a tenant."""
    settings = request.app.state.settings
    token = bearer_token(request) or request.cookies.get(OPERATOR_COOKIE)
    return operator_token_matches(settings, token) or loopback_stands_in_for_operator(request, settings)


PageOperator = Annotated[bool, Depends(is_operator)]


def logged_in(request: Request) -> bool:
    return API_KEY_COOKIE in request.cookies or OPERATOR_COOKIE in request.cookies


def same_origin(request: Request) -> bool:
    """A login or logout posted by another site's page is refused (it could swap the visitor's tenant).
    Browsers send Origin on every cross-site POST; a request without one is not from a foreign page."""
    origin = request.headers.get("origin")
    if origin is None:
        return True
    # Behind a proxy that rewrites Host, X-Forwarded-Host names the site (a foreign form cannot set it).
    hosts = {request.headers.get("host"), request.headers.get("x-forwarded-host")}
    return urlsplit(origin).netloc in hosts - {None}


def safe_next(target: str) -> str:
    # Only paths on this site: "//evil.example" or "https://..." would make the login an open redirect.
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def secure_cookie(request: Request) -> bool:
    """Whether a cookie set on this response is Secure (``Settings.secure_cookies``). Behind a proxy that
    terminates TLS the request reads as plain HTTP, so a deployed (distributed) service marks them Secure
    whatever the scheme, except on a loopback host (a developer's own machine, docker compose on localhost)."""
    settings = request.app.state.settings
    if settings.secure_cookies is not None:
        return settings.secure_cookies
    if request.url.scheme == "https":
        return True
    return settings.mode == "distributed" and (request.url.hostname or "") not in LOOPBACK_HOSTS


def remember_api_key(response: Response, request: Request, key: str) -> None:
    response.set_cookie(
        API_KEY_COOKIE,
        key,
        max_age=COOKIE_MAX_AGE_S,
        httponly=True,
        samesite="lax",
        secure=secure_cookie(request),
        path="/",
    )


def remember_operator_token(response: Response, request: Request, token: str) -> None:
    response.set_cookie(
        OPERATOR_COOKIE,
        token,
        max_age=COOKIE_MAX_AGE_S,
        httponly=True,
        samesite="strict",
        secure=secure_cookie(request),
        path=OPERATOR_COOKIE_PATH,
    )


def forget_both(response: Response) -> None:
    response.delete_cookie(API_KEY_COOKIE, path="/", httponly=True, samesite="lax")
    response.delete_cookie(OPERATOR_COOKIE, path=OPERATOR_COOKIE_PATH, httponly=True, samesite="strict")
