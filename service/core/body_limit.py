"""Every request body is bounded before it is read.

FastAPI reads a route's whole JSON or form body before it solves the route's dependencies, so without a bound
an unauthenticated client could make the API buffer a body of any size (a 400 MB body to a made-up job id was
answered 401 after the API's memory had grown by 1.2 GB). Two layers stop that:

- ``BodyLimitMiddleware``, a pure ASGI middleware outside every route: a request whose ``Content-Length``
  exceeds its path's limit is answered 413 before a byte of the body is read; a chunked body is counted as
  it arrives and cut off at the limit (413). ``POST /optimize`` is left to ``service.jobs.upload``, which streams
  the upload to disk under ``FLEXDSA_MAX_UPLOAD_BYTES`` after the key, the quota and the rate limit passed.
- ``json_body(Model)``, a dependency for JSON bodies read only after the route's other dependencies (the
  API key, the job's owner): routes that take one declare it after ``JobOfCurrentTenant``, so a request with
  no key or for a job the caller does not own is refused without its body being read at all.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.errors import InvalidRequest, PayloadTooLarge, error_body

KiB, MiB = 1024, 1024 * 1024
# Control bodies (a re-specialisation request, a policy, a dashboard form) are a few hundred bytes.
DEFAULT_LIMIT = 256 * KiB
# A runtime's traffic snapshot: at most 4096 entries (service.traffic.service.MAX_BODY_BYTES).
TRAFFIC_LIMIT = 2 * MiB
# (method, path) -> limit; None: the route bounds its own body while streaming it.
_LIMITS: list[tuple[str, re.Pattern[str], int | None]] = [
    ("POST", re.compile(r"/optimize/?"), None),
    ("POST", re.compile(r"/jobs/[^/]+/traffic/?"), TRAFFIC_LIMIT),
]

Model = TypeVar("Model", bound=BaseModel)


def body_limit(method: str, path: str) -> int | None:
    """The most bytes a request body to ``method path`` may have (None: the route bounds it itself)."""
    for route_method, pattern, limit in _LIMITS:
        if method == route_method and pattern.fullmatch(path):
            return limit
    return DEFAULT_LIMIT


def too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"The request body is larger than the {limit} bytes this endpoint accepts.",
        details={"limit": limit},
    )


class BodyLimitMiddleware:
    """413 for a body over its path's limit: at once when ``Content-Length`` says so, else once the bytes
    received pass it (the route's read then fails and nothing more is taken from the socket)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        root = scope.get("root_path", "")
        path = scope["path"].removeprefix(root) if root else scope["path"]
        limit = body_limit(scope["method"], path)
        if limit is None:
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _answer_413(send, limit)
            return
        await self.app(scope, _counting(receive, limit), send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _counting(receive: Receive, limit: int) -> Receive:
    received = 0

    async def bounded() -> Message:
        nonlocal received
        message = await receive()
        if message["type"] == "http.request":
            received += len(message.get("body", b""))
            if received > limit:
                # An HTTPException passes through FastAPI's body reading (other errors become a 400 there);
                # the service's handler writes it in the one error shape.
                from starlette.exceptions import HTTPException

                raise HTTPException(413, detail=too_large(limit).message)
        return message

    return bounded


async def _answer_413(send: Send, limit: int) -> None:
    error = too_large(limit)
    body = json.dumps(error_body(error.code, error.message, error.details)).encode()
    await send({
        "type": "http.response.start",
        "status": 413,
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


async def bounded_body(request: Request, limit: int) -> bytes:
    """The body, read only up to ``limit`` bytes (413 past it, the rest never buffered)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def json_body(model: type[Model], limit: int = DEFAULT_LIMIT) -> Callable[..., Any]:
    """A dependency returning the request's JSON body parsed as ``model``, read after the dependencies declared
    before it in the route (declare it after the key and ownership checks). Errors answer 422 in the
    service's shape, naming the field."""

    async def parse(request: Request) -> Model:
        raw = await bounded_body(request, limit)
        if not raw.strip():
            raise InvalidRequest(
                f"This endpoint takes a JSON body ({model.__name__}); send at least {{}}.",
                details=[{"loc": ["body"], "msg": "Field required", "type": "missing"}],
            )
        try:
            return model.model_validate_json(raw)
        except ValidationError as err:
            details = [
                {"loc": ["body", *err_["loc"]], "msg": err_["msg"], "type": err_["type"]} for err_ in err.errors()
            ]
            raise InvalidRequest("The request body is invalid; see details.", details=details) from None

    return parse


def request_body_schema(model: type[BaseModel]) -> dict:
    """``openapi_extra`` declaring ``model`` as a route's JSON body (the body is read by ``json_body``, so
    FastAPI does not see it): the schema stands alone, its ``$defs`` written in place."""
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def expand(node):
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return expand(dict(defs[ref.removeprefix("#/$defs/")]))
            return {key: expand(value) for key, value in node.items()}
        if isinstance(node, list):
            return [expand(item) for item in node]
        return node

    return {"requestBody": {"required": True, "content": {"application/json": {"schema": expand(schema)}}}}
