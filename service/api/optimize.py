"""POST /optimize: upload a model and a request spec, get a job."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from service import jobs
from service.api.deps import CurrentTenant, SessionDep, SettingsDep, StoreDep
from service.models import Job, JobStatus
from service.schemas import ERROR_RESPONSES, ErrorResponse, JobCreated
from service.upload import check_content_length, receive_model_upload

router = APIRouter(tags=["jobs"])

# The body is parsed by hand (service/upload.py, streamed), so its schema is declared here. The spec
# field's JSON schema is the RequestSpec component, added to the document by service.app.
_MULTIPART_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["model", "spec"],
                    "properties": {
                        "model": {"type": "string", "format": "binary", "description": "The .onnx file"},
                        "calibration": {
                            "type": "string",
                            "format": "binary",
                            "description": "Optional calibration samples for precision int8/mixed/fp16: an .npz "
                            "with one array per model input, named as the input, samples stacked on the first "
                            "axis. Checked against the model before the job is queued (422 when it does not fit).",
                        },
                        "spec": {
                            "type": "string",
                            "description": 'RequestSpec as a JSON string, e.g. {"target": "cpu-ort"}',
                            "contentMediaType": "application/json",
                            "contentSchema": {"$ref": "#/components/schemas/RequestSpec"},
                        },
                    },
                },
                "encoding": {"spec": {"contentType": "application/json"}},
            }
        },
    }
}


def _created(request: Request, job: Job, *, replayed: bool) -> JSONResponse:
    body = JobCreated(
        job_id=job.id,
        status=job.status,
        status_url=f"{request.scope.get('root_path', '')}/jobs/{job.id}",
        cached=job.cached_from_job_id is not None,
    )
    headers = {"Location": body.status_url}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSONResponse(body.model_dump(), status_code=202, headers=headers)


@router.post(
    "/optimize",
    status_code=202,
    response_model=JobCreated,
    summary="Submit a model for optimisation",
    openapi_extra=_MULTIPART_BODY,
    responses={
        **ERROR_RESPONSES,
        413: {"model": ErrorResponse, "description": "Model larger than FLEXDSA_MAX_UPLOAD_BYTES"},
        429: {"model": ErrorResponse, "description": "Too many jobs queued or running, or submitted in the last minute, for this tenant (Retry-After)"},
    },
)
async def optimize(
    request: Request,
    tenant: CurrentTenant,
    session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            alias="Idempotency-Key",
            max_length=255,
            description="Retries with the same key return the same job",
        ),
    ] = None,
) -> JSONResponse:
    # A retry is answered before its body is read: the first request's job is the answer.
    existing = await run_in_threadpool(jobs.find_by_idempotency_key, session, tenant, idempotency_key)
    if existing is not None:
        return _created(request, existing, replayed=True)
    # Limits that depend only on the key are decided before a byte of the body is read.
    await run_in_threadpool(request.app.state.rate_limiter.check, tenant.id)
    await run_in_threadpool(jobs.check_quota_before_upload, session, settings, tenant)
    # End the read transaction now: the upload may take minutes, and an idle-in-transaction connection
    # would sit in the pool all that time (expire_on_commit=False keeps the tenant readable).
    await run_in_threadpool(session.commit)

    check_content_length(request, settings.max_upload_bytes)
    upload = await receive_model_upload(request, store.staging_dir(), settings.max_upload_bytes)
    try:
        job, replayed = await run_in_threadpool(
            jobs.submit_job, session, settings, store, tenant, upload, idempotency_key
        )
    finally:
        upload.discard()

    metrics = request.app.state.metrics
    metrics.upload_bytes.inc(upload.size)
    if not replayed:
        metrics.jobs_submitted.labels(str(job.cached_from_job_id is not None).lower()).inc()
        if job.status == JobStatus.queued:
            await run_in_threadpool(jobs.enqueue, job.id, settings)
    return _created(request, job, replayed=replayed)
