"""``flexdsa serve``: the API with its embedded worker (the composition root's command; registered through
the ``flexdsa.cli`` entry point like the service's own commands)."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from service.cli import fail, prepared_engine, settings_or_exit


def serve(
    host: Annotated[str | None, typer.Option(help="Bind address (default FLEXDSA_HOST or 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default FLEXDSA_PORT or 8000)")] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=64,
            help="API processes sharing the port (default FLEXDSA_API_WORKERS, else one per core, at most 8): big "
            "uploads are received, hashed and written on as many cores. In embedded mode each process runs its "
            "own worker.",
        ),
    ] = None,
) -> None:
    """Start the service. Embedded (no FLEXDSA_BROKER_URL): migrates SQLite and runs the worker in-process."""
    import uvicorn

    from service.auth.keys import ensure_tenant
    from service.core.db import make_session_factory, session_scope
    from stack import create_app

    settings = settings_or_exit()
    overrides = {k: v for k, v in {"host": host, "port": port, "api_workers": workers}.items() if v is not None}
    settings = settings.model_copy(update=overrides)
    settings = settings.model_copy(update={"api_workers": settings.api_processes()})
    _check_port_free(settings.host, settings.port)  # before anything starts: one line naming --port
    engine = prepared_engine(settings)
    if settings.auth == "optional":
        with session_scope(make_session_factory(engine)) as session:
            ensure_tenant(session, settings.default_tenant)
    engine.dispose()
    if settings.auth == "optional" and settings.host not in ("127.0.0.1", "localhost", "::1"):
        typer.secho(
            f"Warning: listening on {settings.host} without API keys (FLEXDSA_AUTH=optional): anyone who can "
            "reach this port acts as the default tenant. Set FLEXDSA_AUTH=required and create keys.",
            fg="yellow",
            err=True,
        )
    processes = f", {settings.api_workers} API processes" if settings.api_workers > 1 else ""
    typer.echo(
        f"Flex-DSA {settings.mode} mode on http://{settings.host}:{settings.port} "
        f"(artifacts {settings.artifact_url or settings.artifact_dir}, auth {settings.auth}{processes}); "
        f"jobs and API keys are read from {settings.database_shown()}"
    )
    from service.core.logs import configure_logging

    configure_logging(settings.log_format, settings.log_level)
    # log_config=None: uvicorn keeps the handlers configured above instead of installing its own.
    if settings.api_workers == 1:
        uvicorn.run(
            create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level,
            log_config=None,
        )
        return
    # Several processes: uvicorn starts each from an import string, and each reads its settings from the
    # environment, so this command's own overrides travel there first (the database is migrated above, once).
    os.environ.update({"FLEXDSA_HOST": settings.host, "FLEXDSA_PORT": str(settings.port)})
    uvicorn.run(
        "stack.cli:process_app", factory=True, workers=settings.api_workers, host=settings.host,
        port=settings.port, log_level=settings.log_level, log_config=None,
    )


def _check_port_free(host: str, port: int) -> None:
    """Exit with one line when the port is taken, rather than uvicorn's log record after start-up."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no conflict
        try:
            probe.bind((host, port))
        except OSError as err:
            taken = err.errno == errno.EADDRINUSE
            reason = "is already in use (another `flexdsa serve`?)" if taken else f"cannot be bound ({err.strerror})"
            raise fail(
                f"Port {port} on {host} {reason}: choose another with --port N (or FLEXDSA_PORT), "
                "or stop what holds it."
                if taken
                else f"Port {port} on {host} {reason}: choose another with --port N or --host."
            ) from None


def process_app():
    """One API process of ``flexdsa serve --workers N``: its logging, then the app (settings from the
    environment, as the parent process set it)."""
    from service.core.config import get_settings
    from service.core.logs import configure_logging
    from stack import create_app

    settings = get_settings()
    configure_logging(settings.log_format, settings.log_level)
    return create_app(settings)


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
