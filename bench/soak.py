"""Soak under faults: ``python -m bench.soak`` (issues 9 and 12). Loopback only, bounded in count and time.

It starts a private PostgreSQL cluster and a private Redis (free ports, temporary folders: the machine's
shared servers are never touched), the API (uvicorn) and ``--workers`` Celery workers in distributed mode,
then submits ``--jobs`` distinct models (plus one poison model that aborts its pipeline process on every
attempt) over HTTP while it injects faults:

- SIGKILL of a random pipeline process (a worker's pool child) every ``--child-kill-every`` seconds;
- a whole worker killed (SIGKILL to its process group) and a new one started;
- Redis restarted once (its queue is lost: it keeps nothing on disk);
- PostgreSQL stopped (``-m immediate``) for 10 s, and later for 60 s, while jobs finish.

Then it waits for every accepted job to end and reads the database: jobs succeeded / failed with a reason /
lost (never ended) / with duplicate artifacts; the attempts histogram; the poison job's fate; the API's
answers during the database outages (503 expected, never 500) and how long after each return it served
again; how long after the whole-worker kill that worker's jobs were published again, running again and
finished, beside the bound the settings give for publishing again (lease + reconcile interval; a job
published again goes ahead of the queue, so it then waits only for a free worker). The pipeline is the
test stand-in (``tests/workers/standin.py``: a short sleep per kernel) unless ``--real-core``, so the
figures are the service's, not the compiler's.
Results: stdout and ``bench/results/soak.json`` (``soak_s3.json`` with ``--store s3``).
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from bench.loopback import free_port, wait_http

ROOT = Path(__file__).resolve().parent.parent
SPEC = json.dumps({"target": "cpu-ort", "measure_latency": False})
TERMINAL = {"succeeded", "failed", "cancelled"}


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


class PrivatePostgres:
    """An initdb'd cluster in a temporary folder on a free port; ``stop()``/``start()`` are the faults."""

    def __init__(self) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
        if not bins:
            raise SystemExit("bench.soak needs PostgreSQL's server binaries (Debian: postgresql)")
        self.bin = Path(bins[-1])
        self.dir = Path(tempfile.mkdtemp(prefix="flexdsa-soak-pg-"))
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self.port = free_port()
        subprocess.run(
            _as_postgres([str(self.bin / "initdb"), "-D", str(self.dir / "data"), "-A", "trust", "-U", "postgres"]),
            check=True, capture_output=True,
        )  # fmt: skip
        self.start()

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
        subprocess.run(
            _as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-o", options,
                          "-l", str(self.dir / "log"), "-w", "start"]),
            check=True, capture_output=True,
        )  # fmt: skip

    def stop(self) -> None:
        subprocess.run(
            _as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "stop"]),
            check=True, capture_output=True,
        )  # fmt: skip

    def close(self) -> None:
        try:
            self.stop()
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateRedis:
    def __init__(self) -> None:
        self.port = free_port()
        self.process: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("private redis-server did not start")

    def restart(self) -> None:
        self.process.kill()
        self.process.wait(10)
        self.start()

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)


