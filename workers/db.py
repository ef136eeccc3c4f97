"""Database sessions for worker code: one engine per (process, database URL).

Engines are keyed by process id because Celery's prefork pool and the pipeline child are new processes:
a connection pool inherited across ``fork`` would share sockets with the parent, so each process builds
its own on first use.
"""

from __future__ import annotations

import os
import threading

from sqlalchemy.orm import Session, sessionmaker

from service.db import make_engine, make_session_factory

_factories: dict[tuple[int, str], sessionmaker[Session]] = {}
_lock = threading.Lock()


def session_factory_for(settings) -> sessionmaker[Session]:
    key = (os.getpid(), settings.database_url)
    with _lock:
        factory = _factories.get(key)
        if factory is None:
            factory = _factories[key] = make_session_factory(make_engine(settings.database_url))
        return factory
