"""Service commands for the ``flexdsa`` CLI (registered through the ``flexdsa.cli`` entry point):
``db upgrade``, ``keys create``, ``keys revoke``, ``incidents``, ``store init``, ``store abort-uploads``,
``worker``. ``serve`` starts the API with
its embedded worker, so it lives with the composition root (``stack.cli``)."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

db_app = typer.Typer(no_args_is_help=True, help="Database schema (Alembic migrations).")
keys_app = typer.Typer(no_args_is_help=True, help="API keys of tenants.")
incidents_app = typer.Typer(no_args_is_help=True, help="Internal errors with their tracebacks (operators).")
store_app = typer.Typer(no_args_is_help=True, help="The artifact store (an S3-compatible bucket).")


def settings_or_exit():
    from pydantic import ValidationError

    from service.core.config import get_settings

    try:
        return get_settings()
    except ValidationError as err:
        messages = "\n".join(e["msg"].removeprefix("Value error, ") for e in err.errors())
        typer.secho(f"Invalid configuration:\n{messages}", fg="red", err=True)
        raise typer.Exit(2) from None


def prepared_engine(settings):
    """An engine on a database ready for this code (embedded SQLite migrated on the spot), or a clear exit:
    not migrated, or not reachable."""
    from sqlalchemy.exc import OperationalError

    from service.core.db import DatabaseNotMigratedError, make_engine, prepare_database

    engine = make_engine(settings.database_url)
    try:
        prepare_database(settings, engine)
    except DatabaseNotMigratedError as err:
        engine.dispose()
        raise fail(str(err)) from None
    except OperationalError as err:
        where = engine.url.render_as_string(hide_password=True)
        engine.dispose()
        raise fail(f"Cannot reach the database {where}: {str(err.orig).strip()}") from None
    return engine


def fail(message: str) -> typer.Exit:
    typer.secho(message, fg="red", err=True)
    return typer.Exit(1)


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Argument(help="Target revision")] = "head") -> None:
    """Migrate the database at FLEXDSA_DATABASE_URL to the latest schema."""
    from service.core.db import current_revision, make_engine, upgrade

    settings = settings_or_exit()
    engine = make_engine(settings.database_url)
    try:
        upgrade(engine, revision)
        typer.echo(
            f"Database {engine.url.render_as_string(hide_password=True)} at revision {current_revision(engine)}."
        )
    except Exception as err:
        raise fail(f"Migration failed: {err}") from None
    finally:
        engine.dispose()


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="Tenant name (created if missing)")],
    name: Annotated[str, typer.Option(help="A label for this key")] = "",
) -> None:
    """Create an API key and print it. It is shown once: only its hash is stored."""
    from service.auth.keys import check_key_label, check_tenant_name, create_api_key
    from service.core.db import make_session_factory, session_scope

    try:  # refused before the database is touched
        check_tenant_name(tenant)
        check_key_label(name)
    except ValueError as err:
        raise fail(f"{err} Choose a plain name, e.g. --tenant acme.") from None
    settings = settings_or_exit()
    engine = prepared_engine(settings)
    try:
        with session_scope(make_session_factory(engine)) as session:
            key, row = create_api_key(session, tenant, name)
            prefix = row.prefix
    finally:
        engine.dispose()
    typer.echo(key)
    # The key works only on a server reading this database: say which, since embedded mode's is per directory.
    where = (
        "a server started in this directory (or with FLEXDSA_DATA_DIR / FLEXDSA_DATABASE_URL naming it) reads it"
        if settings.is_sqlite
        else "servers with this FLEXDSA_DATABASE_URL read it"
    )
    typer.echo(
        f"(tenant {tenant!r}, key prefix {prefix}; store it now, it cannot be shown again. Written to "
        f"{settings.database_shown()}: {where}.)",
        err=True,
    )


@keys_app.command("revoke")
def keys_revoke(
    prefix: Annotated[str, typer.Argument(help="The key's prefix (the part after 'fdsa_')")],
) -> None:
    """Revoke a key by its prefix."""
    from service.auth.keys import revoke_api_key
    from service.core.db import make_engine, make_session_factory, session_scope

    engine = make_engine(settings_or_exit().database_url)
    with session_scope(make_session_factory(engine)) as session:
        count = revoke_api_key(session, prefix)
    engine.dispose()
    if not count:
        raise fail(f"No active key with prefix {prefix!r}.")
    typer.echo(f"Revoked {count} key(s).")


def worker(
    concurrency: Annotated[int | None, typer.Option(help="Worker processes (default: CPU count)")] = None,
    queues: Annotated[str | None, typer.Option(help="Comma-separated queues to consume")] = None,
    loglevel: Annotated[str, typer.Option(help="Celery log level")] = "INFO",
) -> None:
    """Run a Celery worker (distributed mode). Each process takes one job at a time."""
    settings = settings_or_exit()
    if settings.mode != "distributed":
        raise fail(
            "`flexdsa worker` needs FLEXDSA_BROKER_URL (distributed mode); `flexdsa serve` runs "
            "an in-process worker in embedded mode."
        )
    # One job per process at a time, no prefetching: jobs are long, and a prefetched job would wait
    # behind a running one while another worker sits idle.
    args = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "workers.app",
        "worker",
        "--loglevel",
        loglevel,
        "--prefetch-multiplier",
        "1",
        "-O",
        "fair",
    ]
    if concurrency:
        args += ["--concurrency", str(concurrency)]
    if queues:
        args += ["--queues", queues]
    os.execv(sys.executable, args)


def _incident_rows(query):
    from service.core.db import make_engine, make_session_factory

    settings = settings_or_exit()
    engine = make_engine(settings.database_url)
    try:
        with make_session_factory(engine)() as session:
            return query(session)
    finally:
        engine.dispose()


@incidents_app.command("list")
def incidents_list(limit: Annotated[int, typer.Option(help="How many, newest first")] = 20) -> None:
    """Recent incidents: id, time, job, code and the sentence the user saw."""
    from sqlalchemy import select

    from service.core.models import Incident

    rows = _incident_rows(
        lambda s: s.scalars(select(Incident).order_by(Incident.created_at.desc()).limit(limit)).all()
    )
    if not rows:
        typer.echo("No incidents.")
    for row in rows:
        typer.echo(f"{row.id}  {row.created_at:%Y-%m-%d %H:%M:%S}  job {row.job_id}  {row.code}  {row.summary[:100]}")


@incidents_app.command("show")
def incidents_show(incident_id: Annotated[str, typer.Argument(help="The id the user quoted")]) -> None:
    """One incident: its job, tenant, attempt and the whole traceback."""
    from service.core.models import Incident

    row = _incident_rows(lambda s: s.get(Incident, incident_id.strip()))
    if row is None:
        raise fail(f"No incident {incident_id!r} in this database.")
    where = (
        f"job {row.job_id} (tenant {row.tenant_id}, attempt {row.attempt})"
        if row.job_id or row.attempt
        else "an API request (no job)"
    )
    typer.echo(
        f"incident {row.id} at {row.created_at:%Y-%m-%d %H:%M:%S %Z}\n{where}: {row.code}\n{row.summary}\n\n"
        f"{row.traceback}"
    )


@store_app.command("init")
def store_init() -> None:
    """Create the bucket of FLEXDSA_ARTIFACT_URL if it is missing and check that it takes writes."""
    from service.storage.store import StoreUnavailableError, make_store

    settings = settings_or_exit()
    if not settings.artifact_url:
        raise fail("FLEXDSA_ARTIFACT_URL is not set: the artifact store is the local folder FLEXDSA_ARTIFACT_DIR.")
    store = make_store(settings)
    try:
        store.ensure_bucket()
        store.check_writable()
    except StoreUnavailableError as err:
        raise fail(f"The artifact store {settings.artifact_url} is not usable: {err}") from None
    typer.echo(f"artifact store ready: {settings.artifact_url}")


@store_app.command("abort-uploads")
def store_abort_uploads(
    older_than_hours: Annotated[float, typer.Option(help="Only uploads begun this long ago.")] = 24.0,
) -> None:
    """Abort multipart uploads left by processes killed mid-upload (they hold parts, never an object)."""
    from service.storage.store import StoreUnavailableError, make_store

    settings = settings_or_exit()
    if not settings.artifact_url:
        raise fail("FLEXDSA_ARTIFACT_URL is not set: a local store has no multipart uploads.")
    try:
        aborted = make_store(settings).abort_incomplete_uploads(older_than_hours * 3600)
    except StoreUnavailableError as err:
        raise fail(str(err)) from None
    typer.echo(f"aborted {aborted} incomplete upload(s)")


def register(app: typer.Typer) -> None:
    app.command("worker")(worker)
    app.add_typer(db_app, name="db")
    app.add_typer(keys_app, name="keys")
    app.add_typer(incidents_app, name="incidents")
    app.add_typer(store_app, name="store")