def model_bytes(seed: int, poison: bool = False) -> bytes:
    """A small LeakyRelu chain, distinct per seed; the poison one is named so that the stand-in aborts."""
    from onnx import TensorProto, helper

    rng = random.Random(seed)
    nodes, name = [], "x"
    for index in range(4):
        nodes.append(helper.make_node("LeakyRelu", [name], [f"h{index}"], alpha=round(rng.uniform(0.01, 0.3), 6)))
        name = f"h{index}"
    graph = helper.make_graph(
        nodes, "flexdsa-poison" if poison else f"soak{seed}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, 8])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


class Stack:
    """API + workers on the private PostgreSQL and Redis."""

    def __init__(self, pg: PrivatePostgres, redis: PrivateRedis, args, s3=None) -> None:
        self.pg, self.redis, self.args, self.s3 = pg, redis, args, s3
        self.tmp = Path(tempfile.mkdtemp(prefix="flexdsa-soak-"))
        self.database_url = f"postgresql+psycopg://postgres@127.0.0.1:{pg.port}/flexdsa"
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.env = dict(os.environ)
        for name in list(self.env):
            if name.startswith("FLEXDSA_"):
                del self.env[name]
        self.env.update({
            "FLEXDSA_DATABASE_URL": self.database_url,
            "FLEXDSA_BROKER_URL": redis.url,
            "FLEXDSA_REDIS_URL": redis.url,
            "FLEXDSA_DATA_DIR": str(self.tmp),
            "FLEXDSA_ARTIFACT_DIR": str(self.tmp / "artifacts"),
            "FLEXDSA_MAX_QUEUED_JOBS_PER_TENANT": "100000",
            "FLEXDSA_SUBMIT_RATE_PER_MINUTE": "100000",
            "FLEXDSA_LOG_FORMAT": "text",
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        })  # fmt: skip
        if not args.real_core:
            self.env["FLEXDSA_TEST_OPTIMIZER"] = "tests.workers.standin:StandInOptimizer"
        self.store_settings: dict[str, str] = {}
        if s3 is not None:
            # Nothing shared but PostgreSQL, Redis and the bucket: no artifact folder; every process gets a
            # data folder of its own (start_worker).
            self.store_settings = s3.settings()
            del self.env["FLEXDSA_ARTIFACT_DIR"]
            self.env.update({
                **s3.env(),
                "FLEXDSA_ARTIFACT_URL": self.store_settings["artifact_url"],
                "FLEXDSA_S3_ENDPOINT_URL": self.store_settings["s3_endpoint_url"],
                "FLEXDSA_DATA_DIR": str(self.tmp / "api"),
            })  # fmt: skip
        self.api: subprocess.Popen | None = None
        self.workers: dict[str, subprocess.Popen] = {}
        self.spawned = 0

    def start(self) -> str:
        import psycopg

        with psycopg.connect(self.pg.admin_url, autocommit=True) as admin:
            admin.execute('CREATE DATABASE "flexdsa"')
        from service.auth.keys import create_api_key
        from service.core.db import make_engine, make_session_factory, upgrade

        engine = make_engine(self.database_url)
        upgrade(engine)
        with make_session_factory(engine)() as session, session.begin():
            key, _ = create_api_key(session, "soak")
        engine.dispose()
        self.api = self._spawn(
            [sys.executable, "-m", "tests.workers.launch", "uvicorn", "service.app:create_app", "--factory", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning"], "api",
        )  # fmt: skip
        wait_http(f"{self.base_url}/healthz", 60, str(self.tmp / "api.log"))
        for _ in range(self.args.workers):
            self.start_worker()
        return key

    def _spawn(self, argv: list[str], name: str, env: dict | None = None) -> subprocess.Popen:
        log = open(self.tmp / f"{name}.log", "ab")
        return subprocess.Popen(
            argv, cwd=ROOT, env={**self.env, **(env or {})}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )  # fmt: skip

    def start_worker(self) -> str:
        self.spawned += 1
        name = f"soak{self.spawned}"
        self.workers[name] = self._spawn(
            [sys.executable, "-m", "tests.workers.launch", "celery", "-A", "workers.app", "worker", "--pool=prefork", "-c", "1", "-Q",
             "flexdsa", "-n", f"{name}@%h", "--loglevel=INFO", "--without-gossip", "--without-mingle",
             "--without-heartbeat"], name, self._own_folder(name),
        )  # fmt: skip
        deadline = time.monotonic() + 90
        while b" ready." not in (self.tmp / f"{name}.log").read_bytes():
            if time.monotonic() > deadline or self.workers[name].poll() is not None:
                raise RuntimeError(f"worker {name} did not start; see {self.tmp / (name + '.log')}")
            time.sleep(0.3)
        return name

    def _own_folder(self, name: str) -> dict[str, str]:
        if self.s3 is None:
            return {}
        folder = self.tmp / name
        folder.mkdir(exist_ok=True)
        return {"FLEXDSA_DATA_DIR": str(folder)}

    def pids(self, name: str) -> set[int]:
        import psutil

        try:
            root = psutil.Process(self.workers[name].pid)
            return {root.pid, *(child.pid for child in root.children(recursive=True))}
        except psutil.NoSuchProcess:
            return set()

    def pipeline_children(self) -> list[int]:
        import psutil

        found = []
        for name in list(self.workers):
            for pid in self.pids(name):
                try:
                    if any(m in " ".join(psutil.Process(pid).cmdline()) for m in ("workers.child", "workers.hooked_child")):
                        found.append(pid)
                except psutil.NoSuchProcess:
                    pass
        return found

    def kill_worker(self, name: str) -> None:
        process = self.workers.pop(name)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)

    def close(self) -> None:
        for process in [*self.workers.values(), self.api]:
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)


