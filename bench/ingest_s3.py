"""``python -m bench.ingest --store s3``: the API's ingest into an S3-compatible store, and a presigned
download's cost to the API (issue 26).

In one run, on loopback, against Ceph's radosgw on a private one-node cluster (``tests/s3server.py``):

1. **the store's own single-client PUT rate**: the same bodies the clients will send, uploaded one after
   another from this process by one boto3 client (the store's own transfer settings: parts of
   ``FLEXDSA_S3_PART_SIZE_MB``, ``FLEXDSA_S3_UPLOAD_CONCURRENCY`` at once), to fresh keys, measured before
   the service and again after it (the mean is the reference; both are printed);
2. **ingest through the API**: ``flexdsa serve --workers N`` with ``FLEXDSA_ARTIFACT_URL`` on the bucket and
   the worker off; ``--clients`` clients each upload a distinct ``--model-mb`` model at once (pre-encoded
   requests, as ``bench.ingest``); the aggregate rate is the model bytes over the wall time until the last
   202, and a 202 means the model is in the store;
3. **a presigned download**: a ``--download-mb`` artifact (default 1 GB) attached to a job, fetched through
   ``GET /jobs/{id}/artifacts/{name}`` by a client that follows the 307 to the store; the API processes'
   CPU time (user + system, all of them) over the download's wall time is the share of one core it cost.

Goals: ingest >= 80% of the store's single-client PUT rate; the download <= 5% of one API core.
Results: stdout and ``bench/results/ingest_s3.json``.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.loopback import free_port, wait_http
from bench.uploads import load, onnx_model

ROOT = Path(__file__).resolve().parent.parent
SPEC = json.dumps({"target": "cpu-ort", "measure_latency": False})


def store_put_rate(store, bodies: list[bytes], folder: Path) -> float:
    """MB/s of one client putting every body in turn (from a file, as the API does), each to a new key."""
    warm = folder / "warm"
    warm.write_bytes(os.urandom(len(bodies[0])))
    store.put_file(warm, move=True)  # a fresh cluster's first writes are several times slower: untimed
    paths = []
    for index, body in enumerate(bodies):
        path = folder / f"put-{index}"
        path.write_bytes(body + os.urandom(32))  # a new key each run: never deduplicated
        paths.append(path)
    start = time.perf_counter()
    for path in paths:
        store.put_file(path, move=True)
    elapsed = time.perf_counter() - start
    return sum(len(b) + 32 for b in bodies) / elapsed / 1e6


def api_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and all its descendants (the API's worker processes)."""
    import psutil

    total = 0.0
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def attach_artifact(database: Path, job_id: str, name: str, blob_key: str, size: int) -> None:
    """An artifact row for ``job_id`` (as a worker writes it), and the job marked succeeded."""
    from sqlalchemy import update

    from service.core.db import make_engine, make_session_factory
    from service.core.models import Artifact, Job, utcnow

    engine = make_engine(f"sqlite:///{database}")
    with make_session_factory(engine)() as session, session.begin():
        session.add(Artifact(job_id=job_id, name=name, blob_key=blob_key, size=size, content_type="application/octet-stream"))
        session.execute(update(Job).where(Job.id == job_id).values(status="succeeded", finished_at=utcnow()))
    engine.dispose()


def presigned_download(base_url: str, job_id: str, name: str, api_pid: int, expected_sha: str) -> dict:
    """Fetch the artifact through the API (following the 307 by hand, as the CLI does) while counting the
    API's CPU time; checks the bytes' sha256."""
    import httpx

    before = api_cpu_seconds(api_pid)
    start = time.perf_counter()
    answer = httpx.get(f"{base_url}/jobs/{job_id}/artifacts/{name}", timeout=30)
    if answer.status_code != 307:
        raise RuntimeError(f"expected a 307, got {answer.status_code}: {answer.text[:300]}")
    digest = hashlib.sha256()
    received = 0
    with httpx.stream("GET", answer.headers["location"], timeout=120) as stored:
        for chunk in stored.iter_bytes(1 << 20):
            digest.update(chunk)
            received += len(chunk)
    wall = time.perf_counter() - start
    cpu = api_cpu_seconds(api_pid) - before
    if digest.hexdigest() != expected_sha:
        raise RuntimeError("the downloaded bytes do not match the artifact's sha256")
    return {"bytes": received, "wall_s": round(wall, 2), "mb_s": round(received / wall / 1e6, 1),
            "api_cpu_s": round(cpu, 3), "api_core_share": round(cpu / wall, 4)}  # fmt: skip


