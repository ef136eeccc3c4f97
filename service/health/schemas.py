"""The HTTP contract of liveness and readiness."""

from __future__ import annotations

from pydantic import BaseModel, Field


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