class ChildKiller(threading.Thread):
    """SIGKILLs a random pipeline process of the workers every ``every_s`` seconds until ``stop`` is set."""

    def __init__(self, stack: Stack, every_s: float, rng: random.Random) -> None:
        super().__init__(daemon=True)
        self.stack, self.every_s, self.rng = stack, every_s, rng
        self.stop = threading.Event()
        self.kills = 0

    def run(self) -> None:
        while not self.stop.wait(self.every_s):
            try:
                children = self.stack.pipeline_children()
                if children:
                    os.kill(self.rng.choice(children), signal.SIGKILL)
                    self.kills += 1
            except (ProcessLookupError, KeyError, RuntimeError):
                pass  # it ended by itself, or its worker is being replaced


class Submitter(threading.Thread):
    """Submits every model once at a steady rate; a 503 (dependency down) is retried after Retry-After."""

    def __init__(self, base_url: str, key: str, models: list[bytes], duration_s: float) -> None:
        super().__init__(daemon=True)
        self.base_url, self.key, self.models, self.duration_s = base_url, key, models, duration_s
        self.job_ids: list[str] = []
        self.statuses: collections.Counter = collections.Counter()
        self.poison_id: str | None = None

    def run(self) -> None:
        import httpx

        period = self.duration_s / max(1, len(self.models))
        with httpx.Client(timeout=30) as client:
            for index, body in enumerate(self.models):
                tick = time.monotonic()
                while True:
                    try:
                        response = client.post(
                            f"{self.base_url}/optimize", headers={"X-API-Key": self.key},
                            files={"model": (f"m{index}.onnx", body)}, data={"spec": SPEC},
                        )  # fmt: skip
                    except httpx.HTTPError:
                        self.statuses["connection error"] += 1
                        time.sleep(1)
                        continue
                    self.statuses[response.status_code] += 1
                    if response.status_code == 202:
                        self.job_ids.append(response.json()["job_id"])
                        if index == 0:
                            self.poison_id = self.job_ids[-1]
                        break
                    if response.status_code in (503, 429):
                        time.sleep(min(5.0, float(response.headers.get("Retry-After", "1"))))
                        continue
                    raise RuntimeError(f"submit answered {response.status_code}: {response.text[:300]}")
                time.sleep(max(0.0, period - (time.monotonic() - tick)))


def probe_outage(base_url: str, key: str, until: threading.Event, out: collections.Counter) -> None:
    """GET /jobs every 0.25 s during a database outage: the statuses the API answered."""
    import httpx

    with httpx.Client(timeout=10) as client:
        while not until.is_set():
            try:
                out[client.get(f"{base_url}/jobs?limit=1", headers={"X-API-Key": key}).status_code] += 1
            except httpx.HTTPError:
                out["connection error"] += 1
            until.wait(0.25)


def time_to_serve(base_url: str, key: str, timeout_s: float = 120) -> float:
    import httpx

    started = time.monotonic()
    with httpx.Client(timeout=5) as client:
        while time.monotonic() - started < timeout_s:
            try:
                if client.get(f"{base_url}/jobs?limit=1", headers={"X-API-Key": key}).status_code == 200:
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    return float("inf")


