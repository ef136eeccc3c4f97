"""The hostile-model corpus, each model through the real path: ``POST /optimize`` on the app (PostgreSQL),
then ``execute_job`` with its real pipeline process for what the API accepts.

For the corpus as a whole: every model is refused (a 4xx, or a failed job), each with its own reason (as
many distinct reasons as models), none as an internal error or a crashed pipeline, and no byte is read
outside the job's folder. A canary file sits next to the job folders (the external-data tricks point at
it, by ``../``, by absolute path, by a symlink or a hard link planted in the folder), and an inotify watch
on it records any open or read by any process; its content, and a canary value in the worker's
environment (what ``/proc/self/environ`` would hand out), must appear in no response, artifact or log.

Then a batch of randomly mutated models: each one is refused or succeeds, never a 5xx or internal error.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import struct
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from sqlalchemy import select

from service.core.models import Incident
from tests.core.test_impossible_tensors import tensor_of_shape_model
from tests.core.test_ingest import matmul_model, nested_if_model
from tests.core.test_run_budget import endless_loop_model
from tests.service.live import failing_onnx
from workers.execute import execute_job

pytestmark = pytest.mark.services

FLOAT = TensorProto.FLOAT
CANARY_BYTES = 64 * 1024  # long enough for any tensor below: only the path checks can stop the read
INTERNAL_CODES = {"internal_error", "pipeline_crashed"}


# --- models --------------------------------------------------------------------------------------------


def external_model(location: str, offset: int = 0) -> bytes:
    """MatMul whose 8x8 weight (256 bytes) lives in external data at ``location``."""
    model = matmul_model(weight_shape=(8, 8))
    weight = model.graph.initializer[0]
    weight.ClearField("raw_data")
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", "256")):
        entry = weight.external_data.add()
        entry.key, entry.value = key, value
    return model.SerializeToString()


def _model(nodes, inputs, outputs, initializers=(), opsets=(("", 17),), functions=()) -> bytes:
    graph = helper.make_graph(nodes, "hostile", inputs, outputs, list(initializers))
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], ir_version=9,
        functions=list(functions),
    )  # fmt: skip
    return model.SerializeToString()


def relu_model(opset: int = 17, shape=(1, 8)) -> bytes:
    x, y = (helper.make_tensor_value_info(n, FLOAT, list(shape)) for n in "xy")
    return _model([helper.make_node("Relu", ["x"], ["y"])], [x], [y], opsets=(("", opset),))


def recursive_function_model() -> bytes:
    call = helper.make_node("Rec", ["a"], ["b"], domain="acme.fn")
    function = helper.make_function(
        "acme.fn",
        "Rec",
        ["a"],
        ["b"],
        [call],
        [helper.make_opsetid("", 17), helper.make_opsetid("acme.fn", 1)],
    )
    x, y = (helper.make_tensor_value_info(n, FLOAT, [1, 8]) for n in "xy")
    nodes = [helper.make_node("Rec", ["x"], ["y"], domain="acme.fn")]
    return _model(nodes, [x], [y], opsets=(("", 17), ("acme.fn", 1)), functions=[function])


def cycle_model() -> bytes:
    x, a = (helper.make_tensor_value_info(n, FLOAT, [2]) for n in "xa")
    nodes = [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])]
    return _model(nodes, [x], [a])


def unknown_op_model() -> bytes:
    x, y = (helper.make_tensor_value_info(n, FLOAT, [1, 8]) for n in "xy")
    return _model([helper.make_node("NoSuchOp", ["x"], ["y"])], [x], [y])


def no_graph_model() -> bytes:
    return b"\x08\x09" + b"\x42\x02\x10\x11"  # ir_version 9 and an opset import (version 17): no graph


# --- the corpus ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hostile:
    name: str
    model: Callable[[Path], bytes]  # given the canary's path
    reason: str  # a phrase the refusal must contain
    plant: Callable[[Path, Path], None] | None = None  # (job folder, canary): what the test puts there
    spec: dict = field(default_factory=dict)


def _symlink(folder: Path, canary: Path) -> None:
    os.symlink(canary, folder / "weights.bin")


def _hard_link(folder: Path, canary: Path) -> None:
    os.link(canary, folder / "weights.bin")


CORPUS = [
    # Not a model at all: the API's wire-format check answers 422.
    Hostile("empty", lambda c: b"", "empty"),
    Hostile("text", lambda c: b"ir_version: 9\ngraph { node { op_type: 'Relu' } }\n", "wire type"),
    Hostile("truncated", lambda c: relu_model()[:-7], "truncated"),
    Hostile("random-bytes", lambda c: np.random.default_rng(9).bytes(4096), "not"),
    Hostile("no-graph", lambda c: no_graph_model(), "no graph"),
    # External data: every way out of the job folder, and the special names.
    Hostile("dotdot-traversal", lambda c: external_model(f"../{c.name}"), "outside the model's folder"),
    Hostile("absolute-path", lambda c: external_model(str(c)), "absolute path"),
    Hostile("proc-self-environ", lambda c: external_model("/proc/self/environ"), "/proc/self/environ"),
    Hostile("ort-mem-addr", lambda c: external_model("*/_ORT_MEM_ADDR_/*", offset=4096), "in-memory marker"),
    Hostile("offset-past-end", lambda c: external_model("model.onnx", offset=10**9), "truncated"),
    Hostile("missing-file", lambda c: external_model("weights.bin"), "missing"),
    Hostile("symlink-out", lambda c: external_model("weights.bin"), "resolves outside", plant=_symlink),
    Hostile("hard-link-out", lambda c: external_model("weights.bin"), "hard links", plant=_hard_link),
    # Work no host can do.
    Hostile("constantofshape-1e12", lambda c: tensor_of_shape_model("ConstantOfShape", [10**6] * 2), "ConstantOfShape output"),
    Hostile("expand-1e12", lambda c: tensor_of_shape_model("Expand", [10**6] * 2), "Expand output"),
    Hostile("input-1e12", lambda c: relu_model(shape=(10**6, 10**6)), "Relu output"),
    Hostile("loop-1e9", lambda c: endless_loop_model(), "run_budget_s", spec={"run_budget_s": 3}),
    Hostile("nested-if-500", lambda c: nested_if_model(500), "nests messages deeper"),
    # Graphs that are not what ONNX allows.
    Hostile("custom-domain", lambda c: failing_onnx(), "acme.custom"),
    Hostile("unknown-op", lambda c: unknown_op_model(), "NoSuchOp"),
    Hostile("opset-too-new", lambda c: relu_model(opset=onnx.defs.onnx_opset_version() + 5), "newer than the"),
    Hostile("opset-too-old", lambda c: relu_model(opset=5), "oldest supported"),
    Hostile("recursive-function", lambda c: recursive_function_model(), "recursive"),
    Hostile("cycle", lambda c: cycle_model(), "cycle"),
]  # fmt: skip


# --- the canary ----------------------------------------------------------------------------------------

IN_ACCESS, IN_OPEN = 0x1, 0x20


class Watch:
    """An inotify watch on one file: any process that opens or reads it (through any name: a symlink, a
    hard link) leaves an event. No strace, no atime (which relatime and noatime mounts make unreliable)."""

    def __init__(self, path: Path) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0 or self._libc.inotify_add_watch(self.fd, os.fsencode(path), IN_ACCESS | IN_OPEN) < 0:
            pytest.fail(f"inotify is not available here (errno {ctypes.get_errno()})")

    def events(self) -> list[str]:
        seen = []
        while True:
            try:
                data = os.read(self.fd, 64 * 1024)
            except BlockingIOError:
                return seen
            while data:  # struct inotify_event: wd, mask, cookie, len, name[len]
                _, mask, _, size = struct.unpack_from("iIII", data)
                seen.append("open" if mask & IN_OPEN else "read")
                data = data[16 + size :]

    def close(self) -> None:
        os.close(self.fd)


@pytest.fixture
def canary(tmp_path, monkeypatch):
    """Job folders go under ``tmp_path/jobs``; the canary file sits beside them, the canary value in the
    environment the pipeline processes inherit. Yields (path, file marker, environment marker, watch)."""
    jobs_root = tmp_path / "jobs"
    jobs_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(jobs_root))
    marker = f"FLEXDSA-CANARY-{uuid.uuid4().hex}".encode()
    path = jobs_root / "canary.bin"
    path.write_bytes((marker * (CANARY_BYTES // len(marker) + 1))[:CANARY_BYTES])
    env_marker = f"FLEXDSA-ENV-CANARY-{uuid.uuid4().hex}"
    monkeypatch.setenv("FLEXDSA_HOSTILE_CANARY", env_marker)
    watch = Watch(path)
    # The detector detects: another process's read is seen.
    subprocess.run([sys.executable, "-c", f"open({str(path)!r}, 'rb').read()"], check=True, timeout=60)
    assert set(watch.events()) == {"open", "read"}
    yield path, marker.decode(), env_marker, watch
    watch.close()


def _planting_mkdtemp(monkeypatch, canary_path: Path) -> list:
    """``tempfile.mkdtemp`` that, for a job folder, first runs the pending plant (no API can put a link in
    a job folder; the test does, to prove the worker-side check holds)."""
    pending: list = [None]
    original = tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        folder = original(*args, **kwargs)
        if pending[0] is not None and str(kwargs.get("prefix", "")).startswith("flexdsa-job-"):
            pending[0](Path(folder), canary_path)
        return folder

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    return pending


# --- the tests -----------------------------------------------------------------------------------------


@dataclass
class Outcome:
    stage: str  # "api" (4xx) or "job" (failed job) or what went wrong
    status: int | str
    code: str
    message: str


def _run(env, headers, model: bytes, spec: dict, texts: list[str]) -> Outcome:
    spec = {"target": "cpu-ort", "measure_latency": False, "seed": int.from_bytes(os.urandom(4)), **spec}
    response = env.submit(headers, model=model, spec=spec)
    texts.append(response.text)
    if response.status_code != 202:
        error = response.json().get("error", {})
        return Outcome("api", response.status_code, error.get("code", ""), error.get("message", ""))
    job_id = response.json()["job_id"]
    status = execute_job(job_id, settings=env.settings, worker_id="hostile-test")
    for path in (f"/jobs/{job_id}", f"/jobs/{job_id}/events", f"/jobs/{job_id}/artifacts"):
        texts.append(env.client.get(path, headers=headers).text)
    job = env.client.get(f"/jobs/{job_id}", headers=headers).json()
    for artifact in env.client.get(f"/jobs/{job_id}/artifacts", headers=headers).json()["items"]:
        texts.append(env.client.get(artifact["url"], headers=headers).content.decode("latin-1"))
    with env.sessions() as session:
        incidents = session.scalars(select(Incident).where(Incident.job_id == job_id)).all()
        texts.extend(i.traceback + i.summary for i in incidents)
    error = job.get("error") or {}
    stage = "job" if status == "failed" and not incidents else f"job ({status}, {len(incidents)} incidents)"
    return Outcome(stage, status, error.get("code", ""), error.get("message", ""))


def test_hostile_corpus_is_refused_with_distinct_reasons_reading_nothing_outside_the_job(
    env, headers, canary, monkeypatch, caplog
):
    if env.backend != "postgres":
        pytest.skip("one backend is enough for the pipeline runs (test_input_checks covers the API boundary on both)")
    canary_path, marker, env_marker, watch = canary
    plant = _planting_mkdtemp(monkeypatch, canary_path)
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    outcomes: dict[str, Outcome] = {}
    for case in CORPUS:
        plant[0] = case.plant
        outcomes[case.name] = _run(env, headers, case.model(canary_path), case.spec, texts)
    table = "\n".join(
        f"  {name:22} {o.stage:8} {o.status!s:9} {o.code:22} {o.message[:110]}"
        for name, o in outcomes.items()
    )

    refused = {
        n for n, o in outcomes.items() if (o.stage == "api" and 400 <= o.status < 500) or o.stage == "job"
    }
    assert refused == {c.name for c in CORPUS}, f"not refused cleanly:\n{table}"
    assert not {n for n, o in outcomes.items() if o.code in INTERNAL_CODES or not o.message}, table
    wrong = {c.name: c.reason for c in CORPUS if c.reason not in outcomes[c.name].message}
    assert not wrong, f"reasons that do not say what was wrong: {wrong}\n{table}"
    reasons = {(o.code, o.message) for o in outcomes.values()}
    assert len(reasons) == len(CORPUS), f"reasons are not distinct:\n{table}"

    # Nothing outside the job folder was opened or read, by the API, the worker or its pipeline processes,
    texts.append(caplog.text)
    assert watch.events() == [], "the canary beside the job folders was opened or read"
    # and nothing of the canary, or of the environment, came back anywhere.
    everything = "\n".join(texts)
    assert marker not in everything and env_marker not in everything
    assert sorted(p.name for p in canary_path.parent.iterdir()) == ["canary.bin"]  # no job folder lingers


MUTANTS = 20


def test_mutated_models_are_refused_or_optimised_never_an_internal_error(env, headers, canary):
    """Random byte changes to a small model with weights: through the API and the worker, each is a 4xx,
    a failed job with a reason, or a success (a changed weight is still a model): never a 5xx."""
    if env.backend != "postgres":
        pytest.skip("one backend is enough for the pipeline runs")
    canary_path, marker, env_marker, watch = canary
    seed_model = bytearray(matmul_model(weight_shape=(8, 8)).SerializeToString())
    rng = np.random.default_rng(2026)
    texts: list[str] = []
    outcomes = []
    for _ in range(MUTANTS):
        mutant = bytearray(seed_model)
        for index in rng.integers(0, len(mutant), size=int(rng.integers(1, 6))):
            mutant[index] = int(rng.integers(0, 256))
        outcome = _run(env, headers, bytes(mutant), {"run_budget_s": 10}, texts)
        outcomes.append(outcome)
    summary = json.dumps([(o.stage, o.status, o.code) for o in outcomes])
    allowed = [
        (o.stage == "api" and 400 <= o.status < 500) or o.stage == "job" or o.status == "succeeded"
        for o in outcomes
    ]
    assert all(allowed), summary
    assert not [o for o in outcomes if o.code in INTERNAL_CODES], summary
    assert all(o.message for o in outcomes if o.status != "succeeded"), summary
    assert any(o.stage == "job" for o in outcomes), f"no mutant got past the API to the worker: {summary}"
    assert watch.events() == []
    assert marker not in "\n".join(texts) and env_marker not in "\n".join(texts)
