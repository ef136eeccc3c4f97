"""A real Flex-DSA server for tests that drive it over HTTP (the client CLI, the dashboard in Chromium)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
BERT = REPO / "tests" / "models" / "bert.onnx"
START_TIMEOUT_S = 90
JOB_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class LiveServer:
    url: str
    data_dir: Path
    pid: int | None = None  # the uvicorn process (its memory, for tests that measure it)

    def settings(self):
        """The server's settings, for a test that must reach behind the API (its SQLite file, its store)."""
        from service.core.config import Settings

        return Settings(data_dir=self.data_dir)


@contextmanager
def embedded_server(data_dir: Path, *, workers: int = 1, **settings: str) -> Iterator[LiveServer]:
    """``uvicorn stack:create_app`` on 127.0.0.1 with embedded defaults under ``data_dir``; with ``workers``
    over 1, ``flexdsa serve --workers N`` (its API processes behind one port).

    ``settings`` become ``FLEXDSA_<NAME>`` variables (e.g. ``auth="required"``). The server is a separate
    process, as in production, so the in-process worker and its job children are really exercised.
    """
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXDSA_")}
    env.update(
        {"FLEXDSA_DATA_DIR": str(data_dir), **{f"FLEXDSA_{k.upper()}": v for k, v in settings.items()}}
    )
    log_path = data_dir / "server.log"
    with log_path.open("wb") as log:
        command = (
            # Through the tests' launcher: a FLEXDSA_TEST_* setting (test_optimizer=...) reaches the jobs' pipeline
            # processes (tests/workers/hooks.py); nothing of the kind ships.
            [sys.executable, "-m", "tests.workers.launch", "uvicorn", "stack:create_app", "--factory",
             "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
            if workers == 1
            else [sys.executable, "-m", "flexdsa_core.cli", "serve", "--port", str(port), "--workers", str(workers)]
        )  # fmt: skip
        process = subprocess.Popen(
            command,
            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"the server exited ({process.returncode}):\n{log_path.read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"the server did not answer in {START_TIMEOUT_S} s:\n{log_path.read_text()[-3000:]}"
                )
            time.sleep(0.2)
        yield LiveServer(url, data_dir, process.pid)
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def failing_onnx() -> bytes:
    """A well-formed model the pipeline refuses: its one op is in a domain ONNX Runtime does not know."""
    from onnx import TensorProto, helper

    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="acme.custom")
    graph = helper.make_graph(
        [node],
        "unsupported",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("acme.custom", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9).SerializeToString()


def wait_for_job(
    url: str, job_id: str, headers: dict | None = None, timeout_s: float = JOB_TIMEOUT_S
) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        job = httpx.get(f"{url}/jobs/{job_id}", headers=headers or {}, timeout=10).json()
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        assert time.monotonic() < deadline, f"job {job_id} still {job['status']} after {timeout_s} s"
        time.sleep(0.3)