def jobs_of(database_url: str, job_ids: list[str]) -> dict[str, dict]:
    import psycopg

    url = database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            "SELECT id, status, attempts, error, lease_owner FROM jobs WHERE id = ANY(%s)", (job_ids,)
        ).fetchall()
        artifacts = connection.execute(
            "SELECT job_id, name, count(*) FROM artifacts WHERE job_id = ANY(%s) GROUP BY job_id, name", (job_ids,)
        ).fetchall()
    found = {r[0]: {"status": r[1], "attempts": r[2], "error": r[3], "lease_owner": r[4], "artifacts": {}} for r in rows}
    for job_id, name, count in artifacts:
        found[job_id]["artifacts"][name] = count
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=300, help="distinct models to submit (at most 5000)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--submit-seconds", type=float, default=150, help="spread the submits over this long")
    parser.add_argument("--child-kill-every", type=float, default=4.0)
    parser.add_argument("--long-outage-s", type=float, default=60.0)
    parser.add_argument("--max-seconds", type=float, default=900, help="the whole run ends by then")
    parser.add_argument("--real-core", action="store_true", help="run the compiler instead of the stand-in")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--store", choices=("local", "s3"), default="local",
        help="s3: artifacts in an S3-compatible store (Ceph radosgw) that API and workers share instead of a "
        "folder, each process with its own data folder, and the store stopped for 10 s and --long-outage-s",
    )
    args = parser.parse_args(argv)
    args.jobs = max(1, min(args.jobs, 5000))
    rng = random.Random(args.seed)
    started = time.monotonic()
    s3 = None
    if args.store == "s3":
        from tests.s3server import CephS3

        s3 = CephS3()
    pg, redis = PrivatePostgres(), PrivateRedis()
    stack = Stack(pg, redis, args, s3)
    result: dict = {"jobs": args.jobs, "workers": args.workers, "store": args.store,
                    "optimizer": "flexdsa_core" if args.real_core else "stand-in"}  # fmt: skip
    faults: list[dict] = []
    try:
        key = stack.start()
        from service.core.config import Settings

        defaults = Settings()
        result["recovery_bound_s"] = defaults.lease_seconds + defaults.reconcile_interval_s
        models = [model_bytes(0, poison=True)] + [model_bytes(args.seed * 100_000 + n + 1) for n in range(args.jobs - 1)]
        submitter = Submitter(stack.base_url, key, models, args.submit_seconds)
        submitter.start()
        schedule = [
            (0.15, "worker_kill"), (0.30, "redis_restart"), (0.45, "postgres_stop_10s"), (0.65, "postgres_stop_long"),
        ]
        if s3 is not None:
            schedule = [
                (0.10, "worker_kill"), (0.22, "store_stop_10s"), (0.32, "redis_restart"), (0.42, "postgres_stop_10s"),
                (0.55, "store_stop_long"), (0.75, "postgres_stop_long"),
            ]
        killer = ChildKiller(stack, args.child_kill_every, rng)
        killer.start()
        for fraction, fault in schedule:
            time.sleep(max(0.0, started + 20 + fraction * args.submit_seconds - time.monotonic()))
            faults.append(inject(fault, stack, pg, redis, key, args))
            print(json.dumps(faults[-1]), flush=True)
        submitter.join(args.max_seconds)
        killer.stop.set()
        killer.join(10)
        child_kills = killer.kills
        deadline = started + args.max_seconds
        while time.monotonic() < deadline:
            states = jobs_of(stack.database_url, submitter.job_ids)
            if all(s["status"] in TERMINAL for s in states.values()) and len(states) == len(submitter.job_ids):
                break
            time.sleep(2)
        states = jobs_of(stack.database_url, submitter.job_ids)
        result.update(summarise(states, submitter, child_kills, faults))
        if s3 is not None:
            result["store_check"] = check_store(stack, submitter.job_ids)
    finally:
        stack.close()
        redis.close()
        pg.close()
        if s3 is not None:
            s3.close()
        keep = os.environ.get("FLEXDSA_SOAK_KEEP_LOGS")
        if not keep:
            shutil.rmtree(stack.tmp, ignore_errors=True)
        else:
            print(f"logs kept in {stack.tmp}", file=sys.stderr)
    result["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2, default=str))
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / ("soak_s3.json" if args.store == "s3" else "soak.json")).write_text(json.dumps(result, indent=2, default=str))
    ok = result["lost"] == 0 and result["duplicate_artifacts"] == 0 and result["api_500s"] == 0
    if args.store == "s3":
        check = result["store_check"]
        ok = ok and check["missing"] == 0 and check["mismatched"] == 0 and check["worker_folders_with_files"] == 0
        print(
            f"\nshared-nothing soak (S3 store): {result['accepted']} accepted, {result['succeeded']} succeeded, "
            f"{result['failed_with_reason']} failed with a reason, {result['lost']} lost, {result['duplicate_artifacts']} "
            f"duplicate artifacts; {check['blobs_checked']} artifact blobs in the store checked: {check['missing']} "
            f"missing, {check['mismatched']} not matching their sha256; API 500s: {result['api_500s']}"
        )
    return 0 if ok else 1


