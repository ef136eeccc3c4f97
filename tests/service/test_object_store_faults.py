"""The S3 store's faults against a real server (Ceph radosgw): a blob whose stored bytes are not its sha256
is refused wherever it is read, never handed over; a store outage answers 503 with Retry-After and the same
request succeeds afterwards without a duplicate; a worker rides out an outage mid-job; a process killed
mid-upload leaves no object. The API runs in-process on PostgreSQL; jobs run through ``execute_job`` and
its real pipeline process (the stand-in optimizer)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from service.auth.keys import create_api_key
from service.client import Client, ClientError
from service.core.config import Settings
from service.core.models import Artifact, Job
from service.storage.store import ChecksumMismatchError
from tests.service.conftest import tiny_onnx
from workers.execute import execute_job

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.services
SPEC = {"spec": json.dumps({"target": "cpu-ort"})}


@pytest.fixture
def s3_app(create_pg_database, redis_url, s3_server, tmp_path, monkeypatch):
    """The app on PostgreSQL with a fresh bucket; ``make(**overrides)`` builds one with other settings."""
    import service.jobs.service

    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("FLEXDSA_TEST_OPTIMIZER", "tests.workers.standin:StandInOptimizer")
    monkeypatch.setattr(service.jobs.service, "enqueue", lambda job_id, settings: None)  # execute_job is called here
    database_url = create_pg_database(migrated=True)
    store = s3_server.settings()
    base = dict(
        data_dir=tmp_path, database_url=database_url, redis_url=redis_url, auth="required",
        embedded_worker=False, store_outage_patience_s=90, **store,
    )  # fmt: skip
    from stack import create_app

    clients = []

    def make(**overrides):
        settings = Settings(**{**base, **overrides})
        app = create_app(settings)
        client = TestClient(app, raise_server_exceptions=False, follow_redirects=False)
        client.__enter__()
        clients.append(client)
        with app.state.session_factory() as session:
            key, _ = create_api_key(session, f"t-{len(clients)}", "test")
            session.commit()
        client.headers["X-API-Key"] = key
        return settings, app, client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def _run(client, settings, model: bytes) -> str:
    answer = client.post("/optimize", files={"model": ("m.onnx", model)}, data=SPEC)
    assert answer.status_code == 202, answer.text
    job_id = answer.json()["job_id"]
    assert execute_job(job_id, settings=settings, worker_id="w1") == "succeeded"
    return job_id


def _object_key(settings, sha256: str) -> tuple[str, str]:
    bucket, _, prefix = settings.artifact_url[5:].partition("/")
    return bucket, f"{prefix}/{sha256[:2]}/{sha256}"


def _artifact(app, job_id: str, name: str) -> Artifact:
    with app.state.session_factory() as session:
        return session.scalar(select(Artifact).where(Artifact.job_id == job_id, Artifact.name == name))


def test_a_corrupt_blob_is_refused_wherever_it_is_read(s3_app, s3_server):
    settings, app, client = s3_app()
    job_id = _run(client, settings, tiny_onnx(0.31))
    s3 = s3_server.client()
    artifact = _artifact(app, job_id, "model.onnx")
    bucket, key = _object_key(settings, artifact.blob_key)
    original = s3.get_object(Bucket=bucket, Key=key)["Body"].read()

    # Replaced by other bytes (a plain overwrite): the HEAD before the redirect sees it -> 502, no URL.
    s3.put_object(Bucket=bucket, Key=key, Body=b"not the model")
    refused = client.get(f"/jobs/{job_id}/artifacts/model.onnx")
    assert refused.status_code == 502 and refused.json()["error"]["code"] == "artifact_corrupt"
    assert "location" not in refused.headers
    # bundle.zip reads every member through the checked reader: refused before a byte is sent.
    bundle = client.get(f"/jobs/{job_id}/artifacts/bundle.zip")
    assert bundle.status_code == 502 and bundle.json()["error"]["code"] == "artifact_corrupt"
    # Storing the same bytes again (a re-run job, a resubmission) repairs it rather than trusting the key.
    assert app.state.store.put_bytes(original) == artifact.blob_key
    assert client.get(f"/jobs/{job_id}/artifacts/model.onnx").status_code == 307

    # Silently corrupted in place (same length, metadata intact): the redirect goes out, and the client
    # checks what it fetched against Repr-Digest: an error, and no file written.
    flipped = bytes([original[0] ^ 0xFF]) + original[1:]
    s3.put_object(Bucket=bucket, Key=key, Body=flipped, Metadata={"sha256": artifact.blob_key})
    assert client.get(f"/jobs/{job_id}/artifacts/model.onnx").status_code == 307
    cli = Client("http://unused", None)
    cli.http = client  # the CLI's calls, against the in-process app
    destination = settings.data_dir / "out" / "model.onnx"
    with pytest.raises(ClientError, match="do not match the server's sha256"):
        cli.download(job_id, "model.onnx", destination)
    assert not destination.exists() and not destination.with_name("model.onnx.part").exists()

    # Streamed instead of redirected: the last piece is held back until the hash is known.
    streamed_settings, streamed_app, _ = s3_app(presign_downloads=False)
    store = streamed_app.state.store
    pieces = []
    with pytest.raises(ChecksumMismatchError):
        for piece in store.iter_chunks(artifact.blob_key, chunk_size=len(original) // 3 + 1):
            pieces.append(piece)
    assert sum(map(len, pieces)) < len(original)

    # A worker fetching a corrupt model fails the job with the reason, not with an internal error.
    model = tiny_onnx(0.32)
    answer = client.post("/optimize", files={"model": ("m.onnx", model)}, data=SPEC)
    job2 = answer.json()["job_id"]
    bucket, model_key = _object_key(settings, hashlib.sha256(model).hexdigest())
    s3.put_object(Bucket=bucket, Key=model_key, Body=model[:-4] + b"\0\0\0\0", Metadata={"sha256": "x"})
    assert execute_job(job2, settings=settings, worker_id="w1") == "failed"
    error = client.get(f"/jobs/{job2}").json()["error"]
    assert error["code"] == "blob_corrupt" and "does not match its sha256" in error["message"]


def test_store_outage_answers_503_then_the_same_submit_succeeds_once(s3_app, s3_server):
    settings, app, client = s3_app()
    earlier = _run(client, settings, tiny_onnx(0.41))
    model = tiny_onnx(0.42)
    s3_server.stop_gateway()
    try:
        refused = client.post("/optimize", files={"model": ("m.onnx", model)}, data=SPEC)
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "artifact_store_unavailable"
        assert int(refused.headers["retry-after"]) > 0
        download = client.get(f"/jobs/{earlier}/artifacts/model.onnx")
        assert download.status_code == 503 and "retry-after" in download.headers
        assert download.json()["error"]["code"] == "artifact_store_unavailable"
        assert client.get("/readyz").json()["error"]["details"]["checks"]["artifact_store"] != "ok"
    finally:
        s3_server.start_gateway()
    with app.state.session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 1  # nothing recorded for the 503
    job_id = _run(client, settings, model)  # the client's retry
    with app.state.session_factory() as session:
        assert session.scalar(select(func.count()).select_from(Job)) == 2
        names = session.scalars(select(Artifact.name).where(Artifact.job_id == job_id)).all()
    assert sorted(names) == ["manifest.json", "model.onnx", "report.json"]
    assert client.get(f"/jobs/{earlier}/artifacts/model.onnx").status_code == 307


def test_a_worker_waits_out_a_store_outage_without_spending_an_attempt(s3_app, s3_server):
    settings, app, client = s3_app()
    answer = client.post("/optimize", files={"model": ("m.onnx", tiny_onnx(0.51))}, data=SPEC)
    job_id = answer.json()["job_id"]
    results = []
    s3_server.stop_gateway()
    try:
        worker = threading.Thread(target=lambda: results.append(execute_job(job_id, settings=settings, worker_id="w1")))
        worker.start()
        time.sleep(6)  # the pipeline process is retrying its fetch of the model meanwhile
        assert client.get(f"/jobs/{job_id}").json()["status"] == "running"
    finally:
        s3_server.start_gateway()
    worker.join(120)
    assert results == ["succeeded"]
    job = client.get(f"/jobs/{job_id}").json()
    assert job["attempts"] == 1
    with app.state.session_factory() as session:
        names = session.scalars(select(Artifact.name).where(Artifact.job_id == job_id)).all()
    assert sorted(names) == ["manifest.json", "model.onnx", "report.json"]


UPLOADER = """
import os, sys
from service.core.config import Settings
from service.storage.store import make_store
store = make_store(Settings(data_dir=sys.argv[1], artifact_url=sys.argv[2], s3_endpoint_url=sys.argv[3],
                            s3_part_size_mb=5, s3_upload_concurrency=1))
