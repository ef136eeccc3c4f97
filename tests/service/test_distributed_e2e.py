"""Distributed mode end to end: the API on PostgreSQL publishes to a real Celery worker process over Redis;
progress reaches the SSE stream through Redis pub/sub; cancel of a finished job is refused."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.auth.keys import create_api_key
from service.core.config import Settings
from stack import create_app
from tests.service.conftest import tiny_onnx

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.services  # PostgreSQL, Redis and a Celery worker process


@pytest.fixture
def distributed(create_pg_database, redis_url, tmp_path):
    settings = Settings(
        data_dir=tmp_path,
        database_url=create_pg_database(migrated=True),
        broker_url=redis_url,
        redis_url=redis_url,
    )
    env = {
        **os.environ,
        "FLEXDSA_DATABASE_URL": settings.database_url,
        "FLEXDSA_BROKER_URL": redis_url,
        "FLEXDSA_REDIS_URL": redis_url,
        "FLEXDSA_DATA_DIR": str(tmp_path),
        "FLEXDSA_ARTIFACT_DIR": str(settings.artifact_dir),
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }
    log_path = tmp_path / "celery.log"
    with open(log_path, "wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "workers.app", "worker", "-Q", "flexdsa", "-c", "1", "--loglevel=INFO",
             "-n", "service-e2e@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while b" ready." not in log_path.read_bytes():
            assert worker.poll() is None, f"celery worker exited:\n{log_path.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"celery worker not ready:\n{log_path.read_text()[-4000:]}"
            time.sleep(0.2)
        yield settings, log_path
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(10)


def test_job_runs_on_a_celery_worker(distributed):
    settings, log_path = distributed
    app = create_app(settings)
    with TestClient(app) as client:
        with app.state.session_factory() as session:
            key, _ = create_api_key(session, "acme", "e2e")
            session.commit()
        headers = {"X-API-Key": key}
        assert client.get("/jobs").status_code == 401  # keys are required in distributed mode
        assert client.get("/readyz").json()["checks"] == {
            "database": "ok", "artifact_store": "ok", "broker": "ok", "redis": "ok"
        }  # fmt: skip
        submitted = client.post(
            "/optimize", headers=headers, files={"model": ("tiny.onnx", tiny_onnx())},
            data={"spec": json.dumps({"target": "cpu-ort"})},
        )  # fmt: skip
        assert submitted.status_code == 202, submitted.text
        job_id = submitted.json()["job_id"]
        started = time.monotonic()
        with client.stream("GET", f"/jobs/{job_id}/events", headers=headers) as response:
            kinds = [
                line.split(":", 1)[1].strip() for line in response.iter_lines() if line.startswith("event:")
            ]
        assert time.monotonic() - started < 120
        job = client.get(f"/jobs/{job_id}", headers=headers).json()
        assert job["status"] == "succeeded", (job["error"], log_path.read_text()[-4000:])
        assert kinds[0] == "queued" and "started" in kinds and kinds[-1] == "end"
        artifacts = client.get(f"/jobs/{job_id}/artifacts", headers=headers).json()["items"]
        assert artifacts and all(client.get(a["url"], headers=headers).status_code == 200 for a in artifacts)
        assert client.delete(f"/jobs/{job_id}", headers=headers).status_code == 409