def inject(fault: str, stack: Stack, pg: PrivatePostgres, redis: PrivateRedis, key: str, args) -> dict:
    at = time.monotonic()
    if fault == "worker_kill":
        victim = next(iter(stack.workers))
        pids = stack.pids(victim)
        owners = {p for p in pids}
        running = [
            job_id for job_id, state in _running(stack).items()
            if state["lease_owner"] and int(state["lease_owner"].rsplit(":", 1)[-1]) in owners
        ]  # fmt: skip
        backlog = _queued(stack)
        stack.kill_worker(victim)
        killed_at, killed_wall = time.monotonic(), time.time()
        stack.start_worker()
        recovered = _wait_rerun(stack, running, owners, timeout_s=300)
        finished = _wait_ended(stack, running, timeout_s=300)
        recovery = {
            "fault": fault, "worker": victim, "jobs_on_it": len(running), "queued_at_kill": backlog,
            # detected: the reconciler saw the lapsed lease and published the job again (a 'requeued' event);
            # running again: another worker started it (a published-again job goes ahead of the queue);
            # finished: it ended (the last of the dead worker's jobs, for each figure).
            "requeued_after_s": _requeued_after(stack, running, killed_wall),
            "running_again_after_s": _started_again_after(stack, running, killed_wall),
            "rerun_after_s": None if recovered is None else round(recovered - killed_at, 1),
            "finished_after_s": None if finished is None else round(finished - killed_at, 1),
        }
        print(
            f"recovery after a whole-worker kill ({len(running)} job(s) on it, {backlog} queued): published again "
            f"after {recovery['requeued_after_s']} s, running again after {recovery['running_again_after_s']} s, "
            f"finished after {recovery['finished_after_s']} s (aim <= 30 s)",
            flush=True,
        )
        return recovery
    if fault.startswith("store_stop"):
        return store_outage(stack, key, 10.0 if fault == "store_stop_10s" else args.long_outage_s, fault)
    if fault == "redis_restart":
        redis.restart()
        return {"fault": fault, "api_serves_after_s": round(time_to_serve(stack.base_url, key), 2)}
    seconds = 10.0 if fault == "postgres_stop_10s" else args.long_outage_s
    answers: collections.Counter = collections.Counter()
    stop = threading.Event()
    prober = threading.Thread(target=probe_outage, args=(stack.base_url, key, stop, answers), daemon=True)
    pg.stop()
    prober.start()
    time.sleep(seconds)
    pg.start()
    stop.set()
    prober.join(10)
    return {"fault": fault, "outage_s": seconds, "api_answers_during": dict(answers),
            "api_serves_after_s": round(time_to_serve(stack.base_url, key), 2), "took_s": round(time.monotonic() - at, 1)}  # fmt: skip


