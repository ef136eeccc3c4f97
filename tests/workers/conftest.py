"""Fixtures for the worker tests: a fresh PostgreSQL database (migrated with Alembic), a dedicated Redis
database, an artifact folder, and real Celery worker processes started and killed by the tests.

The PostgreSQL database comes from the shared ``pg_database_url`` fixture (``tests/conftest.py``); Redis is
``FLEXDSA_TEST_REDIS_URL`` (default redis://127.0.0.1:6379/13, the worker tests' own database). If either
is missing these tests fail with that message rather than being skipped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("FLEXDSA_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
STANDIN = "tests.workers.standin:StandInOptimizer"
# Short leases so the fault tests finish in seconds; the validators still hold (interval < lease, ...).
FAST_LIMITS = {
    "lease_seconds": 4,
    "reconcile_interval_s": 1,
    "job_soft_time_limit_s": 50,
    "job_hard_time_limit_s": 60,
    "broker_visibility_timeout_s": 3600,
    "max_attempts": 3,
}


def _fail_without(service: str, err: Exception):
    pytest.fail(f"{service} is required for the worker tests and is not reachable: {err}", pytrace=False)


@pytest.fixture(scope="session")
def redis_url():
    import redis

    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
    except Exception as err:
        _fail_without(f"Redis at {REDIS_URL}", err)
    return REDIS_URL


@pytest.fixture
def redis_client(redis_url):
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield client
    client.flushdb()
    client.close()


@pytest.fixture
def settings(pg_database_url, redis_url, redis_client, tmp_path, monkeypatch):
    """Distributed-mode settings on the test database, with the stand-in optimizer in pipeline processes."""
    from service.core.config import Settings

    monkeypatch.setenv("FLEXDSA_TEST_OPTIMIZER", STANDIN)
    _clear_tables(pg_database_url)
    return Settings(
        database_url=pg_database_url, broker_url=redis_url, redis_url=redis_url,
        artifact_dir=tmp_path / "artifacts", data_dir=tmp_path, **FAST_LIMITS,
    )


def _clear_tables(url: str) -> None:
    from sqlalchemy import text

    from service.core.config import Settings
    from service.core.db import session_factory_for

    sessions = session_factory_for(Settings(database_url=url, broker_url="redis://unused", **FAST_LIMITS))
    with sessions() as session, session.begin():
        session.execute(text("TRUNCATE jobs, job_events, artifacts, kernel_cache, tenants CASCADE"))


def worker_env(settings, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "FLEXDSA_DATABASE_URL": settings.database_url,
        "FLEXDSA_BROKER_URL": settings.broker_url,
        "FLEXDSA_REDIS_URL": settings.redis_url,
        "FLEXDSA_ARTIFACT_DIR": str(settings.artifact_dir),
        "FLEXDSA_DATA_DIR": str(settings.data_dir),
        "FLEXDSA_TEST_OPTIMIZER": STANDIN,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p),
    })
    for name in ("lease_seconds", "reconcile_interval_s", "job_soft_time_limit_s", "job_hard_time_limit_s",
                 "broker_visibility_timeout_s", "max_attempts"):
        env[f"FLEXDSA_{name.upper()}"] = str(getattr(settings, name))
    env.update(extra)
    return env


class CeleryWorker:
    """One ``celery -A workers.app worker`` in its own process group (so SIGKILL takes the whole worker)."""

    def __init__(self, name: str, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"celery-{name}.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.workers.launch", "celery", "-A", "workers.app", "worker", "--pool=prefork", "-c", "1",
             "-Q", "flexdsa", "-n", f"{name}@%h", "--loglevel=INFO",
             "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def wait_ready(self, timeout_s: float = 45.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"worker {self.name} exited with {self.process.returncode}:\n{self.log()}")
            if b" ready." in self.log_path.read_bytes():
                return
            time.sleep(0.2)
        raise AssertionError(f"worker {self.name} not ready after {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_bytes().decode("utf-8", "replace")[-6000:]

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self) -> None:
        if self.alive():
            self.kill(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                pass
        self.kill(signal.SIGKILL)  # whatever is left in the group
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()


@pytest.fixture
def start_worker(settings, tmp_path):
    """``start_worker(name, **env)`` -> a ready ``CeleryWorker``; all are stopped at teardown."""
    started: list[CeleryWorker] = []

    def start(name: str = "w1", wait: bool = True, **extra_env: str) -> CeleryWorker:
        worker = CeleryWorker(name, worker_env(settings, **extra_env), tmp_path)
        started.append(worker)
        if wait:
            worker.wait_ready()
        return worker

    yield start
    for worker in started:
        worker.stop()


# --- jobs -----------------------------------------------------------------------------------------------


def tiny_model(alphas: tuple[float, ...] = (0.1, 0.2, 0.3)) -> bytes:
    """A chain of LeakyRelu layers; each alpha is one kernel, so models with common alphas share kernels."""
    from onnx import TensorProto, helper

    nodes, name = [], "x"
    for index, alpha in enumerate(alphas):
        out = f"h{index}"
        nodes.append(helper.make_node("LeakyRelu", [name], [out], alpha=alpha))
        name = out
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def create_job(settings, model: bytes | None = None, *, spec: dict | None = None, tenant: str = "acme",
               max_attempts: int | None = None, calibration: bytes | None = None) -> str:
    """Store the model and commit a queued job row, as the API does before it calls enqueue."""
    from sqlalchemy import select

    from service.core.db import session_factory_for
    from service.core.models import Job, JobEvent, Tenant
    from service.jobs.job_cache import job_cache_key
    from service.jobs.service import parse_spec
    from service.storage.store import make_store

    model = tiny_model() if model is None else model
    spec = spec or {"target": "cpu-ort"}
    blob_key = make_store(settings).put_bytes(model)
    calibration_key = make_store(settings).put_bytes(calibration) if calibration is not None else None
    cache_key = job_cache_key(blob_key, *parse_spec(json.dumps(spec)), calibration_key)
    sessions = session_factory_for(settings)
    with sessions() as session, session.begin():
        tenant_row = session.scalar(select(Tenant).where(Tenant.name == tenant))
        if tenant_row is None:
            tenant_row = Tenant(name=tenant)
            session.add(tenant_row)
            session.flush()
        job = Job(
            tenant_id=tenant_row.id, status="queued", target=str(spec["target"]), spec=spec,
            model_sha256=blob_key, model_blob_key=blob_key, model_filename="model.onnx", model_size=len(model),
            job_cache_key=cache_key, max_attempts=max_attempts or settings.max_attempts,
            calibration_blob_key=calibration_key,
        )
        session.add(job)
        session.flush()
        session.add(JobEvent(job_id=job.id, kind="queued", status="queued", progress=0.0))
        return job.id


def load_job(settings, job_id: str):
    from service.core.db import session_factory_for
    from service.core.models import Job

    with session_factory_for(settings)() as session:
        job = session.get(Job, job_id)
        # Read everything while the session is open.
        job.artifacts, job.events  # noqa: B018
        return job


def wait_for(predicate, timeout_s: float, what: str, interval_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def wait_status(settings, job_id: str, statuses: set[str], timeout_s: float = 60.0):
    return wait_for(
        lambda: (job := load_job(settings, job_id)).status in statuses and job, timeout_s,
        f"job {job_id} to reach {sorted(statuses)}",
    )
