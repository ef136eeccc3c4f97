"""Run-time traffic of a job's deployed bundle, and re-specialising its buckets from it (``service/traffic/service.py``).

``POST /jobs/{id}/traffic`` takes the runtime's snapshot (at most 4096 entries, 2 MiB); ``GET`` sums every
push. ``GET /jobs/{id}/respecialise`` is the proposal with its expected gain; ``POST`` compiles it as the
next bundle version. ``PUT /jobs/{id}/traffic/policy`` sets the waste past which that happens by itself;
``GET /jobs/{id}/versions`` lists the versions and their lineage.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse

from service.core.body_limit import bounded_body, json_body, request_body_schema
from service.core.schemas import ERROR_RESPONSES, ErrorResponse
from service.deps import (
    CurrentTenant,
    JobOfCurrentTenant,
    ProposalRate,
    SessionDep,
    SettingsDep,
    StoreDep,
    TrafficRate,
)
from service.jobs import service as jobs
from service.traffic import service as traffic
from service.traffic.schemas import (
    ProposalOut,
    RespecialiseIn,
    TrafficIn,
    TrafficOut,
    TrafficPolicyIn,
    TrafficPolicyOut,
    TrafficPushOut,
    VersionOut,
    VersionsOut,
)

router = APIRouter(tags=["traffic"], responses=ERROR_RESPONSES)

CONFLICT = {409: {"model": ErrorResponse, "description": "The job has not succeeded, or has no traffic yet"}}
RATE_LIMITED = {429: {"model": ErrorResponse, "description": "Too many of these requests from this tenant in the last minute (Retry-After)"}}


def _root(request: Request) -> str:
    return request.scope.get("root_path", "")


@router.post(
    "/jobs/{job_id}/traffic",
    response_model=TrafficPushOut,
    status_code=201,
    summary="Record the shapes a deployed bundle served",
    description="The body is flexdsa_runtime's Traffic.snapshot(): per (dims, bucket) the requests and their "
    "input elements before and after padding. At most 4096 entries and 2 MiB per push.",
    openapi_extra=request_body_schema(TrafficIn),
    responses={**CONFLICT, **RATE_LIMITED, 413: {"model": ErrorResponse, "description": "Body over 2 MiB"}},
)
async def push_traffic(
    request: Request,
    job: JobOfCurrentTenant,
    tenant: CurrentTenant,
    _rate: TrafficRate,
    session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
) -> JSONResponse:
    from starlette.concurrency import run_in_threadpool

    payload = traffic.parse_push(await bounded_body(request, traffic.MAX_BODY_BYTES))
    stored = await run_in_threadpool(traffic.record_push, session, settings, store, tenant, job, payload)
    return JSONResponse(TrafficPushOut(**stored).model_dump(mode="json"), status_code=201)


@router.get("/jobs/{job_id}/traffic", response_model=TrafficOut, summary="The traffic a job's bundle served")
def get_traffic(job: JobOfCurrentTenant, session: SessionDep, store: StoreDep) -> TrafficOut:
    return TrafficOut(**traffic.traffic_summary(session, store, job))


@router.get(
    "/jobs/{job_id}/respecialise",
    response_model=ProposalOut,
    summary="Buckets proposed from the traffic, with the expected gain",
    responses={**CONFLICT, **RATE_LIMITED},
)
def get_proposal(
    job: JobOfCurrentTenant,
    _rate: ProposalRate,
    session: SessionDep,
    store: StoreDep,
    max_buckets: Annotated[int | None, Query(ge=1, le=16)] = None,
    allow_narrower: Annotated[
        bool, Query(description="Let the proposal serve less than the current buckets (see RespecialiseIn).")
    ] = False,
) -> ProposalOut:
    return ProposalOut(**traffic.proposal(session, store, job, max_buckets, allow_narrower))


@router.post(
    "/jobs/{job_id}/respecialise",
    response_model=VersionOut,
    status_code=202,
    summary="Compile the next bundle version for the proposed (or given) buckets",
    responses={**CONFLICT, **RATE_LIMITED},
    openapi_extra=request_body_schema(RespecialiseIn),
)
def post_respecialise(
    request: Request,
    job: JobOfCurrentTenant,
    tenant: CurrentTenant,
    _rate: ProposalRate,
    body: Annotated[RespecialiseIn, Depends(json_body(RespecialiseIn))],
    session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
) -> JSONResponse:
    child = traffic.respecialise(session, settings, store, tenant, job, body)
    out = VersionOut(job=jobs.job_out(child, _root(request)), buckets=None)
    return JSONResponse(out.model_dump(mode="json"), status_code=202)


@router.put(
    "/jobs/{job_id}/traffic/policy",
    response_model=TrafficPolicyOut,
    summary="Re-specialise by itself past a padding waste",
    openapi_extra=request_body_schema(TrafficPolicyIn),
)
def put_policy(
    job: JobOfCurrentTenant,
    body: Annotated[TrafficPolicyIn, Depends(json_body(TrafficPolicyIn))],
    session: SessionDep,
) -> TrafficPolicyOut:
    return TrafficPolicyOut(**traffic.set_policy(session, job, body))


@router.get(
    "/jobs/{job_id}/versions", response_model=VersionsOut, summary="The bundle's versions, oldest first"
)
def get_versions(
    request: Request, job: JobOfCurrentTenant, session: SessionDep, store: StoreDep
) -> VersionsOut:
    versions = [
        VersionOut(job=jobs.job_out(v, _root(request)), buckets=traffic.version_buckets(session, store, v))
        for v in traffic.lineage(session, job)
    ]
    return VersionsOut(job_id=job.id, versions=versions)
