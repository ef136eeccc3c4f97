"""The composition root: where the layers are put together into one running service.

The layers import downward only: ``flexdsa_core`` (the compiler, a pure library) <- ``service`` (the API,
its persistence, the job queue's contract) <- ``workers`` (the Celery tasks and the in-process worker that
run the compiler) <- ``stack`` (this package). ``create_app`` is the API with the embedded worker plugged in,
what ``flexdsa serve`` and ``uvicorn stack:create_app --factory`` run; a distributed API needs nothing
plugged in (it publishes jobs to the broker by task name) and may run ``service.app:create_app`` alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import FastAPI

    from service.core.config import Settings

__all__ = ["create_app"]


def create_app(settings: Settings | None = None) -> FastAPI:
    """The whole service: the API, and in embedded mode the in-process worker that runs its jobs."""
    # Imported here: every `flexdsa` command loads this package to register `serve`, and the API and the
    # workers are not needed to run `flexdsa optimize` (a third of a second of its start-up).
    from service.app import create_app as create_service_app
    from workers import inprocess

    return create_service_app(settings, embedded_worker=inprocess)
