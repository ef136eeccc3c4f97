"""Alembic environment. The database comes from, in order: an engine handed over by ``service.core.db``
(``flexdsa db upgrade``, embedded start-up, tests), else ``sqlalchemy.url`` in the ini, else ``Settings``."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Engine

from service.core.models import Base

config = context.config
target_metadata = Base.metadata


def _engine() -> Engine:
    engine = config.attributes.get("engine")
    if engine is not None:
        return engine
    from service.core.config import get_settings
    from service.core.db import make_engine

    return make_engine(config.get_main_option("sqlalchemy.url") or get_settings().database_url)


def run_migrations_offline() -> None:
    from service.core.config import get_settings

    url = config.get_main_option("sqlalchemy.url") or get_settings().database_url
    context.configure(url=url, target_metadata=target_metadata, literal_binds=True, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    with _engine().connect() as connection:
        # render_as_batch: SQLite cannot ALTER most things; batch mode rebuilds the table instead.
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
