"""POST /optimize: upload a model and a request spec, get a job."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from service.core.models import Job, JobGroup
from service.core.schemas import ERROR_RESPONSES, ErrorResponse
from service.deps import AdmittedSubmit, SessionDep, SettingsDep, StoreDep
from service.groups import service as groups
from service.groups.schemas import GroupCreated
from service.jobs.schemas import JobCreated
from service.jobs.upload import check_content_length, complete_on_upload_thread, receive_model_upload

router = APIRouter(tags=["jobs"])

# The body is parsed by hand (service/jobs/upload.py, streamed), so its schema is declared here. The spec
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
                            "description": 'RequestSpec as a JSON string, e.g. {"target": "cpu-ort"}; or, '
                            'to compare one model across targets, "targets" in place of "target": a list of '
                            'names or "all" (one job group, one job per target; answered with GroupCreated)',
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


def _group_created(request: Request, group: JobGroup, *, replayed: bool) -> JSONResponse:
    body = groups.group_created(group, request.scope.get("root_path", ""))
    headers = {"Location": body.status_url, **({"Idempotent-Replayed": "true"} if replayed else {})}
    return JSONResponse(body.model_dump(), status_code=202, headers=headers)


@router.post(
    "/optimize",
    status_code=202,
    response_model=JobCreated | GroupCreated,
    summary="Submit a model for optimisation (one target, or several compared)",
    openapi_extra=_MULTIPART_BODY,
    responses={
        **ERROR_RESPONSES,
        413: {"model": ErrorResponse, "description": "Model larger than FLEXDSA_MAX_UPLOAD_BYTES"},
        429: {"model": ErrorResponse, "description": "Too many jobs queued or running, or submitted in the last minute, for this tenant (Retry-After)"},
        503: {"model": ErrorResponse, "description": "A dependency or the service's storage is unavailable; nothing was queued (Retry-After)"},
        507: {"model": ErrorResponse, "description": "The service's upload storage is full; nothing was queued (Retry-After)"},
    },
)
async def optimize(
    request: Request,
    admission: AdmittedSubmit,
    session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
) -> JSONResponse:
    # The admission decided everything that depends only on the key before a byte of the body was read: an
    # Idempotency-Key retry gets the first request's job, an over-limit tenant its 429.
    if admission.replayed is not None:
        if admission.replayed.group_id is not None:
            group_id = admission.replayed.group_id
            return await run_in_threadpool(
                lambda: _group_created(request, session.get(JobGroup, group_id), replayed=True)
            )
        return _created(request, admission.replayed, replayed=True)

    check_content_length(request, settings.max_upload_bytes)
    pending = await receive_model_upload(
        request, store.staging_dir(), settings.max_upload_bytes, durable=store.keeps_staged_files
    )
    if pending.streamed:
        # A large body's last piece and its fsync stay on the upload threads, off the request pool.
        received = await complete_on_upload_thread(pending)
    else:
        received = pending  # completed inside accept_upload: a small submit costs one hand-off from here
    job, replayed, size = await run_in_threadpool(
        groups.accept_upload, session, settings, store, admission.tenant, received, admission.idempotency_key
    )
    if isinstance(job, JobGroup):
        request.app.state.metrics.upload_bytes.inc(size)
        response = await run_in_threadpool(_group_created, request, job, replayed=replayed)
        if not replayed:
            for member in job.jobs:  # loaded by _group_created
                cached = member.cached_from_job_id is not None
                request.app.state.metrics.jobs_submitted.labels(str(cached).lower()).inc()
        return response

    metrics = request.app.state.metrics
    metrics.upload_bytes.inc(size)
    if not replayed:
        metrics.jobs_submitted.labels(str(job.cached_from_job_id is not None).lower()).inc()
    return _created(request, job, replayed=replayed)
