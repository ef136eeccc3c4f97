"""The HTTP contract of job groups: one upload compared across several targets."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from service.jobs.schemas import JobStatusName


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
