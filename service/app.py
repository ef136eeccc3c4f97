"""The FastAPI application: ``create_app(settings=None, *, embedded_worker=None)``.

The service is one package per resource (``service/jobs/``, ``service/groups/``, ...), each with its routes,
schemas and views; app-wide pieces live in ``service/core/``. Routers are found by discovery: every
``routes`` or ``*_routes`` module of a resource package that exports ``router`` is included, so a new endpoint
group is one new package (or one more ``*_routes`` module in its package). Start-up checks the database (embedded SQLite is
migrated on the spot; any other database must already be migrated) and, in embedded mode, starts the
in-process worker it was handed. The service never imports the workers: the composition root (``stack``)
hands the worker in, and jobs reach it through ``service.jobs.dispatch``. Without one, jobs stay queued in the
database (distributed mode publishes them to the broker instead).
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from contextlib import asynccontextmanager
from typing import Protocol

from fastapi import Depends, FastAPI
from starlette.concurrency import run_in_threadpool

import service
from flexdsa_core import __version__
from service.core.body_limit import BodyLimitMiddleware
from service.core.config import Settings, get_settings
from service.core.db import make_engine, make_session_factory, prepare_database
from service.core.errors import install_error_handlers
from service.core.input_checks import refuse_control_characters
from service.core.metrics import Metrics, MetricsMiddleware
from service.core.ratelimit import PROPOSAL, SUBMIT, TRAFFIC, RateLimiter
from service.storage.store import make_store

log = logging.getLogger("flexdsa.service")


class EmbeddedWorker(Protocol):
    """What embedded mode needs of an in-process worker (``workers.inprocess`` is one)."""

    def start(self, settings: Settings) -> object: ...

    def stop(self) -> None: ...


def discover_routers():
    for package in sorted(pkgutil.iter_modules(service.__path__), key=lambda i: i.name):
        if not package.ispkg:
            continue
        found = importlib.import_module(f"{service.__name__}.{package.name}")
        for info in sorted(pkgutil.iter_modules(found.__path__), key=lambda i: i.name):
            if info.name != "routes" and not info.name.endswith("_routes"):
                continue
            module = importlib.import_module(f"{found.__name__}.{info.name}")
            router = getattr(module, "router", None)
            if router is not None:
                yield f"{package.name}.{info.name}", router


@asynccontextmanager
async def lifespan(app: FastAPI):
    settings: Settings = app.state.settings
    await run_in_threadpool(prepare_database, settings, app.state.engine)
    # Which database answers for API keys: a key made by `flexdsa keys create` elsewhere is in another one.
    log.info("API keys are read from %s (auth %s)", settings.database_shown(), settings.auth)
    # Submits check rule names against every target's registry, which imports the compiler's rules (about a
    # second): done here, so that the first user's request does not pay for it.
    await run_in_threadpool(_warm_registries)
    worker: EmbeddedWorker | None = app.state.embedded_worker
    if not (settings.mode == "embedded" and settings.embedded_worker):
        worker = None
    if worker is not None:
        await run_in_threadpool(worker.start, settings)
    try:
        yield
    finally:
        if worker is not None:
            await run_in_threadpool(worker.stop)
        if app.state.redis is not None:
            app.state.redis.close()
        app.state.engine.dispose()


def _cache_stats(settings: Settings, session_factory) -> dict:
    from service.cache.stats import read_cache_stats

    return read_cache_stats(settings, session_factory)


def _warm_registries() -> None:
    from flexdsa_core.preflight import switchable_names
    from flexdsa_core.targets import list_targets

    for target in list_targets():
        switchable_names(target)


def _redis_client(settings: Settings):
    if not settings.redis_url:
        return None
    import redis

    return redis.Redis.from_url(settings.redis_url, socket_connect_timeout=2, socket_timeout=5)


def _install_openapi(app: FastAPI) -> None:
    """Add the RequestSpec schema (the upload's 'spec' field, parsed by hand) to the OpenAPI components."""
    from fastapi.openapi.utils import get_openapi

    from flexdsa_core import RequestSpec

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            spec_schema = RequestSpec.model_json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(spec_schema.pop("$defs", {}))
            components["RequestSpec"] = spec_schema
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi


def create_app(settings: Settings | None = None, *, embedded_worker: EmbeddedWorker | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(
        title="Flex-DSA",
        version=__version__,
        description="Verified ONNX model optimisation for edge accelerators. Authenticate with your API key "
        "in the `X-API-Key` header or as `Authorization: Bearer <key>`. Every error answers "
        '`{"error": {"code", "message", "details"}}`.',
        lifespan=lifespan,
        # /docs is served by service/dashboard/docs_routes.py with local assets (FastAPI's own loads them from a CDN);
        # ReDoc would need a CDN too, and Swagger UI covers it.
        docs_url=None,
        redoc_url=None,
        # Before every route's own dependencies: hostile strings never reach the tenant lookup or a query.
        dependencies=[Depends(refuse_control_characters)],
    )
    app.state.settings = settings
    app.state.embedded_worker = embedded_worker
    app.state.engine = make_engine(settings.database_url)
    app.state.session_factory = make_session_factory(app.state.engine)
    app.state.store = make_store(settings)
    app.state.redis = _redis_client(settings)
    app.state.rate_limiter = RateLimiter(
        {
            SUBMIT.name: settings.submit_rate_per_minute,
            TRAFFIC.name: settings.traffic_rate_per_minute,
            PROPOSAL.name: settings.proposal_rate_per_minute,
        },
        app.state.redis,
    )
    app.state.metrics = Metrics(app.state.session_factory, lambda: _cache_stats(settings, app.state.session_factory))

    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware)  # inside the metrics: a 413 is counted
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    for _name, router in discover_routers():
        app.include_router(router)
    _install_openapi(app)
    return app
