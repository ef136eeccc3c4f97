"""The HTTP contract of jobs: submission, state, events and artifacts."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

JobStatusName = Literal["queued", "running", "succeeded", "failed", "cancelled"]


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
