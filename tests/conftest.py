"""Shared fixtures: real PostgreSQL and Redis, never mocks.

PostgreSQL: ``FLEXDSA_TEST_PG_ADMIN_URL`` (default the ``postgres`` user on 127.0.0.1:5432, trust auth).
Each test session creates fresh databases named ``flexdsa_test_<random>`` and drops them at the end.
Redis: ``FLEXDSA_TEST_SERVICE_REDIS_URL`` (default database 11 on 127.0.0.1:6379; the worker tests use 13 and
the benchmarks 14), flushed at the start.
When either is unreachable the tests that need it FAIL with that message; they are never skipped.
"""

from __future__ import annotations

import os
import uuid

import pytest

PG_ADMIN_URL = os.environ.get("FLEXDSA_TEST_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
SERVICE_REDIS_URL = os.environ.get("FLEXDSA_TEST_SERVICE_REDIS_URL", "redis://127.0.0.1:6379/11")


def _unreachable(what: str, err: Exception):
    pytest.fail(f"{what} is required by these tests and is not reachable: {err}", pytrace=False)


def _sqlalchemy_url(database: str) -> str:
    base = PG_ADMIN_URL.rsplit("/", 1)[0]
    if base.startswith("postgresql://"):
        base = base.replace("postgresql://", "postgresql+psycopg://", 1)
    return f"{base}/{database}"


@pytest.fixture(scope="session")
def create_pg_database():
    """``create_pg_database(migrated=True)`` -> the SQLAlchemy URL of a new, empty (or migrated) database.
    Every database made this way is dropped at the end of the session."""
    import psycopg

    try:
        psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5).close()
    except Exception as err:
        _unreachable(f"PostgreSQL at {PG_ADMIN_URL}", err)
    created: list[str] = []

    def create(migrated: bool = True) -> str:
        name = f"flexdsa_test_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')
        created.append(name)
        url = _sqlalchemy_url(name)
        if migrated:
            from service.core.db import make_engine, upgrade

            engine = make_engine(url)
            upgrade(engine)
            engine.dispose()
        return url

    yield create
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        for name in created:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_database_url(create_pg_database) -> str:
    """A fresh PostgreSQL database for this test session, migrated to the latest schema."""
    return create_pg_database(migrated=True)


@pytest.fixture(scope="session")
def redis_url() -> str:
    """A dedicated Redis database, flushed at the start of the session."""
    import redis

    client = redis.Redis.from_url(SERVICE_REDIS_URL, socket_connect_timeout=3)
    try:
        client.ping()
        client.flushdb()
    except Exception as err:
        _unreachable(f"Redis at {SERVICE_REDIS_URL}", err)
    finally:
        client.close()
    return SERVICE_REDIS_URL


@pytest.fixture(scope="session")
def s3_server():
    """Ceph's radosgw on a private one-node cluster (``tests/s3server.py``) for this test session. Tests
    that need it FAIL when it cannot start (not installed, or it did not come up), with the reason."""
    from tests.s3server import CephS3, S3ServerError

    try:
        server = CephS3()
    except S3ServerError as err:
        pytest.fail(f"the S3-compatible test server (Ceph radosgw) could not start: {err}", pytrace=False)
    try:
        yield server
    finally:
        server.close()


def pytest_configure(config):
    """The pipeline processes the tests start in this process run the tests' hooked child
    (``tests/workers/hooks.py``): FLEXDSA_TEST_* reach them, and nothing of the kind ships."""
    from tests.workers.hooks import install

    install()