path = os.path.join(sys.argv[1], "big.bin")
with open(path, "wb") as handle:
    handle.write(os.urandom(60 * 1024 * 1024))
print("uploading", flush=True)
store.put_file(path)
"""


def test_a_process_killed_mid_upload_leaves_no_object(s3_server, tmp_path, monkeypatch):
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    store_settings = s3_server.settings()
    bucket = store_settings["artifact_url"][5:].split("/", 1)[0]
    s3 = s3_server.client()
    process = subprocess.Popen(
        [sys.executable, "-c", UPLOADER, str(tmp_path), store_settings["artifact_url"], store_settings["s3_endpoint_url"]],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert process.stdout.readline().strip() == b"uploading"
        deadline = time.monotonic() + 60
        while not s3.list_multipart_uploads(Bucket=bucket).get("Uploads"):  # under way, parts going up
            assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        process.kill()
        process.wait(10)
    listed = s3.list_objects_v2(Bucket=bucket).get("Contents", [])
    assert listed == [], [o["Key"] for o in listed]  # no object, whole or half, under any key
    from service.storage.store import make_store

    store = make_store(Settings(data_dir=tmp_path, **store_settings))
    assert store.abort_incomplete_uploads(older_than_s=0) == 1
    assert not s3.list_multipart_uploads(Bucket=bucket).get("Uploads")
