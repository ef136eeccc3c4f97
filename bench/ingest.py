"""Ingest benchmark: ``python -m bench.ingest`` (issue 12: big uploads never stall the API).

In one run, on loopback:

1. **the machine's own limit**: sha256 + write + fsync of the same bytes the clients will send, one
   upload after another in this process (what one core can ingest at best), measured before the service
   and again after it (the mean is the limit; both are printed, with the load average, since other work
   on a shared machine moves it);
2. **the load generator's own ceiling**: the same uploads, sent the same way, into sockets that discard
   them (the most this harness could show of any server);
3. **the service**: ``flexdsa serve --workers 2`` (``--workers N``) on embedded defaults with the worker
   switched off (``FLEXDSA_EMBEDDED_WORKER=false``: only the API works, as in the issue's measurement). From a second
   process, ``--clients`` clients each upload a distinct ``--model-mb`` model at once (pre-encoded requests
   sent with ``sendall``, each on its own connection) while a third process, an httpx client, submits a 1 KB
   model every 100 ms; it prints the probe's latency (p50/p95/p99, and the same probe on the idle service
   first) and the aggregate ingest rate beside the limit from step 1;
4. **the disk's floor**: a 1 KB file fsync plus a SQLite WAL commit (what a submit waits for to be durable)
   every 100 ms while two threads write big files the way the service does (``service.jobs.upload.StagedFile``),
   with no service at all.

Goals (issue 12): probe p99 <= 100 ms under the load, aggregate >= 80% of the limit. Bounded in count and
time; everything is torn down at the end. Results also go to ``bench/results/ingest.json``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.loopback import free_port, wait_http
from bench.uploads import SPEC, load, multipart_request, onnx_model, send_upload

ROOT = Path(__file__).resolve().parent.parent


def machine_limit(bodies: list[bytes], folder: Path) -> float:
    """MB/s for sha256 + write + fsync of every body in turn, in this process (1 MiB pieces, as the API)."""
    start = time.perf_counter()
    for index, body in enumerate(bodies):
        digest = hashlib.sha256()
        with open(folder / f"limit-{index}", "wb") as handle:
            for offset in range(0, len(body), 1 << 20):
                piece = body[offset : offset + (1 << 20)]
                digest.update(piece)
                handle.write(piece)
            handle.flush()
            os.fsync(handle.fileno())
        digest.hexdigest()
        (folder / f"limit-{index}").unlink()
    elapsed = time.perf_counter() - start
    return sum(len(b) for b in bodies) / elapsed / 1e6


def durable_write_floor(bodies: list[bytes], folder: Path, seconds: float = 8.0) -> dict:
    """What a small submit's durability costs on this disk while big uploads are written: every 100 ms a 1 KB
    file written + fsynced and one SQLite WAL commit (the two a submit waits for), alone, while two threads
    write the clients' bodies without pause the way the service does (``service.jobs.upload.StagedFile``). No
    service, no network: the disk's own floor (ms)."""
    import sqlite3

    from service.jobs.upload import StagedFile

    stop = threading.Event()

    def writer(index: int) -> None:
        round_ = 0
        while not stop.is_set():
            body = memoryview(bodies[(index + 2 * round_) % len(bodies)])
            path = folder / f"floor-big-{index}"
            staged = StagedFile(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))  # as the service
            for offset in range(0, len(body), 1 << 20):
                if stop.is_set():
                    break
                staged.write(body[offset : offset + (1 << 20)])
            staged.commit()
            path.unlink()
            round_ += 1

    database = sqlite3.connect(folder / "floor.db")
    database.execute("PRAGMA journal_mode=WAL")
    database.execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
    writers = [threading.Thread(target=writer, args=(i,)) for i in range(2)]
    for thread in writers:
        thread.start()
    both: list[float] = []
    try:
        time.sleep(1.0)
        deadline = time.monotonic() + seconds
        index = 0
        while time.monotonic() < deadline:
            start = time.perf_counter()
            with open(folder / "floor-small", "wb") as handle:
                handle.write(b"x" * 1024)
                handle.flush()
                os.fsync(handle.fileno())
            database.execute("INSERT INTO t VALUES (?)", (index,))
            database.commit()
            both.append(time.perf_counter() - start)
            index += 1
            time.sleep(0.1)
    finally:
        stop.set()
        for thread in writers:
            thread.join()
        database.close()
    return _summary(both)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def _post(client, base_url: str, body: bytes, name: str) -> float:
    start = time.perf_counter()
    response = client.post(
        f"{base_url}/optimize", files={"model": (name, body, "application/octet-stream")}, data={"spec": SPEC}
    )
    elapsed = time.perf_counter() - start
    if response.status_code != 202:
        raise RuntimeError(f"submit answered {response.status_code}: {response.text[:300]}")
    return elapsed


