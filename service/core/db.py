"""Database access: engine and session factory, and the Alembic glue (``upgrade``, ``check_migrated``).

Embedded mode (SQLite) migrates itself at ``flexdsa serve``; any other database must be migrated on
purpose with ``flexdsa db upgrade``, and the service and workers refuse to start until it is.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from service.core.config import Settings


class DatabaseNotMigratedError(RuntimeError):
    """The schema is missing or behind the code."""


def migrations_dir() -> Path:
    """``migrations/`` next to the ``service`` package (source checkout or editable install), else the
    installed ``migrations`` package."""
    beside = Path(__file__).resolve().parents[2] / "migrations"
    if (beside / "env.py").exists():
        return beside
    spec = importlib.util.find_spec("migrations")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    raise DatabaseNotMigratedError("Cannot find the Alembic migrations folder; reinstall flexdsa.")


def make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        # pre_ping: after an outage the first request reconnects instead of failing on a dead connection;
        # connect_timeout: while the database is unreachable, requests answer 503 in seconds, not hang.
        connect_args = {"connect_timeout": 5} if parsed.get_backend_name() == "postgresql" else {}
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20, connect_args=connect_args)

    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    # The embedded worker thread and request threads share the file: WAL lets readers run during a write,
    # busy_timeout makes a writer wait for the lock instead of failing at once.
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    return engine


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: routes read a row's fields after committing it to build the response.
    return sessionmaker(bind=engine, expire_on_commit=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session that commits on success and rolls back on any exception."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def alembic_config(engine: Engine):
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    # env.py uses this engine rather than a URL in the ini (URLs with '%' break ini interpolation).
    config.attributes["engine"] = engine
    return config


def head_revision() -> str | None:
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(migrations_dir())).get_current_head()


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(alembic_config(engine), revision)


def check_migrated(engine: Engine) -> None:
    """Raise ``DatabaseNotMigratedError`` unless the database schema is at the code's head revision."""
    head = head_revision()
    current = current_revision(engine)
    if current != head:
        where = engine.url.render_as_string(hide_password=True)
        state = (
            "has no Flex-DSA schema" if current is None else f"is at revision {current}, code expects {head}"
        )
        raise DatabaseNotMigratedError(
            f"The database {where} {state}. Run `flexdsa db upgrade` (with the same FLEXDSA_DATABASE_URL) "
            "and start again."
        )


def prepare_database(settings: Settings, engine: Engine) -> None:
    """Start-up check: SQLite (embedded) is migrated automatically; anything else must already be."""
    if settings.is_sqlite:
        upgrade(engine)
    else:
        check_migrated(engine)


# One engine per (process, database URL): Celery's prefork pool and the pipeline child are new processes, and
# a connection pool inherited across ``fork`` would share sockets with the parent, so each process builds its
# own on first use.
_factories: dict[tuple[int, str], sessionmaker[Session]] = {}
_lock = threading.Lock()


def session_factory_for(settings) -> sessionmaker[Session]:
    key = (os.getpid(), settings.database_url)
    with _lock:
        factory = _factories.get(key)
        if factory is None:
            factory = _factories[key] = make_session_factory(make_engine(settings.database_url))
        return factory
