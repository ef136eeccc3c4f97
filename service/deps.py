"""Request dependencies, chained: settings -> database session -> current tenant -> job of that tenant.

Routes declare what they need (``tenant: CurrentTenant``, ``job: JobOfCurrentTenant``) and stay thin:
authentication and ownership are checked here, once. A job of another tenant answers 404, exactly as a
job that does not exist, so ids cannot be probed.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated

from fastapi import Cookie, Depends, Header, Path, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from service.auth.keys import authenticate, ensure_tenant, parse_prefix
from service.core.config import Settings
from service.core.errors import NotFound, Unauthorized
from service.core.models import Job, Tenant
from service.core.ratelimit import PROPOSAL, TRAFFIC, Action
from service.jobs import service as jobs
from service.storage.store import ArtifactStore

API_KEY_HEADER = "X-API-Key"
API_KEY_COOKIE = "flexdsa_key"

# The two ways a tenant sends its key, declared as OpenAPI security schemes (either one will do). On a tenant
# route a bearer value is an API key; on an operator surface it is the operator token (``operator_access``).
api_key_scheme = APIKeyHeader(
    name=API_KEY_HEADER, scheme_name="ApiKey", auto_error=False,
    description="The tenant's API key (`fdsa_...`, from `flexdsa keys create`).",
)  # fmt: skip
bearer_scheme = HTTPBearer(
    scheme_name="Bearer", auto_error=False,
    description="`Authorization: Bearer <api key>` on tenant routes, the same key as X-API-Key; on operator "
    "surfaces (GET /metrics, /incidents, service-wide /cache/stats) the operator token.",
)  # fmt: skip
KeyHeader = Annotated[str | None, Security(api_key_scheme)]
BearerCredentials = Annotated[HTTPAuthorizationCredentials | None, Security(bearer_scheme)]


# async: a plain attribute read needs no thread hand-off (a sync dependency costs one per request).
async def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_session(request: Request) -> AsyncIterator[Session]:
    """A session for this request. Async, because a sync generator costs two thread hand-offs per request
    (open, close), and under load each hand-off waits its turn for a thread; the session is still only ever
    used from the route's and the dependencies' threads. Closing one that holds no transaction does no I/O,
    so only the close that has to roll back goes to a thread."""
    session = request.app.state.session_factory()
    try:
        yield session
    finally:
        if session.in_transaction():
            await run_in_threadpool(session.close)
        else:
            session.close()


async def get_store(request: Request) -> ArtifactStore:
    return request.app.state.store


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
StoreDep = Annotated[ArtifactStore, Depends(get_store)]


def bearer_api_key(settings: Settings, bearer: HTTPAuthorizationCredentials | str | None) -> str | None:
    """The API key a tenant sent as ``Authorization: Bearer``; None for none, or for the operator token (an
    operator's request to a tenant route carries no tenant's key)."""
    token = bearer.credentials if isinstance(bearer, HTTPAuthorizationCredentials) else bearer
    if not token or operator_token_matches(settings, token):
        return None
    return token


def current_tenant(
    session: SessionDep,
    settings: SettingsDep,
    x_api_key: KeyHeader = None,
    flexdsa_key: Annotated[str | None, Cookie(alias=API_KEY_COOKIE, include_in_schema=False)] = None,
    bearer: BearerCredentials = None,
) -> Tenant:
    key = x_api_key or bearer_api_key(settings, bearer) or flexdsa_key
    if key:
        tenant = authenticate(session, key)
        if tenant is None:
            # A wrong key is refused even when keys are optional: the caller meant some tenant, not 'default'.
            raise Unauthorized(
                f"The API key is not valid (unknown, malformed or revoked); keys are read from "
                f"{settings.keys_read_from()}. Create one with `flexdsa keys create --tenant NAME` run against that "
                "database (the same FLEXDSA_DATABASE_URL, or in embedded mode the same directory as the server).",
                code="invalid_api_key",
                headers={"WWW-Authenticate": API_KEY_HEADER},
            )
        return tenant
    if settings.auth == "optional":
        tenant = ensure_tenant(session, settings.default_tenant)
        session.commit()
        return tenant
    raise Unauthorized(
        f"An API key is required: send it in the {API_KEY_HEADER} header or as 'Authorization: Bearer <key>'. "
        "Create one with `flexdsa keys create`.",
        code="missing_api_key",
        headers={"WWW-Authenticate": API_KEY_HEADER},
    )


CurrentTenant = Annotated[Tenant, Depends(current_tenant)]


def _rate_limited(action: Action):
    def check(request: Request, tenant: CurrentTenant) -> None:
        request.app.state.rate_limiter.check(tenant.id, action)

    return Depends(check)


# Declared after the job (or tenant) a route needs: one more of the tenant's requests of this kind, or 429.
TrafficRate = Annotated[None, _rate_limited(TRAFFIC)]
ProposalRate = Annotated[None, _rate_limited(PROPOSAL)]


@dataclass(frozen=True)
class Admission:
    """Who submits, and the job an earlier request with the same ``Idempotency-Key`` already made."""

    tenant: Tenant
    replayed: Job | None
    idempotency_key: str | None


def admitted_submit(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    x_api_key: KeyHeader = None,
    flexdsa_key: Annotated[str | None, Cookie(alias=API_KEY_COOKIE, include_in_schema=False)] = None,
    bearer: BearerCredentials = None,
    idempotency_key: Annotated[
        str | None,
        Header(alias="Idempotency-Key", max_length=255, description="Retries with the same key return the same job"),
    ] = None,
) -> Admission:
    """The tenant and everything decided from the key before a byte of the body is read (an Idempotency-Key
    retry's job; the rate limit and the quota, 429), in one thread hand-off: while big uploads stream, each
    hand-off waits its turn for a thread and the GIL (about 10 ms each in bench.ingest), and a small submit
    makes only this one and the one that records its job."""
    tenant = current_tenant(session, settings, x_api_key, flexdsa_key, bearer)
    replayed = jobs.admit_submit(session, settings, tenant, request.app.state.rate_limiter, idempotency_key)
    return Admission(tenant, replayed, idempotency_key)


AdmittedSubmit = Annotated[Admission, Depends(admitted_submit)]


def not_yours(request: Request, what: str) -> str:
    """The 404 sentence for a job or group the caller cannot see: when no key was sent (keys optional, so the
    request acts as the default tenant), that is said, since a job submitted with a key is seen only with it.
    The same sentence whether or not the id exists, so ids cannot be probed."""
    sent_key = request.headers.get(API_KEY_HEADER) or bearer_token(request) or request.cookies.get(API_KEY_COOKIE)
    if sent_key:
        return f"No {what} for this tenant."
    return (
        f"No {what} for the default tenant, and no API key was sent: a job submitted with a key is seen only "
        f"with that key (send it as {API_KEY_HEADER}; flexdsa submit --api-key or FLEXDSA_API_KEY)."
    )


def job_of_current_tenant(
    request: Request,
    job_id: Annotated[str, Path(description="Job id (from POST /optimize)")],
    tenant: CurrentTenant,
    session: SessionDep,
) -> Job:
    job = session.get(Job, job_id)
    if job is None or job.tenant_id != tenant.id:
        raise NotFound(not_yours(request, f"job {job_id!r}"), code="job_not_found")
    return job


JobOfCurrentTenant = Annotated[Job, Depends(job_of_current_tenant)]


# --- operators --------------------------------------------------------------------------------------------

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


def bearer_token(request: Request) -> str | None:
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def operator_token_matches(settings: Settings, token: str | None) -> bool:
    """True when ``token`` is the configured operator token, compared in constant time."""
    expected = settings.operator_token.get_secret_value() if settings.operator_token else None
    return bool(token and expected and hmac.compare_digest(token.encode(), expected.encode()))


def loopback_stands_in_for_operator(request: Request, settings: Settings) -> bool:
    """With no token configured, embedded mode serves operator surfaces to loopback clients only (the
    developer on their own machine); distributed mode serves them to nobody."""
    client_host = request.client.host if request.client else ""
    return settings.operator_token is None and settings.mode == "embedded" and client_host in LOOPBACK_HOSTS


def operator_access(request: Request, settings: SettingsDep) -> bool:
    """True for a request carrying the operator token (``Authorization: Bearer``), compared in constant
    time; False for one carrying none. A wrong token is refused (401) rather than treated as a tenant."""
    token = bearer_token(request)
    if token is None:
        return False
    if parse_prefix(token) is not None and not operator_token_matches(settings, token):
        return False  # a tenant's API key sent as a bearer token: the tenant rule decides
    if not operator_token_matches(settings, token):
        raise Unauthorized(
            "The operator token is not valid (FLEXDSA_OPERATOR_TOKEN, sent as 'Authorization: Bearer ...').",
            code="invalid_operator_token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return True


IsOperator = Annotated[bool, Depends(operator_access)]


def require_operator(request: Request, settings: SettingsDep, is_operator: IsOperator) -> None:
    """Operators only. With no token configured: 404 in distributed mode (the surface is off), and in
    embedded mode loopback clients only (the developer on their own machine)."""
    if is_operator:
        return
    if settings.operator_token is not None:
        raise Unauthorized(
            "This is an operator surface: send 'Authorization: Bearer <FLEXDSA_OPERATOR_TOKEN>'.",
            code="operator_token_required",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if loopback_stands_in_for_operator(request, settings):
        return
    raise NotFound(
        "Not found. Operator surfaces are served with FLEXDSA_OPERATOR_TOKEN set (or, in embedded mode, to "
        "loopback clients).",
        code="not_found",
    )


OperatorOnly = Depends(require_operator)


def tenant_unless_operator(
    is_operator: IsOperator,
    session: SessionDep,
    settings: SettingsDep,
    x_api_key: KeyHeader = None,
    flexdsa_key: Annotated[str | None, Cookie(alias=API_KEY_COOKIE, include_in_schema=False)] = None,
    bearer: BearerCredentials = None,
) -> Tenant | None:
    """None for an operator (who sees every tenant), else the current tenant by the usual rule."""
    if is_operator:
        return None
    return current_tenant(session, settings, x_api_key, flexdsa_key, bearer)


TenantUnlessOperator = Annotated[Tenant | None, Depends(tenant_unless_operator)]
