"""The composition root: where the layers are put together into one running service.

The layers import downward only: ``flexdsa_core`` (the compiler, a pure library) <- ``service`` (the API,
its persistence, the job queue's contract) <- ``workers`` (the Celery tasks and the in-process worker that
run the compiler) <- ``stack`` (this package). ``create_app`` is the API with the embedded worker plugged in,
what ``flexdsa serve`` and ``uvicorn stack:create_app --factory`` run; a distributed API needs nothing
plugged in (it publishes jobs to the broker by task name) and may run ``service.app:create_app`` alone.
"""

from __future__ import annotations

from fastapi import FastAPI

from service.app import create_app as create_service_app
from service.config import Settings
from workers import inprocess

__all__ = ["create_app"]


def create_app(settings: Settings | None = None) -> FastAPI:
    """The whole service: the API, and in embedded mode the in-process worker that runs its jobs."""
    return create_service_app(settings, embedded_worker=inprocess)
