"""Liveness and readiness (unauthenticated, for orchestrators) and metrics (operators only: Prometheus
scrapes with ``Authorization: Bearer <FLEXDSA_OPERATOR_TOKEN>``).

A dependency's error line names hosts and ports (``connection to 10.0.3.7:5432 refused``): only an operator
(the bearer token, or in embedded mode a loopback client) reads it; anyone else reads which check failed and
the kind of error, and the line goes to the log."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from flexdsa_core import __version__
from service.core.db import DatabaseNotMigratedError, check_migrated
from service.core.errors import NotReady
from service.core.schemas import ErrorResponse
from service.deps import IsOperator, OperatorOnly, loopback_stands_in_for_operator
from service.health.schemas import Health, Readiness

log = logging.getLogger("flexdsa.service")
router = APIRouter(tags=["operations"])


@router.get(
    "/healthz",
    response_model=Health,
    summary="The process is up (always 200), and which of its dependencies answer right now",
)
def healthz(request: Request, is_operator: IsOperator) -> Health:
    app, settings = request.app, request.app.state.settings
    detailed = is_operator or loopback_stands_in_for_operator(request, settings)
    checks: dict[str, tuple] = {"database": (_ping_database, app)}
    if settings.broker_url:
        checks["broker"] = (_check_broker, settings.broker_url)
    if settings.redis_url:
        checks["redis"] = (_check_redis, settings.redis_url)
    dependencies = {}
    for name, (check, *args) in checks.items():
        try:
            check(*args)
            dependencies[name] = "ok"
        except Exception as err:
            dependencies[name] = f"down: {_reason(err, detailed)}"
    status = "ok" if all(state == "ok" for state in dependencies.values()) else "degraded"
    return Health(status=status, version=__version__, mode=settings.mode, dependencies=dependencies)


def _ping_database(app) -> None:
    with app.state.engine.connect() as connection:
        connection.execute(text("SELECT 1"))


def _check_database(app) -> None:
    with app.state.engine.connect() as connection:
        connection.execute(text("SELECT 1"))
    check_migrated(app.state.engine)


def _check_redis(url: str) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
    finally:
        client.close()


def _check_broker(url: str) -> None:
    if url.startswith(("redis://", "rediss://")):
        return _check_redis(url)
    from kombu import Connection

    with Connection(url, connect_timeout=2) as connection:
        connection.ensure_connection(max_retries=1)


def _first_line(err: Exception) -> str:
    text_ = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text_[0] if text_ else ''}"


def _reason(err: Exception, detailed: bool) -> str:
    """The error's first line for an operator; its kind alone for anyone else (the line is logged)."""
    if detailed:
        return _first_line(err)
    log.warning("dependency check failed: %s", _first_line(err))
    return f"{type(err).__name__} (the reason is in the service's log, or ask with the operator token)"


@router.get(
    "/readyz",
    response_model=Readiness,
    summary="Ready to take work: database reachable and migrated, broker/Redis reachable, artifacts writable",
    responses={503: {"model": ErrorResponse, "description": "Not ready; details.checks says what failed"}},
)
def readyz(request: Request, is_operator: IsOperator) -> Readiness:
    app, settings = request.app, request.app.state.settings
    detailed = is_operator or loopback_stands_in_for_operator(request, settings)
    checks: dict[str, tuple] = {
        "database": (_check_database, app),
        "artifact_store": (app.state.store.check_writable,),
    }
    if settings.broker_url:
        checks["broker"] = (_check_broker, settings.broker_url)
    if settings.redis_url:
        checks["redis"] = (_check_redis, settings.redis_url)
    results, failed = {}, []
    for name, (check, *args) in checks.items():
        try:
            check(*args)
            results[name] = "ok"
        except Exception as err:
            # The migration message is the point (it says what to run); other errors: their first line.
            results[name] = str(err) if isinstance(err, DatabaseNotMigratedError) else _reason(err, detailed)
            failed.append(name)
    if failed:
        raise NotReady(
            f"Not ready: {', '.join(failed)} failed. " + " ".join(results[n] for n in failed),
            details={"checks": results},
        )
    return Readiness(status="ready", checks=results)


@router.get(
    "/metrics",
    summary="Prometheus metrics (operators: Authorization: Bearer <FLEXDSA_OPERATOR_TOKEN>)",
    response_class=Response,
    dependencies=[OperatorOnly],
    responses={
        401: {"model": ErrorResponse, "description": "Operator token missing or wrong"},
        404: {"model": ErrorResponse, "description": "No operator token configured (distributed mode)"},
    },
)
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
