"""Service and compiler mechanics, timed against their peers: ``python -m bench.mechanics``.

The unit tests assert what these mechanisms do (by events, counters and state); how fast they do it is
measured here, each beside a peer run in the same process, and printed as a ratio with the goal it is held to:

- ``lock``: the SQLite submit lock's hand-over (``service.jobs.service._one_writer_at_a_time``): from the moment
  another process lets go to the moment a waiting submit gets in, against SQLite's own busy handler on the same
  kind of wait. Goal: ours p95 <= 50 ms.
- ``cancel``: ``execute_job`` on the workers' stand-in (each stage slowed), cancelled once its second stage
  starts: from the cancel request to ``cancelled``, against the same job run to its end. Goal: stopped within
  two of the worker's cancel checks (``CANCEL_CHECK_S``).
- ``job_cache``: an identical second submission (served from the whole-job cache) against the first, which ran
  the pipeline. Goal: <= 1/3 of the first (``bench.service`` measures the same through HTTP and Celery).
- ``redis_outage``: a kernel-cache get + put against a dead Redis, with the layer's breaker, against a live
  Redis and against the dead one with the breaker off. Goal: 100 operations on the dead Redis in < 2 s.
- ``fixed_cost``: the cost model's figure for one MatMul timed alone on this machine's clock, with 50 us added
  to every timed run (the machine's fixed cost of a run moving), against the same without. Goal: within
  +-50% (10 us absolute) of each other.
- ``stream``: a job's progress event from the worker's publish to the client reading it on
  ``GET /jobs/{id}/events``, woken by the Redis nudge, against the same stream polling the database (no Redis).
  Goal: the nudged p95 under the poll interval (``sse_poll_interval_s``).
- ``run_budget``: an ONNX Runtime run of a 10^9-iteration Loop under a 1 s budget: how long until it is stopped,
  against the budget. Goal: <= 5x the budget.

``cancel`` and ``job_cache`` run the workers on an embedded SQLite database (no PostgreSQL needed);
``redis_outage``'s live peer and ``stream`` need Redis (``--redis-url``, default ``FLEXDSA_BENCH_REDIS_URL`` or
database 14 on 127.0.0.1:6379): without it they say so and the rest still runs. ``--only lock,cancel`` runs a
subset. Results: stdout and ``bench/results/mechanics.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REDIS_URL = os.environ.get("FLEXDSA_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
DEAD_REDIS_URL = "redis://127.0.0.1:1/0"
STANDIN = "tests.workers.standin:StandInOptimizer"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = (len(ordered) - 1) * q
    low, high = int(rank), min(int(rank) + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _ms(values: list[float]) -> dict:
    return {
        "p50_ms": round(percentile(values, 0.5) * 1e3, 2),
        "p95_ms": round(percentile(values, 0.95) * 1e3, 2),
        "rounds": len(values),
    }


def _line(name: str, ours: str, peer: str, ratio: float | None, goal: str, met: bool | None) -> str:
    verdict = "n/a" if met is None else ("met" if met else "MISSED")
    ratio_text = "-" if ratio is None else f"{ratio:.3g}x"
    return f"{name:<13} ours {ours:<38} peer {peer:<50} ratio {ratio_text:<8} goal {goal} [{verdict}]"


# --- lock: the SQLite submit lock's hand-over -------------------------------------------------------------

_FLOCK_HOLDER = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1] + '.submit-lock', os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print('held', flush=True)
time.sleep(float(sys.argv[2]))
print(repr(time.time()), flush=True)
fcntl.flock(fd, fcntl.LOCK_UN)
"""

_SQLITE_HOLDER = """
import sqlite3, sys, time
database = sqlite3.connect(sys.argv[1], isolation_level=None)
database.execute('BEGIN IMMEDIATE')
print('held', flush=True)
time.sleep(float(sys.argv[2]))
print(repr(time.time()), flush=True)
database.execute('COMMIT')
"""