def store_outage(stack: Stack, key: str, seconds: float, fault: str) -> dict:
    """radosgw killed for ``seconds``: what a download of a finished job's artifact answered meanwhile
    (503 expected, never 500; submits are the Submitter's, retried after Retry-After), and how long after
    the store's return the download redirected again."""
    import httpx

    at = time.monotonic()
    done = _recent(stack)
    while not done and time.monotonic() - at < 90:  # a finished job to download while the store is away
        time.sleep(1)
        done = _recent(stack)
    url = f"{stack.base_url}/jobs/{done[0]}/artifacts/model.onnx" if done else None
    answers: collections.Counter = collections.Counter()
    stop = threading.Event()

    def probe() -> None:
        with httpx.Client(timeout=15) as client:
            while url and not stop.is_set():
                try:
                    answers[client.get(url, headers={"X-API-Key": key}).status_code] += 1
                except httpx.HTTPError:
                    answers["connection error"] += 1
                stop.wait(0.5)

    stack.s3.stop_gateway()
    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    time.sleep(seconds)
    stop.set()  # before the return: every probe counted here was answered while the store was away
    prober.join(20)
    stack.s3.start_gateway()
    back = time.monotonic()
    redirect_after = None
    if url:
        with httpx.Client(timeout=15) as client:
            while time.monotonic() - back < 120:
                if client.get(url, headers={"X-API-Key": key}).status_code == 307:
                    redirect_after = round(time.monotonic() - back, 2)
                    break
                time.sleep(0.1)
    return {"fault": fault, "outage_s": seconds, "download_answers_during": {str(k): v for k, v in answers.items()},
            "api_500s": answers.get(500, 0), "download_redirects_after_s": redirect_after,
            "took_s": round(time.monotonic() - at, 1)}  # fmt: skip


def _recent(stack: Stack) -> list[str]:
    import psycopg

    url = stack.database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as connection:
        rows = connection.execute("SELECT id FROM jobs WHERE status = 'succeeded' ORDER BY finished_at DESC LIMIT 5").fetchall()
    return [r[0] for r in rows]


def check_store(stack: Stack, job_ids: list[str]) -> dict:
    """Every artifact row of the soak's jobs held against the bucket: the object exists, its length is the
    row's size and its recorded sha256 is the row's key (no job points at a half or a foreign object); and
    the workers' own data folders hold no file (they share nothing but the store)."""
    import psycopg

    from service.core.config import Settings
    from service.storage.store import BlobNotFoundError, ChecksumMismatchError, make_store

    url = stack.database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            "SELECT DISTINCT blob_key, size FROM artifacts WHERE job_id = ANY(%s)", (job_ids,)
        ).fetchall()
    os.environ.update(stack.s3.env())
    store = make_store(Settings(data_dir=stack.tmp / "check", **stack.store_settings))
    missing = mismatched = 0
    for blob_key, size in rows:
        try:
            store.verified_head(blob_key, size)
        except BlobNotFoundError:
            missing += 1
        except ChecksumMismatchError:
            mismatched += 1
    worker_files = sum(
        1 for folder in stack.tmp.glob("soak*") if folder.is_dir() for p in folder.rglob("*") if p.is_file()
    )
    return {"blobs_checked": len(rows), "missing": missing, "mismatched": mismatched,
            "worker_folders_with_files": worker_files}  # fmt: skip


def _queued(stack: Stack) -> int:
    import psycopg

    url = stack.database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as connection:
        return connection.execute("SELECT count(*) FROM jobs WHERE status = 'queued'").fetchone()[0]


def _requeued_after(stack: Stack, job_ids: list[str], killed_wall: float) -> float | None:
    import psycopg

    if not job_ids:
        return None
    url = stack.database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as connection:
        first = connection.execute(
            "SELECT min(at) FROM job_events WHERE kind = 'requeued' AND job_id = ANY(%s)", (job_ids,)
        ).fetchone()[0]
    return None if first is None else round(first.timestamp() - killed_wall, 1)


