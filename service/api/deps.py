"""Request dependencies, chained: settings -> database session -> current tenant -> job of that tenant.

Routes declare what they need (``tenant: CurrentTenant``, ``job: JobOfCurrentTenant``) and stay thin:
authentication and ownership are checked here, once. A job of another tenant answers 404, exactly as a
job that does not exist, so ids cannot be probed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Cookie, Depends, Header, Path, Request
from sqlalchemy.orm import Session

from service.auth import authenticate, ensure_tenant
from service.config import Settings
from service.errors import NotFound, Unauthorized
from service.models import Job, Tenant
from service.storage import ArtifactStore

API_KEY_HEADER = "X-API-Key"
API_KEY_COOKIE = "flexdsa_key"


def get_app_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    session = request.app.state.session_factory()
    try:
        yield session
    finally:
        session.close()


def get_store(request: Request) -> ArtifactStore:
    return request.app.state.store


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
StoreDep = Annotated[ArtifactStore, Depends(get_store)]


def current_tenant(
    session: SessionDep,
    settings: SettingsDep,
    x_api_key: Annotated[str | None, Header(alias=API_KEY_HEADER, description="API key `fdsa_...`")] = None,
    flexdsa_key: Annotated[str | None, Cookie(alias=API_KEY_COOKIE, include_in_schema=False)] = None,
) -> Tenant:
    key = x_api_key or flexdsa_key
    if key:
        tenant = authenticate(session, key)
        if tenant is None:
            # A wrong key is refused even when keys are optional: the caller meant some tenant, not 'default'.
            raise Unauthorized(
                "The API key is not valid (unknown, malformed or revoked). Create one with `flexdsa keys create`.",
                code="invalid_api_key",
                headers={"WWW-Authenticate": API_KEY_HEADER},
            )
        return tenant
    if settings.auth == "optional":
        tenant = ensure_tenant(session, settings.default_tenant)
        session.commit()
        return tenant
    raise Unauthorized(
        f"An API key is required: send it in the {API_KEY_HEADER} header. Create one with `flexdsa keys create`.",
        code="missing_api_key",
        headers={"WWW-Authenticate": API_KEY_HEADER},
    )


CurrentTenant = Annotated[Tenant, Depends(current_tenant)]


def job_of_current_tenant(
    job_id: Annotated[str, Path(description="Job id (from POST /optimize)")],
    tenant: CurrentTenant,
    session: SessionDep,
) -> Job:
    job = session.get(Job, job_id)
    if job is None or job.tenant_id != tenant.id:
        raise NotFound(f"No job {job_id!r} for this tenant.", code="job_not_found")
    return job


JobOfCurrentTenant = Annotated[Job, Depends(job_of_current_tenant)]
