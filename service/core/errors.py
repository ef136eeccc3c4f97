"""Every error the service answers, and the ONE place where errors become HTTP responses.

Whatever goes wrong, the body has one shape: ``{"error": {"code": ..., "message": ..., "details": ...}}``.
``code`` is stable and machine-readable; ``message`` says what was wrong and what to do.
Domain errors from the core (``FlexDSAError``) carry their own code and status; the service's own
errors are ``ServiceError`` subclasses; framework errors (validation, 404 on unknown routes, 405...)
and unhandled exceptions are rewritten here too.
"""

from __future__ import annotations

import errno
import logging
import traceback
import uuid
from contextlib import contextmanager
from typing import Any

import sqlalchemy.exc
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from flexdsa_core import FlexDSAError
from service.core.db import DatabaseNotMigratedError
from service.storage.store import DISK_FULL_ERRNOS, ChecksumMismatchError, StoreUnavailableError

log = logging.getLogger("flexdsa.service")


class ServiceError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, details: Any = None, code: str | None = None, headers=None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details if details is not None else {}
        self.headers = headers
        if code is not None:
            self.code = code


class Unauthorized(ServiceError):
    status = 401
    code = "unauthorized"


class NotFound(ServiceError):
    status = 404
    code = "not_found"


class Conflict(ServiceError):
    status = 409
    code = "conflict"


class PayloadTooLarge(ServiceError):
    status = 413
    code = "payload_too_large"


class InvalidRequest(ServiceError):
    status = 422
    code = "invalid_request"


class QuotaExceeded(ServiceError):
    status = 429
    code = "quota_exceeded"


class NotReady(ServiceError):
    status = 503
    code = "not_ready"


class InsufficientStorage(ServiceError):
    """The service's own disk is full (or over quota): nothing the client sent was wrong, and the same
    request succeeds once space is freed."""

    status = 507
    code = "insufficient_storage"


class StorageUnavailable(ServiceError):
    """The service's disk failed a read or write for another reason (I/O error, read-only filesystem)."""

    status = 503
    code = "storage_unavailable"


# Seconds a client is told to wait after the service's own disk refused an upload.
STORAGE_RETRY_AFTER_S = 30


@contextmanager
def storage_io():
    """The service disk's failures (staging an upload, storing it) are the service's, not the client's:
    a full disk is 507, any other I/O error 503, each with Retry-After and logged with its traceback for
    the operator; never "could not be parsed", never a bare 500."""
    try:
        yield
    except StoreUnavailableError as err:
        # The object store is away (or refuses us): the client's upload was fine; nothing was queued.
        log.warning("artifact store unavailable: %s", err)
        raise StorageUnavailable(
            "The service's artifact store is unreachable right now; nothing was queued. Retry shortly.",
            code="artifact_store_unavailable",
            details={"dependency": "artifact_store"},
            headers={"Retry-After": str(DEPENDENCY_RETRY_AFTER_S)},
        ) from None
    except OSError as err:
        log.error("storage write failed: %s", err, exc_info=True)
        headers = {"Retry-After": str(STORAGE_RETRY_AFTER_S)}
        details = {"errno": errno.errorcode.get(err.errno, err.errno) if err.errno else None}
        if err.errno in DISK_FULL_ERRNOS:
            raise InsufficientStorage(
                "The service's upload storage is full; nothing was queued. Retry once an operator has freed space.",
                details=details,
                headers=headers,
            ) from None
        raise StorageUnavailable(
            "The service could not write the upload to its storage; nothing was queued. Retry shortly.",
            details=details,
            headers=headers,
        ) from None


_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "invalid_request",
    429: "quota_exceeded",
    500: "internal_error",
    503: "not_ready",
    507: "insufficient_storage",
}


def error_body(code: str, message: str, details: Any = None) -> dict:
    return {"error": {"code": code, "message": message, "details": jsonable_encoder(details or {})}}


def error_response(status: int, code: str, message: str, details: Any = None, headers=None) -> JSONResponse:
    return JSONResponse(error_body(code, message, details), status_code=status, headers=headers)


# While a dependency is away, every request that needs it answers 503 with this Retry-After (seconds): the
# outage is the service's, not the client's, and the same request succeeds once it is back (connections
# are pre-pinged, so the first request after the return reconnects without a restart).
DEPENDENCY_RETRY_AFTER_S = 5


