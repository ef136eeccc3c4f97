"""The error body every route answers with, in the HTTP contract (the OpenAPI schema at /docs)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


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