def _hand_over(holder_code: str, database: Path, hold_s: float, enter: Callable[[], Callable[[], None]]) -> float:
    """Seconds from another process letting go of the lock to ``enter()`` getting in (``enter`` returns the
    function that lets go again)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", holder_code, str(database), str(hold_s)], stdout=subprocess.PIPE, text=True
    )
    try:
        if holder.stdout.readline().strip() != "held":
            raise RuntimeError("the lock holder did not start")
        leave = enter()
        entered = time.time()
        leave()
        released = float(holder.stdout.readline())
        holder.wait(30)
    finally:
        if holder.poll() is None:
            holder.kill()
    return max(entered - released, 0.0)


def bench_lock(rounds: int, hold_s: float = 0.3) -> dict:
    from contextlib import ExitStack

    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from service.jobs.service import _one_writer_at_a_time

    folder = Path(tempfile.mkdtemp(prefix="flexdsa-lock-"))
    try:
        ours_db, peer_db = folder / "ours.db", folder / "peer.db"
        sqlite3.connect(peer_db).execute("CREATE TABLE IF NOT EXISTS t (x INTEGER)").connection.close()
        session = Session(create_engine(f"sqlite:///{ours_db}"))

        def ours() -> Callable[[], None]:
            stack = ExitStack()
            stack.enter_context(_one_writer_at_a_time(session))
            return stack.close

        def sqlite_busy_handler() -> Callable[[], None]:
            database = sqlite3.connect(peer_db, timeout=30, isolation_level=None)
            database.execute("BEGIN IMMEDIATE")  # waits in SQLite's busy handler while the holder writes

            def leave() -> None:
                database.execute("ROLLBACK")
                database.close()

            return leave

        ours_s, peer_s = [], []
        for _ in range(rounds):  # interleaved, so both see the same machine
            ours_s.append(_hand_over(_FLOCK_HOLDER, ours_db, hold_s, ours))
            peer_s.append(_hand_over(_SQLITE_HOLDER, peer_db, hold_s, sqlite_busy_handler))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ours_ms, peer_ms = _ms(ours_s), _ms(peer_s)
    ratio = ours_ms["p50_ms"] / peer_ms["p50_ms"] if peer_ms["p50_ms"] else None
    met = ours_ms["p95_ms"] <= 50
    print(_line("lock", f"p50 {ours_ms['p50_ms']} ms p95 {ours_ms['p95_ms']} ms",
                f"SQLite busy handler p50 {peer_ms['p50_ms']} ms p95 {peer_ms['p95_ms']} ms",
                ratio, "ours p95 <= 50 ms", met), flush=True)  # fmt: skip
    return {"ours": ours_ms, "sqlite_busy_handler": peer_ms, "ratio_p50": ratio, "goal_met": met}


# --- cancel and job_cache: execute_job on an embedded SQLite database --------------------------------------


class _Jobs:
    """Embedded-mode settings on a fresh SQLite database (migrated), the stand-in optimizer in the pipeline
    process, and ``tests.workers.conftest.create_job`` to queue jobs as the API does."""

    def __init__(self) -> None:
        from service.core.config import Settings
        from service.core.db import make_engine, upgrade
        from tests.workers.hooks import install

        install()  # the pipeline processes run the tests' hooked child (the stand-in, the stage delay)
        os.environ["FLEXDSA_TEST_OPTIMIZER"] = STANDIN
        self.folder = Path(tempfile.mkdtemp(prefix="flexdsa-mechanics-"))
        self.settings = Settings(data_dir=self.folder, artifact_dir=self.folder / "artifacts", lease_seconds=30)
        engine = make_engine(self.settings.database_url)
        upgrade(engine)
        engine.dispose()

    def run(self, job_id: str) -> str:
        from workers.execute import execute_job

        return execute_job(job_id, settings=self.settings, worker_id="bench")

    def create(self, seed: int) -> str:
        from tests.workers.conftest import create_job, tiny_model

        return create_job(self.settings, tiny_model((0.1, 0.2, 0.001 * seed)))

    def close(self) -> None:
        os.environ.pop("FLEXDSA_TEST_OPTIMIZER", None)
        os.environ.pop("FLEXDSA_TEST_STAGE_DELAY_S", None)
        shutil.rmtree(self.folder, ignore_errors=True)


def bench_cancel(rounds: int, stage_delay_s: float = 2.0) -> dict:
    from sqlalchemy import update

    from service.core.db import session_factory_for
    from service.core.models import Job
    from tests.workers.conftest import load_job
    from workers.execute import CANCEL_CHECK_S

    jobs = _Jobs()
    os.environ["FLEXDSA_TEST_STAGE_DELAY_S"] = str(stage_delay_s)
    try:
        full, stopped = [], []
        for index in range(rounds):
            job_id = jobs.create(1000 + index)
            started = time.perf_counter()
            status = jobs.run(job_id)
            full.append(time.perf_counter() - started)
            if status != "succeeded":
                raise RuntimeError(f"the uncancelled job ended {status}")

            job_id = jobs.create(2000 + index)
            requested_at: list[float] = []

            def cancel_at_the_second_stage(job_id: str = job_id, requested_at: list[float] = requested_at) -> None:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline and load_job(jobs.settings, job_id).stage != "shapes":
                    time.sleep(0.02)
                with session_factory_for(jobs.settings)() as session, session.begin():
                    session.execute(update(Job).where(Job.id == job_id).values(cancel_requested=True))
                requested_at.append(time.perf_counter())

            canceller = threading.Thread(target=cancel_at_the_second_stage)
            canceller.start()
            status = jobs.run(job_id)
            ended = time.perf_counter()
            canceller.join(30)
            if status != "cancelled" or not requested_at:
                raise RuntimeError(f"the cancelled job ended {status}")
            stopped.append(ended - requested_at[0])
    finally:
        jobs.close()
    full_s, stop_s = statistics.median(full), statistics.median(stopped)
    met = max(stopped) <= 2 * CANCEL_CHECK_S
    print(_line("cancel", f"request->cancelled {stop_s:.2f} s (max {max(stopped):.2f})",
                f"the same job to its end {full_s:.2f} s", stop_s / full_s,
                f"stopped <= {2 * CANCEL_CHECK_S:g} s after the request", met), flush=True)  # fmt: skip
    return {"cancel_to_cancelled_s": stopped, "run_to_end_s": full, "ratio_median": stop_s / full_s,
            "stage_delay_s": stage_delay_s, "goal_met": met}  # fmt: skip


def bench_job_cache(rounds: int, stage_delay_s: float = 0.3) -> dict:
    jobs = _Jobs()
    os.environ["FLEXDSA_TEST_STAGE_DELAY_S"] = str(stage_delay_s)
    try:
        first, second = [], []
        for index in range(rounds):
            for timings in (first, second):  # a new model, then the identical submission
                job_id = jobs.create(3000 + index)
                started = time.perf_counter()
                status = jobs.run(job_id)
                timings.append(time.perf_counter() - started)
                if status != "succeeded":
                    raise RuntimeError(f"job {job_id} ended {status}")
    finally:
        jobs.close()
    first_s, second_s = statistics.median(first), statistics.median(second)
    ratio = second_s / first_s
    met = ratio <= 1 / 3
    print(_line("job_cache", f"identical resubmission {second_s * 1e3:.0f} ms",
                f"the first run {first_s * 1e3:.0f} ms", ratio, "<= 0.333x", met), flush=True)  # fmt: skip
    return {"first_s": first, "cached_s": second, "ratio_median": ratio, "goal_met": met}


# --- redis_outage: the kernel cache's Redis layer --------------------------------------------------------


def _ops_seconds(cache, count: int = 50) -> float:
    started = time.perf_counter()
    for n in range(count):
        cache.get(f"kernel:bench:{n}")
        cache.put(f"kernel:bench:{n}", b"x")
    return time.perf_counter() - started


def bench_redis_outage(redis_url: str) -> dict:
    import logging

    import redis

    from workers.cache_backends import RedisCache

    logging.getLogger("workers.cache_backends").setLevel(logging.ERROR)  # one warning per trip otherwise
    breaker_s = _ops_seconds(RedisCache(DEAD_REDIS_URL, 60))
    no_breaker_s = _ops_seconds(RedisCache(DEAD_REDIS_URL, 60, retry_after_s=0.0))
    live_s = None
    try:
        redis.Redis.from_url(redis_url, socket_connect_timeout=2).ping()
        live_s = _ops_seconds(RedisCache(redis_url, 60))
    except Exception as err:
        print(f"redis_outage: no live Redis at {redis_url} ({err}); the live peer is left out", flush=True)
    met = breaker_s < 2.0
    peer = f"live {live_s * 1e3:.1f} ms" if live_s is not None else "live: not reachable"
    print(_line("redis_outage", f"100 ops, dead + breaker {breaker_s * 1e3:.1f} ms",
                f"{peer}; dead, no breaker {no_breaker_s * 1e3:.1f} ms",
                breaker_s / live_s if live_s else None, "dead + breaker < 2 s", met), flush=True)  # fmt: skip
    return {"dead_with_breaker_s": breaker_s, "dead_without_breaker_s": no_breaker_s, "live_s": live_s,
            "ratio_to_live": breaker_s / live_s if live_s else None, "goal_met": met}  # fmt: skip


# --- fixed_cost: the cost model's kernel figure when the machine's fixed cost of a run moves ---------------


def bench_fixed_cost(rounds: int) -> dict:
    import numpy as np
    import onnx
    import onnx_ir as ir

    from flexdsa_core.cache import LRUCache
    from flexdsa_core.cost_model import CostModel
    from flexdsa_core.kernel_timing import timed
    from flexdsa_core.targets import load_target

    # The MatMul of tests/core/test_cost_model.py's fixed-cost test, its weight an initializer.
    text = """<ir_version: 9, opset_import: ["" : 17]>
