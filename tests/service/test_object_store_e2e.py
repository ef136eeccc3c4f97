"""Beyond one machine: two API processes and a Celery worker that share nothing but PostgreSQL, Redis and
an S3-compatible store (Ceph radosgw, ``tests/s3server.py``), each with its own empty data folder.

A job is submitted to API A, run by the worker (which fetches the model from the store into its own
scratch folder), and downloaded through API B: single artifacts and bundle.zip by a presigned redirect
that the client follows to the store without its API key, checked against ``Repr-Digest``."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import httpx
import pytest

from service.auth.keys import create_api_key
from service.client import Client, fetch_artifacts
from tests.service.conftest import tiny_onnx
from tests.service.live import free_port, wait_for_job

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.services


def _spawn(argv: list[str], env: dict, log_path: Path) -> subprocess.Popen:
    with open(log_path, "wb") as log:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def _wait_ready(process: subprocess.Popen, log_path: Path, ready, what: str, timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert process.poll() is None, f"{what} exited:\n{log_path.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"{what} not ready in {timeout_s} s:\n{log_path.read_text()[-4000:]}"
        time.sleep(0.3)


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.suffix != ".log")


@pytest.fixture
def shared_nothing(create_pg_database, redis_url, s3_server, tmp_path):
    """API A, API B and a worker: separate processes, separate empty data folders, one bucket."""
    database_url = create_pg_database(migrated=True)
    store = s3_server.settings()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("FLEXDSA_", "AWS_"))}
    base.update({
        **s3_server.env(),
        "FLEXDSA_DATABASE_URL": database_url,
        "FLEXDSA_BROKER_URL": redis_url,
        "FLEXDSA_REDIS_URL": redis_url,
        "FLEXDSA_ARTIFACT_URL": store["artifact_url"],
        "FLEXDSA_S3_ENDPOINT_URL": store["s3_endpoint_url"],
        "FLEXDSA_TEST_OPTIMIZER": "tests.workers.standin:StandInOptimizer",
        "FLEXDSA_LOG_FORMAT": "text",
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    })  # fmt: skip
    folders = {name: tmp_path / name for name in ("api-a", "api-b", "worker")}
    processes, urls = [], {}
    try:
        for name in ("api-a", "api-b"):
            folders[name].mkdir()
            port = free_port()
            urls[name] = f"http://127.0.0.1:{port}"
            processes.append((name, _spawn(
                [sys.executable, "-m", "tests.workers.launch", "uvicorn", "stack:create_app", "--factory", "--host", "127.0.0.1",
                 "--port", str(port), "--log-level", "warning"],
                {**base, "FLEXDSA_DATA_DIR": str(folders[name])}, tmp_path / f"{name}.log",
            )))  # fmt: skip
        folders["worker"].mkdir()
        worker_log = tmp_path / "worker.log"
        worker = _spawn(
            [sys.executable, "-m", "tests.workers.launch", "celery", "-A", "workers.app", "worker", "-Q", "flexdsa", "-c", "1",
             "--loglevel=INFO", "-n", "s3-e2e@%h", "--without-gossip", "--without-mingle", "--without-heartbeat"],
            {**base, "FLEXDSA_DATA_DIR": str(folders["worker"])}, worker_log,
        )  # fmt: skip
        processes.append(("worker", worker))
        for name, process in processes[:2]:
            _wait_ready(process, tmp_path / f"{name}.log", lambda u=urls[name]: _answers(u), name)
        _wait_ready(worker, worker_log, lambda: b" ready." in worker_log.read_bytes(), "celery worker")
        from service.core.db import make_engine, make_session_factory

        engine = make_engine(database_url)
        with make_session_factory(engine)() as session:
            key, _ = create_api_key(session, "shared-nothing", "e2e")
            session.commit()
        engine.dispose()
        yield {"urls": urls, "folders": folders, "key": key, "s3": s3_server, "store": store,
               "logs": tmp_path, "bucket": store["artifact_url"][5:].split("/", 1)[0]}  # fmt: skip
    finally:
        for _, process in processes:
            _stop(process)


def test_submit_to_one_api_run_elsewhere_download_through_another(shared_nothing):
    urls, key = shared_nothing["urls"], shared_nothing["key"]
    headers = {"X-API-Key": key}
    s3 = shared_nothing["s3"].client()
    bucket = shared_nothing["bucket"]
    model = tiny_onnx(0.21)
    model_sha = hashlib.sha256(model).hexdigest()

    submitted = httpx.post(
        f"{urls['api-a']}/optimize", headers=headers, files={"model": ("tiny.onnx", model)},
        data={"spec": json.dumps({"target": "cpu-ort"})}, timeout=60,
    )  # fmt: skip
    assert submitted.status_code == 202, submitted.text
    # Accepted means stored: the model is in the bucket before anyone has run the job.
    head = s3.head_object(Bucket=bucket, Key=f"flexdsa/{model_sha[:2]}/{model_sha}")
    assert head["ContentLength"] == len(model) and head["Metadata"]["sha256"] == model_sha
    job_id = submitted.json()["job_id"]

    job = wait_for_job(urls["api-b"], job_id, headers, timeout_s=180)
    assert job["status"] == "succeeded", (job["error"], (shared_nothing["logs"] / "worker.log").read_text()[-4000:])

    items = httpx.get(f"{urls['api-b']}/jobs/{job_id}/artifacts", headers=headers).json()["items"]
    assert {item["name"] for item in items} == {"manifest.json", "model.onnx", "report.json"}
    for item in items:
        answer = httpx.get(item["url"] if item["url"].startswith("http") else urls["api-b"] + item["url"], headers=headers)
        assert answer.status_code == 307, answer.text
        location = answer.headers["location"]
        assert location.startswith(shared_nothing["store"]["s3_endpoint_url"]) and "X-Amz-Signature=" in location
        digest = base64.b64decode(answer.headers["repr-digest"].split(":")[1]).hex()
        assert digest == item["sha256"]
        fetched = httpx.get(location)  # no API key: the signature is the authorisation
        assert fetched.status_code == 200
        assert hashlib.sha256(fetched.content).hexdigest() == item["sha256"]
        assert item["name"] in fetched.headers.get("content-disposition", "")
    # Another tenant's key gets no redirect: the tenant check comes first.
    assert httpx.get(f"{urls['api-b']}/jobs/{job_id}/artifacts/model.onnx").status_code == 401

    bundle = httpx.get(f"{urls['api-b']}/jobs/{job_id}/artifacts/bundle.zip", headers=headers)
    assert bundle.status_code == 307
    zipped = httpx.get(bundle.headers["location"])
    assert zipped.status_code == 200
    assert base64.b64decode(bundle.headers["repr-digest"].split(":")[1]).hex() == hashlib.sha256(zipped.content).hexdigest()
    with zipfile.ZipFile(io.BytesIO(zipped.content)) as archive:
        assert sorted(archive.namelist()) == ["manifest.json", "model.onnx", "report.json"]
        by_name = {item["name"]: item["sha256"] for item in items}
        for name in archive.namelist():
            assert hashlib.sha256(archive.read(name)).hexdigest() == by_name[name]
    # The bundle is built once and kept: API A redirects to the same object.
    again = httpx.get(f"{urls['api-a']}/jobs/{job_id}/artifacts/bundle.zip", headers=headers)
    assert again.status_code == 307 and again.headers["repr-digest"] == bundle.headers["repr-digest"]

    # The CLI client follows the redirects (without sending its key to the store) and checks the digests.
    client = Client(urls["api-b"], key)
    out = shared_nothing["logs"] / "out"
    try:
        written = fetch_artifacts(client, job_id, out)
    finally:
        client.close()
    assert (out / "model.onnx").exists() and len(written) >= 3

    # Nothing of the job lies in any process's own folder: the store holds it all.
    folders = shared_nothing["folders"]
    assert _files_under(folders["worker"]) == []
    for name in ("api-a", "api-b"):
        assert not any(path.startswith("artifacts") for path in _files_under(folders[name])), _files_under(folders[name])
