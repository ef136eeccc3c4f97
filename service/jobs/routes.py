"""Jobs of the current tenant: list, state, live progress (SSE), cancel, artifacts."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import FileResponse, JSONResponse, RedirectResponse, StreamingResponse
from sqlalchemy import select
from sse_starlette.sse import EventSourceResponse
from starlette.concurrency import run_in_threadpool

from service.core.errors import NotFound
from service.core.models import TERMINAL_STATUSES, Artifact, Job, JobEvent
from service.core.schemas import ERROR_RESPONSES, ErrorResponse
from service.deps import CurrentTenant, JobOfCurrentTenant, SessionDep, SettingsDep, StoreDep
from service.jobs import service as jobs
from service.jobs.bundle import BUNDLE_NAME, StoredBundle, job_bundle
from service.jobs.schemas import (
    ArtifactList,
    ArtifactOut,
    JobEventOut,
    JobOut,
    JobPage,
    JobStatusName,
)
from service.storage.store import BlobNotFoundError, LocalStore

log = logging.getLogger("flexdsa.service")

router = APIRouter(tags=["jobs"], responses=ERROR_RESPONSES)

# Without Redis a progress stream re-reads the database at settings.sse_poll_interval_s; with Redis it
# wakes on each published nudge, and still re-reads this often in case a message was missed.
REDIS_FALLBACK_POLL_S = 5.0


def _root(request: Request) -> str:
    return request.scope.get("root_path", "")


@router.get("/jobs", response_model=JobPage, summary="List this tenant's jobs, newest first")
def list_jobs(
    request: Request,
    tenant: CurrentTenant,
    session: SessionDep,
    status: JobStatusName | None = None,
    target: str | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1, description="Skip this many jobs (or use cursor)")] = 0,
    cursor: Annotated[str | None, Query(description="next_cursor from the previous page")] = None,
) -> JobPage:
    rows, total, next_cursor = jobs.list_jobs(
        session, tenant, status=status, target=target, limit=limit, offset=offset, cursor=cursor
    )
    return JobPage(
        items=[jobs.job_out(job, _root(request)) for job in rows],
        total=total,
        limit=limit,
        offset=None if cursor else offset,
        next_cursor=next_cursor,
    )


@router.get("/jobs/{job_id}", response_model=JobOut, summary="A job's state, progress, timings and report")
def get_job(request: Request, job: JobOfCurrentTenant) -> JobOut:
    return jobs.job_out(job, _root(request))


@router.delete(
    "/jobs/{job_id}",
    response_model=JobOut,
    summary="Cancel a job",
    description="A queued job is cancelled at once (200). A running job is asked to stop (202); the worker "
    "ends it as 'cancelled' at its next checkpoint. A finished job answers 409.",
    responses={202: {"model": JobOut, "description": "Cancel requested"}, 409: {"model": ErrorResponse}},
)
def cancel_job(request: Request, job: JobOfCurrentTenant, session: SessionDep) -> JSONResponse:
    job, kind = jobs.cancel_job(session, job)
    jobs.publish(request.app.state.redis, job, kind)
    status_code = 200 if kind == "cancelled" else 202
    return JSONResponse(jobs.job_out(job, _root(request)).model_dump(mode="json"), status_code=status_code)


def _events_since(session_factory, job_id: str, after_id: int) -> tuple[str, list[JobEventOut]]:
    with session_factory() as session:
        # Status first, then events: a terminal status is committed with its event, so the events read
        # next include it, and the stream can end without missing the last word.
        status = session.scalar(select(Job.status).where(Job.id == job_id))
        rows = session.scalars(
            select(JobEvent).where(JobEvent.job_id == job_id, JobEvent.id > after_id).order_by(JobEvent.id)
        ).all()
        return status, [JobEventOut.model_validate(row) for row in rows]


async def _subscribe(redis_url: str, channel: str):
    import redis.asyncio as aioredis

    client = aioredis.from_url(redis_url, socket_connect_timeout=2)
    pubsub = client.pubsub()
    await pubsub.subscribe(channel)
    return client, pubsub


async def _close(client, pubsub) -> None:
    for closable in (pubsub, client):
        try:
            await closable.aclose()
        except Exception:  # already broken; nothing more to release
            pass


@router.get(
    "/jobs/{job_id}/events",
    summary="Live progress (Server-Sent Events)",
    description="Replays the job's events, then follows them until the job ends. Each SSE event is named "
    "after the event kind and carries a JobEvent as JSON; a final 'end' event carries the terminal status. "
    "Reconnecting with Last-Event-ID resumes after that event.",
    response_class=EventSourceResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "SSE stream of JobEvent"}},
)
async def job_events(
    request: Request,
    job: JobOfCurrentTenant,
    settings: SettingsDep,
    last_event_id: Annotated[int | None, Header(alias="Last-Event-ID")] = None,
) -> EventSourceResponse:
    job_id = job.id
    session_factory = request.app.state.session_factory

    async def stream():
        after_id = last_event_id or 0
        client = pubsub = None
        if settings.redis_url:
            try:  # subscribe before the replay, so nothing published in between is lost
                client, pubsub = await _subscribe(settings.redis_url, jobs.job_channel(job_id))
            except Exception as err:
                log.warning("progress stream for %s falls back to polling: %s", job_id, err)
        try:
            while True:
                status, events = await run_in_threadpool(_events_since, session_factory, job_id, after_id)
                for event in events:
                    after_id = event.id
                    yield {"id": str(event.id), "event": event.kind, "data": event.model_dump_json()}
                if status is None or status in TERMINAL_STATUSES:
                    yield {"event": "end", "data": json.dumps({"job_id": job_id, "status": status})}
                    return
                if pubsub is not None:
                    try:
                        await pubsub.get_message(
                            ignore_subscribe_messages=True, timeout=REDIS_FALLBACK_POLL_S
                        )
                    except Exception as err:  # Redis went away mid-stream: keep following by polling
                        log.warning("progress stream for %s: Redis lost (%s); polling instead", job_id, err)
                        await _close(client, pubsub)
                        client = pubsub = None
                else:
                    await asyncio.sleep(settings.sse_poll_interval_s)
        finally:
            if pubsub is not None:
                await _close(client, pubsub)

    return EventSourceResponse(stream(), ping=15)


def _bundle_response(job: Job, session, store):
    """The bundle (``service.jobs.bundle``) as HTTP: a presigned 307 to the stored zip, or the spooled zip
    streamed."""
    bundle = job_bundle(job, session, store)
    if isinstance(bundle, StoredBundle):
        return _redirect(bundle.url, bundle.sha256)
    spool = bundle.spool

    def chunks():
        with spool:
            while chunk := spool.read(1 << 20):
                yield chunk

    return StreamingResponse(
        chunks(),
        media_type="application/zip",
        headers={
            "Content-Length": str(bundle.size),
            "Content-Disposition": f'attachment; filename="{bundle.filename}"',
            "Repr-Digest": repr_digest(bundle.sha256),
        },
    )


def repr_digest(sha256_hex: str) -> str:
    """RFC 9530 ``Repr-Digest`` of a blob: clients check what they downloaded against it."""
    return f"sha-256=:{base64.b64encode(bytes.fromhex(sha256_hex)).decode()}:"


def _redirect(url: str, sha256_hex: str) -> RedirectResponse:
    # 307: the client repeats the GET at the store, without our API key (the URL carries its own
    # short-lived signature); never cached, since the signature expires.
    return RedirectResponse(
        url, status_code=307, headers={"Repr-Digest": repr_digest(sha256_hex), "Cache-Control": "no-store"}
    )


def _artifact_out(request: Request, job_id: str, artifact: Artifact) -> ArtifactOut:
    return ArtifactOut(
        name=artifact.name,
        size=artifact.size,
        content_type=artifact.content_type,
        sha256=artifact.blob_key,
        created_at=artifact.created_at,
        url=f"{_root(request)}/jobs/{job_id}/artifacts/{quote(artifact.name)}",
    )


@router.get("/jobs/{job_id}/artifacts", response_model=ArtifactList, summary="The files a job produced")
def list_artifacts(request: Request, job: JobOfCurrentTenant, session: SessionDep) -> ArtifactList:
    rows = session.scalars(select(Artifact).where(Artifact.job_id == job.id).order_by(Artifact.name)).all()
    return ArtifactList(job_id=job.id, items=[_artifact_out(request, job.id, row) for row in rows])


@router.get(
    "/jobs/{job_id}/artifacts/{name:path}",
    summary="Download one artifact",
    description="The file, or (object store with presigned downloads) a 307 to a short-lived URL at the "
    "store, which clients follow without their API key. Either way `Repr-Digest` carries the file's sha256, "
    "to check the download against. 502 `artifact_corrupt` when the stored bytes are not the job's; 503 "
    "with Retry-After while the store is unreachable.",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The file"},
        307: {"description": "Fetch the file from the presigned URL in Location"},
        502: {"model": ErrorResponse, "description": "The stored bytes do not match the job's sha256"},
        503: {"model": ErrorResponse, "description": "The artifact store is unreachable (Retry-After)"},
    },
)
def download_artifact(job: JobOfCurrentTenant, name: str, session: SessionDep, store: StoreDep):
    artifact = session.scalar(select(Artifact).where(Artifact.job_id == job.id, Artifact.name == name))
    if artifact is None and name == BUNDLE_NAME:
        return _bundle_response(job, session, store)
    missing = NotFound(f"Job {job.id} has no artifact {name!r}.", code="artifact_not_found")
    if artifact is None:
        raise missing
    filename = name.rsplit("/", 1)[-1]
    digest = {"Repr-Digest": repr_digest(artifact.blob_key)}
    if store.redirects:
        try:
            store.verified_head(artifact.blob_key, artifact.size)
        except BlobNotFoundError:
            raise missing from None
        url = store.presigned_url(artifact.blob_key, filename=filename, content_type=artifact.content_type)
        return _redirect(url, artifact.blob_key)
    if not store.exists(artifact.blob_key):
        raise missing
    if isinstance(store, LocalStore):
        return FileResponse(
            store.path(artifact.blob_key), media_type=artifact.content_type, filename=filename, headers=digest
        )
    return StreamingResponse(
        store.iter_chunks(artifact.blob_key),
        media_type=artifact.content_type,
        headers={
            "Content-Length": str(artifact.size),
            "Content-Disposition": f"attachment; filename*=UTF-8''{quote(filename)}",
            **digest,
        },
    )