g (float[16, 256] x, float[256, 64] w) => (float[16, 64] y) { y = MatMul (x, w) }"""
    proto = onnx.parser.parse_model(text)
    proto.graph.initializer.append(
        onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((256, 64)).astype(np.float32), "w")
    )
    del proto.graph.input[1]
    node = ir.from_proto(proto).graph.node(0)
    extra = [0.0]

    def timer(function) -> float:
        return timed(function) + extra[0]

    quiet, busy = [], []
    for _ in range(rounds):
        for figures, added in ((quiet, 0.0), (busy, 50e-6)):
            extra[0] = added
            figures.append(CostModel(load_target("cpu-ort"), cache=LRUCache(), timer=timer).node_cost(node).seconds)
    quiet_s, busy_s = statistics.median(quiet), statistics.median(busy)
    met = abs(busy_s - quiet_s) <= max(0.5 * quiet_s, 10e-6)
    print(_line("fixed_cost", f"+50 us per run {busy_s * 1e6:.1f} us", f"unchanged machine {quiet_s * 1e6:.1f} us",
                busy_s / quiet_s, "within +-50% (10 us)", met), flush=True)  # fmt: skip
    return {"quiet_s": quiet, "busy_s": busy, "ratio_median": busy_s / quiet_s, "goal_met": met}


# --- stream: progress events from the worker's publish to the client --------------------------------------


def _stream_latencies(settings, rounds: int) -> list[float]:
    from fastapi.testclient import TestClient

    from service.core.models import Job
    from service.jobs import service as jobs
    from stack import create_app
    from tests.service.conftest import tiny_onnx

    app = create_app(settings)
    latencies = []
    with TestClient(app) as client:
        for index in range(rounds):
            answer = client.post(
                "/optimize",
                files={"model": ("m.onnx", tiny_onnx(0.1 + index / 1000))},
                data={"spec": json.dumps({"target": "cpu-ort", "seed": index})},
            )
            answer.raise_for_status()
            job_id = answer.json()["job_id"]
            arrived: dict[str, float] = {}
            first_event = threading.Event()

            def read(job_id: str = job_id, arrived: dict = arrived, first_event: threading.Event = first_event) -> None:
                with client.stream("GET", f"/jobs/{job_id}/events") as response:
                    for line in response.iter_lines():
                        if line.startswith("event:"):
                            arrived.setdefault(line.split(":", 1)[1].strip(), time.perf_counter())
                            first_event.set()

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            if not first_event.wait(30):
                raise RuntimeError("the progress stream sent nothing")
            time.sleep(0.2)  # the stream is waiting now: its first read is done
            sessions = app.state.session_factory
            with sessions() as session:
                job = session.get(Job, job_id)
                job.status, job.stage, job.progress = "running", "fusion", 0.5
                job.record("progress", "fusing")
                session.commit()
                published = time.perf_counter()
                jobs.publish(app.state.redis, job, "progress")
            deadline = time.monotonic() + 30
            while "progress" not in arrived and time.monotonic() < deadline:
                time.sleep(0.001)
            latencies.append(arrived["progress"] - published)
            with sessions() as session:
                job = session.get(Job, job_id)
                job.status, job.stage, job.progress = "succeeded", "done", 1.0
                job.record("succeeded", "finished by the bench")
                session.commit()
                jobs.publish(app.state.redis, job, "succeeded")
            reader.join(30)
    return latencies


def bench_stream(redis_url: str, rounds: int) -> dict | None:
    import redis

    from service.core.config import Settings

    try:
        redis.Redis.from_url(redis_url, socket_connect_timeout=2).ping()
    except Exception as err:
        print(f"stream: no Redis at {redis_url} ({err}); left out", flush=True)
        return None
    folder = Path(tempfile.mkdtemp(prefix="flexdsa-stream-"))
    try:
        common = {"embedded_worker": False, "submit_rate_per_minute": 100_000, "max_queued_jobs_per_tenant": 100_000}
        nudged = _stream_latencies(Settings(data_dir=folder / "redis", redis_url=redis_url, **common), rounds)
        polled_settings = Settings(data_dir=folder / "poll", **common)
        polled = _stream_latencies(polled_settings, rounds)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    ours, peer = _ms(nudged), _ms(polled)
    interval_ms = polled_settings.sse_poll_interval_s * 1e3
    met = ours["p95_ms"] < interval_ms
    print(_line("stream", f"Redis nudge p50 {ours['p50_ms']} ms p95 {ours['p95_ms']} ms",
                f"polling p50 {peer['p50_ms']} ms p95 {peer['p95_ms']} ms",
                ours["p50_ms"] / peer["p50_ms"] if peer["p50_ms"] else None,
                f"nudged p95 < the {interval_ms:g} ms poll interval", met), flush=True)  # fmt: skip
    return {"nudged": ours, "polled": peer, "poll_interval_ms": interval_ms, "goal_met": met}


# --- run_budget: an unbounded ONNX Runtime run stopped at its budget --------------------------------------


def bench_run_budget(budget_s: float = 1.0) -> dict:
    import numpy as np

    from flexdsa_core.errors import RunBudgetExceededError
    from flexdsa_core.ort_runs import run, run_budget
    from tests.core.test_run_budget import endless_loop_model

    started = time.perf_counter()
    try:
        with run_budget(budget_s):
            run(endless_loop_model(), {"x": np.zeros(1, np.float32)})
    except RunBudgetExceededError:
        pass
    else:
        raise RuntimeError("the endless loop was not stopped")
    stopped_s = time.perf_counter() - started
    met = stopped_s <= 5 * budget_s
    print(_line("run_budget", f"stopped after {stopped_s:.2f} s", f"the budget {budget_s:g} s",
                stopped_s / budget_s, "<= 5x the budget", met), flush=True)  # fmt: skip
    return {"budget_s": budget_s, "stopped_after_s": stopped_s, "ratio": stopped_s / budget_s, "goal_met": met}


BENCHES = ("lock", "cancel", "job_cache", "redis_outage", "fixed_cost", "stream", "run_budget")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mechanics", description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(BENCHES), help=f"a subset of {','.join(BENCHES)}")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of the quick measurements (lock, stream, ...)")
    parser.add_argument("--job-rounds", type=int, default=3, help="rounds of cancel and job_cache (seconds each)")
    parser.add_argument("--redis-url", default=DEFAULT_REDIS_URL)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "mechanics.json")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(BENCHES))
    if unknown:
        parser.error(f"unknown bench(es) {unknown}; known: {', '.join(BENCHES)}")
    sys.path.insert(0, str(ROOT))  # the stand-in and the tests' helpers are imported from the checkout
    runs = {
        "lock": lambda: bench_lock(args.rounds),
        "cancel": lambda: bench_cancel(args.job_rounds),
        "job_cache": lambda: bench_job_cache(args.job_rounds),
        "redis_outage": lambda: bench_redis_outage(args.redis_url),
        "fixed_cost": lambda: bench_fixed_cost(args.rounds),
        "stream": lambda: bench_stream(args.redis_url, args.rounds),
        "run_budget": lambda: bench_run_budget(),
    }
    results: dict = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                 "load_average": os.getloadavg()[0]}}  # fmt: skip
    for name in chosen:
        results[name] = runs[name]()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    missed = [name for name in chosen if isinstance(results[name], dict) and results[name].get("goal_met") is False]
    print(f"goals missed: {', '.join(missed)}" if missed else "every goal measured here was met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
