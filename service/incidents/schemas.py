"""The HTTP contract of incidents (operators only)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


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
