"""Service benchmark: ``python -m bench.service``.

Starts the whole distributed service on loopback (uvicorn on 127.0.0.1, Celery workers, a fresh
PostgreSQL database, a dedicated Redis database), then from a second process submits a bounded batch of
distinct models over HTTP and measures:

- submit latency: ``POST /optimize`` until the 202 answer (p50/p95/p99), under ``--concurrency`` clients;
- throughput: jobs per minute from the first submit until the last job is finished, with 1 and 2 workers;
- the whole-job cache: submit-to-succeeded time of a new model vs an identical resubmission.

Everything is bounded (job counts, ``--max-seconds``) and torn down at the end, also on failure. Results go
to stdout and ``bench/results/service.json``. Needs PostgreSQL and Redis (``--pg-admin-url``,
``--redis-url``). ``--stand-in`` swaps the compiler for the test stand-in (``tests/workers/standin.py``) to
measure the service machinery alone.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from bench.loopback import free_port, wait_http

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = {"succeeded", "failed", "cancelled"}
SPEC = {"target": "cpu-ort", "measure_latency": False}


def model_bytes(seed: int, widths: tuple[int, ...] = (64, 128, 64, 32)) -> bytes:
    """A small MLP (MatMul+Add+Relu layers); the seed changes the weights, so each model is a new upload
    while the layer shapes (the kernels) stay the same, as for fine-tuned variants of one architecture."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits, name = [], [], "x"
    for index, (fan_in, fan_out) in enumerate(zip(widths, widths[1:], strict=False)):
        w, b = f"w{index}", f"b{index}"
        inits += [
            numpy_helper.from_array(rng.standard_normal((fan_in, fan_out)).astype(np.float32), w),
            numpy_helper.from_array(rng.standard_normal(fan_out).astype(np.float32), b),
        ]
        nodes += [
            helper.make_node("MatMul", [name, w], [f"m{index}"]),
            helper.make_node("Add", [f"m{index}", b], [f"a{index}"]),
            helper.make_node("Relu", [f"a{index}"], [f"r{index}"]),
        ]
        name = f"r{index}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, widths[0]])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [4, widths[-1]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    return model.SerializeToString()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = (len(ordered) - 1) * q
    low, high = int(rank), min(int(rank) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


# --- the load generator (runs in its own process) -----------------------------------------------------


def _submit(client, base_url: str, key: str, model: bytes, name: str) -> tuple[float, dict]:
    started = time.perf_counter()
    response = client.post(
        f"{base_url}/optimize",
        headers={"X-API-Key": key},
        files={"model": (name, model)},
        data={"spec": json.dumps(SPEC)},
    )
    elapsed = time.perf_counter() - started
    if response.status_code != 202:
        raise RuntimeError(f"POST /optimize answered {response.status_code}: {response.text[:300]}")
    return elapsed, response.json()


def _wait_all(client, base_url: str, key: str, job_ids: list[str], deadline: float) -> dict[str, dict]:
    done: dict[str, dict] = {}
    while len(done) < len(job_ids) and time.monotonic() < deadline:
        for job_id in job_ids:
            if job_id in done:
                continue
            job = client.get(f"{base_url}/jobs/{job_id}", headers={"X-API-Key": key}).json()
            if job["status"] in TERMINAL:
                done[job_id] = {"status": job["status"], "at": time.perf_counter(), "error": job.get("error")}
        if len(done) < len(job_ids):
            time.sleep(0.1)
    return done


def load_run(
    base_url: str, key: str, jobs: int, concurrency: int, seed: int, max_seconds: float, out
) -> None:
    """Submit ``jobs`` distinct models with ``concurrency`` clients, wait for all; report timings on ``out``."""
    import httpx

    models = [model_bytes(seed + n) for n in range(jobs)]
    latencies: list[float] = []
    job_ids: list[str] = []
    errors: list[str] = []
    lock = threading.Lock()
    next_index = iter(range(jobs))

    def client_loop() -> None:
        with httpx.Client(timeout=60) as client:
            for index in next_index:  # shared iterator: each model submitted once
                try:
                    elapsed, body = _submit(client, base_url, key, models[index], f"m{seed + index}.onnx")
                except Exception as err:
                    with lock:
                        errors.append(str(err))
                    continue
                with lock:
                    latencies.append(elapsed)
                    job_ids.append(body["job_id"])

    started = time.perf_counter()
    threads = [threading.Thread(target=client_loop) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    submitted = time.perf_counter()
    with httpx.Client(timeout=30) as client:
        done = _wait_all(client, base_url, key, job_ids, time.monotonic() + max_seconds)
    last = max((d["at"] for d in done.values()), default=time.perf_counter())
    out.put(
        {
            "submitted": len(job_ids),
            "submit_errors": errors,
            "finished": len(done),
            "succeeded": sum(d["status"] == "succeeded" for d in done.values()),
            "failures": [d["error"] for d in done.values() if d["status"] != "succeeded"][:3],
            "submit_latency_s": latencies,
            "submit_phase_s": submitted - started,
            "makespan_s": last - started,
        }
    )


def cache_run(base_url: str, key: str, seed: int, max_seconds: float, out) -> None:
    """A new model until succeeded, then the identical request again."""
    import httpx

    model = model_bytes(seed)
    timings = []
    with httpx.Client(timeout=60) as client:
        for _ in range(2):
            started = time.perf_counter()
            _, body = _submit(client, base_url, key, model, "cached.onnx")
            done = _wait_all(client, base_url, key, [body["job_id"]], time.monotonic() + max_seconds)
            status = done.get(body["job_id"], {}).get("status")
            timings.append(
                {
                    "seconds": time.perf_counter() - started,
                    "status": status,
                    "cached": bool(body.get("cached")),
                }
            )
    out.put(timings)


def in_second_process(target, *args):
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    process = context.Process(target=target, args=(*args, out))
    process.start()
    result = out.get(timeout=args[-1] + 120)
    process.join(30)
    return result


# --- the service under test ---------------------------------------------------------------------------


class Service:
    """PostgreSQL database + Redis db + uvicorn + Celery workers, all torn down by ``close()``."""

    def __init__(self, args) -> None:
        self.args = args
        self.processes: list[subprocess.Popen] = []
        self.workers: list[subprocess.Popen] = []
        self.tmp = Path(tempfile.mkdtemp(prefix="flexdsa-bench-"))
        self.db_name = f"flexdsa_bench_{uuid.uuid4().hex[:8]}"
        base = args.pg_admin_url.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
        self.database_url = f"{base}/{self.db_name}"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = dict(os.environ)
        self.env.update(
            {
                "FLEXDSA_DATABASE_URL": self.database_url,
                "FLEXDSA_BROKER_URL": args.redis_url,
                "FLEXDSA_REDIS_URL": args.redis_url,
                "FLEXDSA_DATA_DIR": str(self.tmp),
                "FLEXDSA_ARTIFACT_DIR": str(self.tmp / "artifacts"),
                "FLEXDSA_MAX_QUEUED_JOBS_PER_TENANT": "1000",
                "FLEXDSA_SUBMIT_RATE_PER_MINUTE": "100000",
                "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
            }
        )
        if args.stand_in:
            self.env["FLEXDSA_TEST_OPTIMIZER"] = "tests.workers.standin:StandInOptimizer"

    def start(self) -> str:
        import psycopg
        import redis

        redis.Redis.from_url(self.args.redis_url).flushdb()
        with psycopg.connect(self.args.pg_admin_url, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{self.db_name}"')
        from service.auth.keys import create_api_key
        from service.core.db import make_engine, make_session_factory, upgrade

        engine = make_engine(self.database_url)
        upgrade(engine)
        with make_session_factory(engine)() as session, session.begin():
            key, _ = create_api_key(session, "bench")
        engine.dispose()
        self._spawn(
            [
                sys.executable,
                "-m",
                "tests.workers.launch",  # the stand-in optimizer (--stand-in) is a test hook
                "uvicorn",
                "stack:create_app",
                "--factory",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
            "api",
        )
        self._wait_http(f"{self.base_url}/healthz", 60)
        return key

    def _spawn(self, argv: list[str], name: str) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "wb")
        process = subprocess.Popen(
            argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.processes.append(process)
        return process

    def _wait_http(self, url: str, timeout_s: float) -> None:
        wait_http(url, timeout_s, f"{self.tmp}/api.log")

    def scale_workers(self, count: int) -> None:
        while len(self.workers) < count:
            name = f"bench{len(self.workers) + 1}"
            worker = self._spawn(
                [
                    sys.executable,
                    "-m",
                    "tests.workers.launch",
                    "celery",
                    "-A",
                    "workers.app",
                    "worker",
                    "--pool=prefork",
                    "-c",
                    "1",
                    "-Q",
                    "flexdsa",
                    "-n",
                    f"{name}@%h",
                    "--loglevel=INFO",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                ],
                name,
            )
            self.workers.append(worker)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            logs = [(self.tmp / f"bench{n + 1}.log").read_bytes() for n in range(len(self.workers))]
            if all(b" ready." in log for log in logs):
                break
            if any(w.poll() is not None for w in self.workers):
                raise RuntimeError(f"a worker exited; see {self.tmp}")
            time.sleep(0.3)
        time.sleep(2.0)  # let the pool processes finish importing before the clock starts

    def close(self, keep_logs: bool = False) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for process in self.processes:
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
        try:
            import psycopg

            with psycopg.connect(self.args.pg_admin_url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
        except Exception as err:
            print(f"could not drop {self.db_name}: {err}", file=sys.stderr)
        if keep_logs:
            print(f"service logs kept in {self.tmp}", file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def summarise(run: dict, workers: int) -> dict:
    latencies = [s * 1e3 for s in run["submit_latency_s"]]
    return {
        "workers": workers,
        "jobs": run["submitted"],
        "succeeded": run["succeeded"],
        "submit_p50_ms": round(percentile(latencies, 0.50), 1),
        "submit_p95_ms": round(percentile(latencies, 0.95), 1),
        "submit_p99_ms": round(percentile(latencies, 0.99), 1),
        "submit_mean_ms": round(statistics.fmean(latencies), 1) if latencies else None,
        "makespan_s": round(run["makespan_s"], 2),
        "jobs_per_minute": round(60 * run["succeeded"] / run["makespan_s"], 2) if run["makespan_s"] else 0,
        "errors": run["submit_errors"][:3] + run["failures"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=12, help="jobs per worker count (bounded: at most 200)")
    parser.add_argument("--concurrency", type=int, default=4, help="concurrent HTTP clients (at most 32)")
    parser.add_argument("--workers", default="1,2", help="worker counts to measure, e.g. 1,2")
    parser.add_argument("--max-seconds", type=float, default=300, help="wait at most this long per run")
    parser.add_argument(
        "--pg-admin-url",
        default=os.environ.get("FLEXDSA_BENCH_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"),
    )
    parser.add_argument(
        "--redis-url", default=os.environ.get("FLEXDSA_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
    )
    parser.add_argument(
        "--stand-in", action="store_true", help="use the test stand-in instead of the compiler"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "service.json")
    args = parser.parse_args(argv)
    args.jobs = max(1, min(args.jobs, 200))
    args.concurrency = max(1, min(args.concurrency, 32))
    worker_counts = [int(n) for n in args.workers.split(",") if n.strip()]

    service = Service(args)
    results: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "optimizer": "stand-in" if args.stand_in else "flexdsa_core",
        "jobs_per_run": args.jobs,
        "concurrency": args.concurrency,
        "runs": [],
    }
    succeeded = False
    try:
        key = service.start()
        service.scale_workers(min(worker_counts))
        # Warm-up, not measured: the API's first requests, the workers' first pipeline, the kernel cache.
        in_second_process(load_run, service.base_url, key, 2, 1, 500, args.max_seconds)
        seed = 1000
        for count in sorted(worker_counts):
            service.scale_workers(count)
            run = in_second_process(
                load_run, service.base_url, key, args.jobs, args.concurrency, seed, args.max_seconds
            )
            seed += args.jobs
            results["runs"].append(summarise(run, count))
            print(json.dumps(results["runs"][-1]), flush=True)
        fresh, again = in_second_process(cache_run, service.base_url, key, 99_999, args.max_seconds)
        results["cached_resubmission"] = {
            "fresh_s": round(fresh["seconds"], 3),
            "cached_s": round(again["seconds"], 4),
            "speedup": round(fresh["seconds"] / again["seconds"], 1) if again["seconds"] else None,
            "served_from_cache": again["cached"],
            "statuses": [fresh["status"], again["status"]],
            # The same goal as bench.mechanics' job_cache (in-process there), here through HTTP and Celery.
            "goal": "cached resubmission <= 1/3 of the fresh job's time",
            "goal_met": bool(again["seconds"] <= fresh["seconds"] / 3),
        }
        import httpx

        results["cache_stats"] = httpx.get(
            f"{service.base_url}/cache/stats", headers={"X-API-Key": key}, timeout=10
        ).json()
        succeeded = True
    finally:
        service.close(keep_logs=not succeeded)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