def dependency_unavailable(exc: BaseException) -> str | None:
    """Which dependency an exception says is unreachable ('database', 'redis', 'broker', 'artifact_store'),
    or None.

    A database that is stopped, restarting or unreachable surfaces as the driver's OperationalError or
    InterfaceError (connection refused, server closed the connection, admin shutdown); a constraint or
    syntax error is a different class and stays a 500."""
    if isinstance(exc, StoreUnavailableError):
        return "artifact_store"
    if isinstance(exc, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
        return "database"
    if isinstance(exc, sqlalchemy.exc.DBAPIError) and exc.connection_invalidated:
        return "database"
    try:
        import redis.exceptions
    except ImportError:  # pragma: no cover - redis is a dependency of the service
        redis = None
    if redis is not None and isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
        return "redis"
    try:
        import kombu.exceptions
    except ImportError:  # pragma: no cover
        kombu = None
    if kombu is not None and isinstance(exc, kombu.exceptions.OperationalError):
        return "broker"
    return None


def _validation_details(errors) -> list[dict]:
    # Drop 'input' (it can echo a whole uploaded spec back) and 'url'; keep where and what.
    return [
        {"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type", "")}
        for err in errors
    ]


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message, exc.details, exc.headers)

    @app.exception_handler(FlexDSAError)
    async def _core_error(_request: Request, exc: FlexDSAError) -> JSONResponse:
        return error_response(exc.http_status, exc.code, exc.message, exc.details)

    @app.exception_handler(ChecksumMismatchError)
    async def _corrupt_blob(request: Request, exc: ChecksumMismatchError) -> JSONResponse:
        # The store handed back other bytes than the job stored: say so, never serve them.
        log.error("corrupt blob on %s %s: %s", request.method, request.url.path, exc)
        return error_response(
            502,
            "artifact_corrupt",
            "The artifact store holds other bytes than this job stored (sha256 mismatch); the download is "
            "refused. An operator must restore the blob, or the job be run again.",
            {"sha256": exc.key, "read_sha256": exc.actual},
        )

    @app.exception_handler(DatabaseNotMigratedError)
    async def _not_migrated(_request: Request, exc: DatabaseNotMigratedError) -> JSONResponse:
        return error_response(503, "database_not_migrated", str(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(
            422, "invalid_request", "The request is invalid; see details.", _validation_details(exc.errors())
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _STATUS_CODES.get(exc.status_code, "http_error")
        message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
        return error_response(exc.status_code, code, message, None, getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        dependency = dependency_unavailable(exc)
        if dependency is not None:
            log.warning("%s unavailable on %s %s: %s", dependency, request.method, request.url.path, exc)
            return error_response(
                503,
                f"{dependency}_unavailable",
                f"The service's {dependency} is unreachable right now; retry in a few seconds.",
                {"dependency": dependency},
                headers={"Retry-After": str(DEPENDENCY_RETRY_AFTER_S)},
            )
        incident = uuid.uuid4().hex[:12]
        log.exception(
            "unhandled error on %s %s; incident %s",
            request.method,
            request.url.path,
            incident,
            extra={"incident": incident},
        )
        trace = "".join(traceback.format_exception(exc))
        summary = f"Internal server error on {request.method} {request.url.path}"  # what the client saw
        await run_in_threadpool(_record_incident, request.app, incident, summary, trace)
        return error_response(
            500,
            "internal_error",
            f"Internal server error (incident {incident}); an operator finds its traceback with "
            f"`flexdsa incidents show {incident}`.",
            {"incident": incident},
        )


def _record_incident(app: FastAPI, incident: str, summary: str, trace: str) -> None:
    """The request's traceback in the incidents table, where an operator finds it from the id the client
    was given; should the database refuse, the log line above still has it."""
    from service.core.models import Incident

    factory = getattr(app.state, "session_factory", None)
    if factory is None:
        return
    try:
        with factory() as session:
            session.add(
                Incident(
                    id=incident, code="internal_error", summary=summary[:1000], traceback=trace[-200_000:]
                )
            )
            session.commit()
    except Exception as err:  # noqa: BLE001 - the error response must go out whatever the database says
        log.warning("incident %s: not recorded in the database (%s); the log has its traceback", incident, err)
