"""The HTTP contract (pydantic models behind the OpenAPI schema at /docs)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

JobStatusName = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class ErrorBody(BaseModel):
    code: str = Field(..., examples=["invalid_model"])
    message: str
    details: Any = Field(default_factory=dict)


class ErrorResponse(BaseModel):
    error: ErrorBody


# Documented on every route; FastAPI's own 422 schema is replaced by ours.
ERROR_RESPONSES: dict[int | str, dict] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in {
        401: "Missing or wrong API key",
        404: "Not found (or not yours)",
        422: "Invalid request",
        500: "Internal error",
    }.items()
}


class JobCreated(BaseModel):
    job_id: str
    status: JobStatusName
    status_url: str
    cached: bool = Field(
        ..., description="True when answered at once from an identical earlier job's artifacts."
    )


class JobError(BaseModel):
    code: str
    message: str
    details: Any = None


class JobLinks(BaseModel):
    self: str
    events: str
    artifacts: str


class RequirementOut(BaseModel):
    expr: str = Field(..., description="The requirement, e.g. 'speedup>=1.2' or 'no_regression'.")
    figure: Any = Field(None, description="The job's figure (null: not known); no_regression: the worse figures.")
    met: bool
    detail: str = Field("", description="The figure with its source, or why it is not known / what regressed.")


class FigureChange(BaseModel):
    figure: str
    current: float | None
    previous: float | None
    change: float | None = Field(None, description="Relative for latency_ms and bundle_mb, absolute otherwise.")
    regressed: bool | None = Field(None, description="null: not compared (a figure missing, or another source).")
    rule: str


class PreviousJobOut(BaseModel):
    job_id: str
    rows: list[FigureChange]


class JobOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    status: JobStatusName
    stage: str | None
    progress: float = Field(..., ge=0, le=1)
    progress_percent: float
    target: str
    model_filename: str
    model_size: int
    model_sha256: str
    spec: dict[str, Any]
    attempts: int
    max_attempts: int
    cancel_requested: bool
    cached_from_job_id: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    updated_at: datetime
    queued_seconds: float | None = Field(None, description="From submission to a worker starting it.")
    run_seconds: float | None = Field(None, description="From start to finish (or to now while running).")
    report_summary: dict[str, Any] | None = Field(
        ...,
        description="The report's summary. `speedup` is the job's one headline figure; `headline` gives it "
        "with its interval, verdict ('no significant difference' on a tie) and source ('this CPU, measured', "
        "'vendor estimate', 'roofline estimate') and what it divides. `figures` is the report's: per bucket one "
        "latency and one energy, each with its source, `text`/`label` as every surface shows it and `complete` (False: "
        "a lower bound, `left_out` naming what it leaves out), and the accuracy of the model that ships "
        "(`numerics_only` on synthetic inputs). `gate_figures`, `previous` and `requirements`: the gates. CPU "
        "latencies appear only where the target is this CPU.",
    )
    parent_job_id: str | None = Field(
        None, description="The job whose bundle this one re-specialised from its traffic (POST /jobs/{id}/respecialise)."
    )
    bundle_version: int = Field(1, description="1 for a submitted model; one more per re-specialisation.")
    group_id: str | None = Field(
        None, description="The job group this job is one target of (GET /groups/{id}: the comparison)."
    )
    model_name: str | None = Field(
        None, description="The model this job is a version of (the spec's model_name, else the file's stem)."
    )
    requirements: list[RequirementOut] | None = Field(
        None,
        description="Once the job has succeeded, one verdict per requirement of its spec: the figure it was judged "
        "on and whether it is met. A job that misses one still succeeds (its artifacts are real); flexdsa submit "
        "exits 3.",
    )
    previous: PreviousJobOut | None = Field(
        None,
        description="Once the job has succeeded: the previous successful job of the same model_name on the same "
        "target, and the figures side by side (null: none before it).",
    )
    error: JobError | None
    links: JobLinks


class JobPage(BaseModel):
    items: list[JobOut]
    total: int
    limit: int
    offset: int | None
    next_cursor: str | None = Field(
        None, description="Pass as ?cursor= for the next page (stable under inserts)."
    )


class JobEventOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    at: datetime
    kind: str
    status: JobStatusName
    stage: str | None
    progress: float
    message: str | None


class ArtifactOut(BaseModel):
    name: str
    size: int
    content_type: str
    sha256: str
    created_at: datetime
    url: str


class ArtifactList(BaseModel):
    job_id: str
    items: list[ArtifactOut]


class TargetSummary(BaseModel):
    name: str
    vendor: str
    version: str
    description: str
    dtypes: list[str]
    static_shapes: bool
    checks: str = Field(..., description="How a bundle for this target is checked on this service.")
    toolchain: str | None = Field(None, description="The vendor toolchain that compiles its bundles, if one installs.")
    toolchain_ready: bool = False
    url: str


class FusionRuleOut(BaseModel):
    name: str
    summary: str
    produces: list[str]


class TargetDetail(BaseModel):
    name: str
    spec: dict[str, Any]
    fusion_rules: list[FusionRuleOut] = Field(
        ..., description="Rule names a request may switch off with spec.disabled_rules."
    )
    switchable: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Every name spec.disabled_rules accepts on this target, by kind: generic passes, "
        "fusion rules, the target's own rewrites.",
    )


class KernelCacheStats(BaseModel):
    entries: int | None = Field(
        None, description="Durable (database) entries, shared by all tenants: in the service view only."
    )
    stored_hits: int | None = Field(
        None, description="Hits recorded on durable entries: in the service view only."
    )
    hits: int | None = Field(None, description="All layers, counted by the workers for this view's jobs.")
    misses: int | None = None
    seconds_saved: float | None = None
    redis: dict[str, Any] | None = None


class JobCacheStats(BaseModel):
    hits: int = Field(..., description="Jobs answered from an identical earlier job (this view's jobs).")
    jobs: int


class CacheStatsOut(BaseModel):
    scope: Literal["tenant", "service"] = Field(
        ..., description="'tenant': the caller's own counters; 'service': all tenants (operator token)."
    )
    kernel_cache: KernelCacheStats
    job_cache: JobCacheStats


class Health(BaseModel):
    status: str = Field(description="'ok', or 'degraded' while a dependency is unreachable (the process is up)")
    version: str
    mode: str
    dependencies: dict[str, str] = Field(
        default_factory=dict, description="database / broker / redis: 'ok' or 'down: <first line of the error>'"
    )


class Readiness(BaseModel):
    status: str
    checks: dict[str, str]


class IncidentSummary(BaseModel):
    id: str
    job_id: str | None
    tenant_id: int | None
    attempt: int
    code: str
    summary: str
    created_at: datetime


class IncidentOut(IncidentSummary):
    traceback: str = Field(description="The traceback, or the pipeline process's last output for a crash")


# --- job groups: one upload compared across several targets ----------------------------------------------


class GroupJob(BaseModel):
    job_id: str
    target: str
    status: JobStatusName
    progress: float = Field(..., ge=0, le=1)
    status_url: str
    cached: bool


class GroupCreated(BaseModel):
    group_id: str
    status_url: str = Field(..., description="GET it for the group's state and the comparison.")
    jobs: list[GroupJob] = Field(..., description="One job per target, each an ordinary job (GET /jobs/{id}).")


class GroupOut(BaseModel):
    id: str
    status: Literal["queued", "running", "succeeded", "failed", "partial"] = Field(
        ..., description="'partial': every job has ended and some, not all, succeeded."
    )
    model_filename: str
    model_sha256: str
    targets: list[str]
    created_at: datetime
    jobs: list[GroupJob]
    comparison: list[dict[str, Any]] = Field(
        ...,
        description="One row per target, in the request's order: estimated latency and energy, accuracy, "
        "the accelerator's share of FLOPs, CPU-fallback nodes, bundle bytes and the vendor-alone baseline, "
        "each figure with its 'source' (measured on this CPU, roofline estimate, vendor estimate or "
        "simulator, held-out samples, ONNX Runtime validation, not known). A job not (yet) succeeded has "
        "its 'status' and, when it failed, its 'error'.",
    )