def run(args) -> dict:
    from service.core.config import Settings
    from service.storage.store import make_store
    from tests.s3server import CephS3

    tmp = Path(tempfile.mkdtemp(prefix="flexdsa-ingest-s3-"))
    s3 = CephS3(block_gib=max(24, 4 + 3 * (args.clients * args.model_mb + args.download_mb) // 1000))
    try:
        os.environ.update(s3.env())
        store_settings = s3.settings()
        settings = Settings(data_dir=tmp / "bench", **store_settings)
        store = make_store(settings)
        bodies = [onnx_model(args.seed + i, args.model_mb * 1_000_000) for i in range(args.clients)]
        put_before = store_put_rate(store, bodies, tmp)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXDSA_")}
        env.update({
            "FLEXDSA_DATA_DIR": str(tmp / "api"),
            "FLEXDSA_EMBEDDED_WORKER": "false",
            "FLEXDSA_MAX_QUEUED_JOBS_PER_TENANT": "100000",
            "FLEXDSA_SUBMIT_RATE_PER_MINUTE": "100000",
            "FLEXDSA_ARTIFACT_URL": store_settings["artifact_url"],
            "FLEXDSA_S3_ENDPOINT_URL": store_settings["s3_endpoint_url"],
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        })  # fmt: skip
        (tmp / "api").mkdir()
        log = open(tmp / "api.log", "wb")
        server = subprocess.Popen(
            [sys.executable, "-m", "flexdsa_core.cli", "serve", "--port", str(port), "--workers", str(args.workers)],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            base_url = f"http://127.0.0.1:{port}"
            wait_http(f"{base_url}/healthz", 60, str(tmp / "api.log"))
            context = multiprocessing.get_context("spawn")
            loads = context.Queue()
            uploader = context.Process(
                target=load,
                args=(base_url, args.clients, args.model_mb * 1_000_000, args.seed, time.time() + 5, loads),
            )
            uploader.start()
            result = loads.get(timeout=args.max_seconds)
            uploader.join(30)
            sequential = sequential_ingest(base_url, args)
            download = _download_run(base_url, server.pid, store, tmp, args)
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
        put_after = store_put_rate(store, bodies, tmp)
    finally:
        s3.close()
        shutil.rmtree(tmp, ignore_errors=True)
    put_rate = (put_before + put_after) / 2
    aggregate = result["bytes"] / result["wall_s"] / 1e6
    return {
        "store": "ceph radosgw (one node, loopback)",
        "clients": args.clients,
        "api_workers": args.workers,
        "model_mb": args.model_mb,
        "store_put_mb_s": round(put_rate, 1),
        "store_put_before_after_mb_s": [round(put_before, 1), round(put_after, 1)],
        "ingest_mb_s": round(aggregate, 1),
        "ingest_vs_store_put": round(aggregate / put_rate, 3),
        "ingest_wall_s": round(result["wall_s"], 2),
        "sequential_ingest_mb_s": round(sequential, 1),
        "sequential_ingest_vs_store_put": round(sequential / put_rate, 3),
        "presigned_download": download,
    }


def sequential_ingest(base_url: str, args) -> float:
    """MB/s of one client submitting distinct models one after another through the API (each answered 202
    only once the store has it): the like-for-like peer of the store's single-client PUT rate."""
    from bench.uploads import multipart_request, send_upload

    host, port = base_url.rsplit("//", 1)[1].rsplit(":", 1)
    requests = [
        multipart_request(host, onnx_model(args.seed + 1000 + i, args.model_mb * 1_000_000), f"seq{i}.onnx")
        for i in range(args.clients)
    ]
    start = time.perf_counter()
    for parts in requests:
        send_upload((host, int(port)), parts)
    elapsed = time.perf_counter() - start
    return sum(len(body) for _, body, _ in requests) / elapsed / 1e6


def _download_run(base_url: str, api_pid: int, store, tmp: Path, args) -> dict:
    """A job (submitted through the API, never run) given a ``--download-mb`` artifact, then downloaded."""
    import httpx

    small = onnx_model(77_777, 1024)
    answer = httpx.post(f"{base_url}/optimize", files={"model": ("s.onnx", small)}, data={"spec": SPEC}, timeout=60)
    if answer.status_code != 202:
        raise RuntimeError(f"submit answered {answer.status_code}: {answer.text[:300]}")
    job_id = answer.json()["job_id"]
    big = tmp / "big.bin"
    with open(big, "wb") as handle:
        for _ in range(args.download_mb):
            handle.write(os.urandom(1_000_000))
    size = big.stat().st_size
    key = store.put_file(big, move=True)
    attach_artifact(tmp / "api" / "flexdsa.db", job_id, "big.bin", key, size)
    time.sleep(2)  # the API idle again before counting its CPU
    return presigned_download(base_url, job_id, "big.bin", api_pid, key)


def main(args) -> int:
    result = run(args)
    print(json.dumps(result, indent=2))
    download = result["presigned_download"]
    print(
        f"\ningest through the API into the store ({args.clients} clients x {args.model_mb} MB, {args.workers} API "
        f"processes): {result['ingest_mb_s']} MB/s = {result['ingest_vs_store_put']:.0%} of the store's own "
        f"single-client PUT rate ({result['store_put_mb_s']} MB/s, mean of {result['store_put_before_after_mb_s'][0]} "
        f"before and {result['store_put_before_after_mb_s'][1]} after; goal >= 80%); one client submitting the same "
        f"way one model after another: {result['sequential_ingest_mb_s']} MB/s = "
        f"{result['sequential_ingest_vs_store_put']:.0%}\n"
        f"presigned download of {download['bytes'] / 1e9:.2f} GB at {download['mb_s']} MB/s: the API spent "
        f"{download['api_cpu_s']} s of CPU over {download['wall_s']} s = {download['api_core_share']:.2%} of one core "
        "(goal <= 5%)"
    )
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "ingest_s3.json").write_text(json.dumps(result, indent=2))
    ok = (
        min(result["ingest_vs_store_put"], result["sequential_ingest_vs_store_put"]) >= 0.8
        and download["api_core_share"] <= 0.05
    )
    return 0 if ok else 1
