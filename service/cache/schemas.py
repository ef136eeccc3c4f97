"""The HTTP contract of the cache statistics."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


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