def _started_again_after(stack: Stack, job_ids: list[str], killed_wall: float) -> float | None:
    """Seconds from the kill until the last of ``job_ids`` was started again (its first 'started' event
    after the kill), or None if one never was."""
    import psycopg

    if not job_ids:
        return None
    url = stack.database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as connection:
        rows = connection.execute(
            "SELECT job_id, min(at) FROM job_events WHERE kind = 'started' AND job_id = ANY(%s) "
            "AND at > to_timestamp(%s) GROUP BY job_id",
            (job_ids, killed_wall),
        ).fetchall()
    if len(rows) < len(set(job_ids)):
        return None
    return round(max(at.timestamp() for _, at in rows) - killed_wall, 1)


def _wait_ended(stack: Stack, job_ids: list[str], timeout_s: float) -> float | None:
    """When every one of ``job_ids`` has ended (succeeded, failed or cancelled)."""
    if not job_ids:
        return None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(s["status"] in TERMINAL for s in jobs_of(stack.database_url, job_ids).values()):
            return time.monotonic()
        time.sleep(0.25)
    return None


def _running(stack: Stack) -> dict[str, dict]:
    import psycopg

    url = stack.database_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url) as connection:
        rows = connection.execute("SELECT id, lease_owner FROM jobs WHERE status = 'running'").fetchall()
    return {r[0]: {"lease_owner": r[1]} for r in rows}


def _wait_rerun(stack: Stack, job_ids: list[str], dead_pids: set[int], timeout_s: float) -> float | None:
    """When every job the dead worker held has ended or been claimed by another worker."""
    if not job_ids:
        return None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        states = jobs_of(stack.database_url, job_ids)
        if all(
            s["status"] in TERMINAL or not s["lease_owner"] or int(s["lease_owner"].rsplit(":", 1)[-1]) not in dead_pids
            for s in states.values()
        ) and all(s["status"] != "queued" for s in states.values()):
            return time.monotonic()
        time.sleep(0.25)
    return None


def summarise(states: dict[str, dict], submitter: Submitter, child_kills: int, faults: list[dict]) -> dict:
    statuses = collections.Counter(s["status"] for s in states.values())
    failed = [s for s in states.values() if s["status"] == "failed"]
    expected = {"manifest.json", "model.onnx", "report.json"}
    duplicates = sum(1 for s in states.values() for count in s["artifacts"].values() if count > 1)
    wrong_sets = sum(1 for s in states.values() if s["status"] == "succeeded" and set(s["artifacts"]) != expected)
    poison = states.get(submitter.poison_id or "", {})
    return {
        "accepted": len(submitter.job_ids),
        "succeeded": statuses["succeeded"],
        "failed_with_reason": sum(1 for s in failed if (s["error"] or {}).get("message")),
        "failed_without_reason": sum(1 for s in failed if not (s["error"] or {}).get("message")),
        "lost": len(submitter.job_ids) - sum(statuses[t] for t in TERMINAL),
        "duplicate_artifacts": duplicates,
        "succeeded_without_their_artifact_set": wrong_sets,
        "attempts_histogram": dict(sorted(collections.Counter(s["attempts"] for s in states.values()).items())),
        "poison": {"status": poison.get("status"), "attempts": poison.get("attempts"),
                   "reason": ((poison.get("error") or {}).get("message") or "")[:160]},  # fmt: skip
        "pipeline_children_killed": child_kills,
        "submit_answers": {str(k): v for k, v in submitter.statuses.items()},
        "api_500s": submitter.statuses.get(500, 0)
        + sum(f.get("api_answers_during", {}).get(500, 0) + f.get("api_500s", 0) for f in faults),
        "faults": faults,
        "run_id": uuid.uuid4().hex[:8],
    }


if __name__ == "__main__":
    sys.exit(main())