def sender_ceiling(bodies: list[bytes]) -> float:
    """MB/s at which ``load``'s way of sending pushes the same uploads into sockets that discard them (a
    thread per connection reading into one buffer): the most the load generator could show of any server."""
    clients = len(bodies)
    listener = socket.create_server(("127.0.0.1", 0), backlog=clients)
    address = listener.getsockname()

    def discard(connection: socket.socket) -> None:
        with connection:
            buffer = bytearray(1 << 20)
            header = b""
            while b"\r\n\r\n" not in header:
                header += connection.recv(65536)
            head, rest = header.split(b"\r\n\r\n", 1)
            length = int(next(
                line.split(b":", 1)[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
            ))
            received = len(rest)
            while received < length:
                received += connection.recv_into(buffer)
            connection.sendall(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    def accept() -> None:
        for _ in range(clients):
            connection, _ = listener.accept()
            threading.Thread(target=discard, args=(connection,), daemon=True).start()

    requests = [multipart_request("127.0.0.1", body, f"sink{i}.onnx") for i, body in enumerate(bodies)]
    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    threads = [threading.Thread(target=send_upload, args=(address, requests[i])) for i in range(clients)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    listener.close()
    return sum(len(body) for _, body, _ in requests) / elapsed / 1e6


def probe_process(base_url: str, seed: int, idle_probes: int, start_at: float, stop, queue) -> None:
    """Runs in its own process (the uploaders' threads must not delay it): an idle series first, then a
    1 KB submit every 100 ms from ``start_at`` until ``stop`` is set."""
    import httpx

    small = onnx_model(10_000 + seed, 1024)
    idle: list[float] = []
    loaded: list[float] = []
    with httpx.Client(timeout=60) as client:
        for index in range(idle_probes):
            idle.append(_post(client, base_url, small, f"idle{index}.onnx"))
            time.sleep(0.1)
        time.sleep(max(0.0, start_at - time.time()))
        index = 0
        while not stop.is_set():
            tick = time.perf_counter()
            loaded.append(_post(client, base_url, small, f"probe{index}.onnx"))
            index += 1
            stop.wait(max(0.0, 0.1 - (time.perf_counter() - tick)))
    queue.put({"idle_probe_s": idle, "loaded_probe_s": loaded})


def run(args) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="flexdsa-ingest-"))
    try:
        bodies = [onnx_model(args.seed + i, args.model_mb * 1_000_000) for i in range(args.clients)]
        load_before = os.getloadavg()[0]
        limit_before = machine_limit(bodies, tmp)
        ceiling = sender_ceiling(bodies)
        port = free_port()
        env = dict(os.environ)
        env.update(
            {
                "FLEXDSA_DATA_DIR": str(tmp / "data"),
                "FLEXDSA_EMBEDDED_WORKER": "false",
                "FLEXDSA_MAX_QUEUED_JOBS_PER_TENANT": "100000",
                "FLEXDSA_SUBMIT_RATE_PER_MINUTE": "100000",
                "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
            }
        )
        for key in ("FLEXDSA_DATABASE_URL", "FLEXDSA_BROKER_URL", "FLEXDSA_REDIS_URL"):
            env.pop(key, None)
        log = open(tmp / "api.log", "wb")
        server = subprocess.Popen(
            [sys.executable, "-m", "flexdsa_core.cli", "serve", "--port", str(port),
             *(["--workers", str(args.workers)] if args.workers else [])],  # none: serve's own default
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            base_url = f"http://127.0.0.1:{port}"
            wait_http(f"{base_url}/healthz", 60, str(tmp / "api.log"))
            context = multiprocessing.get_context("spawn")
            loads, probes, stop = context.Queue(), context.Queue(), context.Event()
            # Both processes build their bodies first; the uploads start together after the idle probes.
            start_at = time.time() + 10 + 0.15 * args.idle_probes
            uploader = context.Process(
                target=load, args=(base_url, args.clients, args.model_mb * 1_000_000, args.seed, start_at, loads)
            )
            prober = context.Process(
                target=probe_process, args=(base_url, args.seed, args.idle_probes, start_at, stop, probes)
            )
            prober.start()
            uploader.start()
            result = loads.get(timeout=args.max_seconds)
            stop.set()
            result.update(probes.get(timeout=120))
            for process in (uploader, prober):
                process.join(30)
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
        # The limit again, right after: on a shared machine it moves by tens of percent within a minute, so
        # the service is held against the mean of both and the reader sees how far they were apart.
        limit_after = machine_limit(bodies, tmp)
        load_after = os.getloadavg()[0]
        floor = durable_write_floor(bodies, tmp) if args.floor else {}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    limit_mb_s = (limit_before + limit_after) / 2
    aggregate = result["bytes"] / result["wall_s"] / 1e6
    loaded, idle = result["loaded_probe_s"], result["idle_probe_s"]
    return {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "clients": args.clients,
        "api_workers": args.workers or f"serve's default ({_default_api_processes()})",
        "model_mb": args.model_mb,
        "limit_mb_s": round(limit_mb_s, 1),
        "limit_before_after_mb_s": [round(limit_before, 1), round(limit_after, 1)],
        "load_average_before_after": [round(load_before, 2), round(load_after, 2)],
        "aggregate_mb_s": round(aggregate, 1),
        "aggregate_vs_limit": round(aggregate / limit_mb_s, 3),
        "sender_ceiling_mb_s": round(ceiling, 1),
        "wall_s": round(result["wall_s"], 2),
        "probe_idle_ms": _summary(idle),
        "probe_loaded_ms": _summary(loaded),
        "probes_under_load": len(loaded),
        "durable_write_floor_ms": floor,
    }


def _summary(values: list[float]) -> dict:
    if not values:
        return {}
    return {
        "p50": round(percentile(values, 50) * 1e3, 1),
        "p95": round(percentile(values, 95) * 1e3, 1),
        "p99": round(percentile(values, 99) * 1e3, 1),
        "mean": round(statistics.fmean(values) * 1e3, 1),
    }



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--store", choices=("local", "s3"), default="local",
        help="s3: ingest into an S3-compatible store (Ceph radosgw) and a presigned download (bench.ingest_s3)",
    )
    parser.add_argument("--clients", type=int, default=None, help="default 20 (local), 8 (s3)")
    parser.add_argument("--model-mb", type=int, default=51)
    parser.add_argument("--download-mb", type=int, default=1000, help="s3: the presigned download's size")
    parser.add_argument("--idle-probes", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-seconds", type=float, default=300)
    parser.add_argument(
        "--workers", type=int, default=None,
        help="API processes (`flexdsa serve --workers N`); default: none given, serve's own default (one per "
        "core, bounded), as a user running the README's command gets",
    )
    parser.add_argument(
        "--no-floor", dest="floor", action="store_false",
        help="skip the disk's floor (1 KB fsync + SQLite commit beside two big writers)",
    )
    args = parser.parse_args(argv)
    if args.store == "s3":
        from bench import ingest_s3

        args.clients = args.clients or 8
        return ingest_s3.main(args)
    args.clients = args.clients or 20
    result = run(args)
    print(json.dumps(result, indent=2))
    loaded = result["probe_loaded_ms"]
    print(
        f"\n{args.clients} clients x {args.model_mb} MB: aggregate {result['aggregate_mb_s']} MB/s = "
        f"{result['aggregate_vs_limit']:.0%} of this machine's sha256+write+fsync limit ({result['limit_mb_s']} MB/s, "
        f"mean of {result['limit_before_after_mb_s'][0]} before and {result['limit_before_after_mb_s'][1]} after; "
        f"load average {result['load_average_before_after'][0]} -> {result['load_average_before_after'][1]}; "
        f"the load generator's own ceiling into discarding sockets: {result['sender_ceiling_mb_s']} MB/s); "
        f"1 KB submit every 100 ms meanwhile: p50 {loaded.get('p50')} ms, p99 {loaded.get('p99')} ms "
        f"(idle p50 {result['probe_idle_ms'].get('p50')} ms)"
    )
    floor = result["durable_write_floor_ms"]
    if floor:
        print(
            f"the disk's own floor for a submit's durability (1 KB fsync + SQLite commit, no service, beside two "
            f"big writers): p50 {floor['p50']} ms, p99 {floor['p99']} ms"
        )
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "ingest.json").write_text(json.dumps(result, indent=2))
    return 0


def _default_api_processes() -> int:
    from service.core.config import Settings

    return Settings(api_workers=None).api_processes()


if __name__ == "__main__":
    sys.exit(main())
