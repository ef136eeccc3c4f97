"""``flexdsa submit`` does what the API does (issue 35), through the installed entry point against real embedded
servers: "which chip?" with an int8-only target on synthetic calibration; every refusal one line with its fix in
the command's own terms (the API's sentence for the spec, before anything is uploaded); keys and the database
they live in; a taken port; gates (``--require``) that pass, fail with exit 3, and compare a job with the
previous job of its model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from flexdsa_core import list_targets
from tests.service.conftest import tiny_onnx
from tests.service.live import JOB_TIMEOUT_S, REPO, embedded_server, wait_for_job

ALL = [target.name for target in list_targets()]


def flexdsa(*args, cwd: Path = REPO, timeout: float = JOB_TIMEOUT_S * 3, **env) -> subprocess.CompletedProcess:
    """The installed command as a user runs it: no FLEXDSA_* variable but those given."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEXDSA_")}
    return subprocess.run(
        [sys.executable, "-m", "flexdsa_core.cli", *map(str, args)], capture_output=True, text=True, cwd=cwd,
        env={**clean, "COLUMNS": "120", "PYTHONPATH": str(REPO), **{f"FLEXDSA_{k.upper()}": str(v) for k, v in env.items()}},
        timeout=timeout,
    )  # fmt: skip


def one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    data = tmp_path_factory.mktemp("parity")
    with embedded_server(data, toolchains_dir=str(data / "no-toolchains")) as server:
        yield server


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """A server that requires API keys."""
    data = tmp_path_factory.mktemp("parity-auth")
    with embedded_server(data, auth="required", toolchains_dir=str(data / "no-toolchains")) as server:
        yield server


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "tiny.onnx"
    path.write_bytes(tiny_onnx(0.23))
    return path


def _jobs_total(url: str, headers: dict | None = None) -> int:
    return httpx.get(f"{url}/jobs", headers=headers or {}, timeout=10).json()["total"]


# --- which chip? --------------------------------------------------------------------------------------------


def test_targets_all_with_synthetic_calibration_succeeds_with_its_warning(live, model):
    refused = flexdsa("submit", model, "--targets", "all", "--server", live.url)
    assert refused.returncode == 2
    line = one_line(refused.stderr)
    assert "xilinx-kv260 computes int8 only" in line and "--allow-synthetic-calibration" in line
    assert "flexdsa optimize" not in line

    done = flexdsa("submit", model, "--targets", "all", "--allow-synthetic-calibration", "--server", live.url)
    assert done.returncode == 0, done.stderr
    group_id = done.stdout.splitlines()[0]
    group = httpx.get(f"{live.url}/groups/{group_id}", timeout=10).json()
    assert group["status"] == "succeeded" and sorted(group["targets"]) == sorted(ALL)
    assert "xilinx-kv260" in done.stdout  # the comparison table
    kv260 = next(job for job in group["jobs"] if job["target"] == "xilinx-kv260")
    warnings = httpx.get(f"{live.url}/jobs/{kv260['job_id']}", timeout=10).json()["report_summary"]["warnings"]
    assert any("quantised on seeded random inputs" in w for w in warnings), warnings
    assert "xilinx-kv260: warning: xilinx-kv260 computes int8 only" in done.stderr


# --- every refusal, one line with its fix -------------------------------------------------------------------


def _spec_file(tmp_path, spec: dict) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


@pytest.mark.parametrize(
    ("args", "spec", "says"),
    [
        (["--target", "cpu-ort"], {"shape_bucket": {"seq": [8]}}, "did you mean 'shape_buckets'?"),
        (["--target", "cpu-ort", "--calibration", "SAMPLES"], None, "--precision int8"),
        (["--target", "all"], None, "--targets all"),
        (["--target", "cpu-ort", "--require", "sped>=1.2"], None, "Did you mean 'speedup'?"),
        (["--target", "cpu-ort", "--buckets", "seq"], None, "write <dim>=<sizes>"),
    ],
    ids=["spec-typo", "calibration-without-precision", "target-all", "unknown-requirement", "buckets"],
)
def test_a_refusal_from_the_spec_is_one_line_before_anything_is_uploaded(live, model, tmp_path, args, spec, says):
    samples = tmp_path / "samples.npz"
    np.savez(samples, x=np.zeros((2, 8), np.float32))
    args = [str(samples) if a == "SAMPLES" else a for a in args]
    before = _jobs_total(live.url)
    extra = ["--spec", _spec_file(tmp_path, spec)] if spec else []
    result = flexdsa("submit", model, *args, *extra, "--server", live.url, "--wait")
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert line.startswith("error: ") and says in line, line
    assert _jobs_total(live.url) == before  # refused here, as the API would, with nothing sent


def test_a_spec_naming_target_all_is_told_about_targets(live, model, tmp_path):
    result = flexdsa("submit", model, "--spec", _spec_file(tmp_path, {"target": "all"}), "--server", live.url)
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert 'send "targets" in its place' in line and "unknown_target" in line, line


def test_without_a_key_the_command_names_its_flag(guarded, model):
    result = flexdsa("submit", model, "--target", "cpu-ort", "--server", guarded.url)
    assert result.returncode == 2
    line = one_line(result.stderr)
    assert "--api-key" in line and "X-API-Key" not in line and "missing_api_key" in line, line


def test_keys_say_which_database_they_are_in_and_the_server_which_it_reads(guarded, model, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    made = flexdsa("keys", "create", "--tenant", "ci", cwd=elsewhere)
    assert made.returncode == 0, made.stderr
    other_db = (elsewhere / "flexdsa-data" / "flexdsa.db").resolve()
    assert f"Written to SQLite file {other_db}" in " ".join(made.stderr.split())
    refused = flexdsa("submit", model, "--target", "cpu-ort", "--server", guarded.url, api_key=made.stdout.strip())
    assert refused.returncode == 2
    line = one_line(refused.stderr)
    server_db = (guarded.data_dir / "flexdsa.db").resolve()
    assert f"keys are read from SQLite file {server_db}" in line and "--api-key" in line, line

    made = flexdsa("keys", "create", "--tenant", "ci", data_dir=guarded.data_dir)
    assert f"Written to SQLite file {server_db}" in " ".join(made.stderr.split())
    accepted = flexdsa("submit", model, "--target", "cpu-ort", "--server", guarded.url, "--wait",
                       api_key=made.stdout.strip())  # fmt: skip
    assert accepted.returncode == 0, accepted.stderr


def test_serve_says_which_database_it_reads_keys_from(tmp_path):
    from tests.service.live import free_port

    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEXDSA_")}
    server = subprocess.Popen(
        [sys.executable, "-m", "flexdsa_core.cli", "serve", "--port", str(free_port()), "--workers", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        env={**clean, "FLEXDSA_DATA_DIR": str(tmp_path / "data"), "FLEXDSA_EMBEDDED_WORKER": "false"},
    )  # fmt: skip
    try:
        first = server.stdout.readline()
    finally:
        server.terminate()
        server.wait(timeout=30)
    database = (tmp_path / "data" / "flexdsa.db").resolve()
    assert f"jobs and API keys are read from SQLite file {database}" in first, first


def test_a_job_fetched_without_its_key_says_no_key_was_sent(live, model):
    made = flexdsa("keys", "create", "--tenant", "owner", data_dir=live.data_dir)
    key = made.stdout.strip()
    created = httpx.post(f"{live.url}/optimize", files={"model": ("m.onnx", model.read_bytes())},
                         data={"spec": json.dumps({"target": "cpu-ort"})}, headers={"X-API-Key": key}, timeout=60)  # fmt: skip
    job_id = created.json()["job_id"]
    anonymous = httpx.get(f"{live.url}/jobs/{job_id}", timeout=10)
    assert anonymous.status_code == 404
    message = anonymous.json()["error"]["message"]
    assert "no API key was sent" in message and "--api-key" in message, message
    assert httpx.get(f"{live.url}/jobs/{job_id}", headers={"X-API-Key": key}, timeout=10).status_code == 200
    wait_for_job(live.url, job_id, headers={"X-API-Key": key})


def test_a_taken_port_names_the_port_option(live, tmp_path):
    port = live.url.rsplit(":", 1)[1]
    result = flexdsa("serve", "--port", port, data_dir=tmp_path / "data", timeout=60)
    assert result.returncode == 1
    line = one_line(result.stderr)
    assert f"Port {port} on 127.0.0.1 is already in use" in line and "--port" in line, line


# --- gates ---------------------------------------------------------------------------------------------------


def test_requirements_pass_and_fail_as_stated(live, model, tmp_path):
    passed = flexdsa("submit", model, "--target", "cpu-ort", "--server", live.url, "--model-name", "gate-a",
                     "--require", "speedup>=0.01", "--require", "cpu_nodes==0")  # fmt: skip
    assert passed.returncode == 0, passed.stderr  # --require waits for the result by itself
    assert "requirement met: speedup>=0.01" in passed.stderr and "requirement met: cpu_nodes==0" in passed.stderr

    failed = flexdsa("submit", model, "--target", "cpu-ort", "--server", live.url, "--model-name", "gate-a",
                     "--require", "speedup>=1000", "--require", "cpu_nodes==0", "-o", tmp_path / "out")  # fmt: skip
    assert failed.returncode == 3, failed.stderr
    unmet = [line for line in failed.stderr.splitlines() if line.startswith("requirement not met")]
    assert len(unmet) == 1 and unmet[0].startswith("requirement not met: speedup>=1000: speedup is "), failed.stderr
    assert "this CPU, measured" in unmet[0]
    assert (tmp_path / "out" / "model.onnx").exists()  # the job succeeded: its bundle is real and downloaded
    job = httpx.get(f"{live.url}/jobs/{failed.stdout.splitlines()[0]}", timeout=10).json()
    assert job["status"] == "succeeded"
    assert [(r["expr"], r["met"]) for r in job["requirements"]] == [("speedup>=1000", False), ("cpu_nodes==0", True)]


def test_the_api_spec_takes_the_same_requirements(live, model):
    created = httpx.post(
        f"{live.url}/optimize", files={"model": ("api-gated.onnx", model.read_bytes())},
        data={"spec": json.dumps({"target": "cpu-ort", "requirements": ["accuracy>=0.99"], "measure_latency": False})},
        timeout=60,
    )  # fmt: skip
    job = wait_for_job(live.url, created.json()["job_id"])
    assert job["status"] == "succeeded" and job["model_name"] == "api-gated"
    [verdict] = job["requirements"]
    assert verdict["met"] is False and verdict["figure"] is None and "no accuracy claim" in verdict["detail"]


def _bigger_model(path: Path) -> Path:
    """The same kind of model with far more weights: a larger bundle."""
    weight = numpy_helper.from_array(np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "bigger",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])], [weight],
    )  # fmt: skip
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString())
    return path


def test_a_second_job_of_a_model_compares_with_its_predecessor(live, model, tmp_path):
    common = ("--target", "cpu-ort", "--server", live.url, "--model-name", "gate-b", "--spec",
              _spec_file(tmp_path, {"measure_latency": False}))  # fmt: skip
    first = flexdsa("submit", model, *common, "--wait")
    assert first.returncode == 0, first.stderr
    first_id = first.stdout.splitlines()[0]
    assert "vs job" not in first.stderr  # nothing before it

    second = flexdsa("submit", model, *common, "--refresh", "--require", "no_regression")
    assert second.returncode == 0, second.stderr
    assert f"vs job {first_id[:8]} (previous of model 'gate-b'): " in second.stderr
    assert "bundle_mb" in second.stderr and "requirement met: no_regression" in second.stderr
    job = httpx.get(f"{live.url}/jobs/{second.stdout.splitlines()[0]}", timeout=10).json()
    assert job["previous"]["job_id"] == first_id
    assert {row["figure"] for row in job["previous"]["rows"]} == {"latency_ms", "accuracy", "bundle_mb", "cpu_nodes"}

    worse = flexdsa("submit", _bigger_model(tmp_path / "bigger.onnx"), *common, "--require", "no_regression")
    assert worse.returncode == 3, worse.stderr
    line = next(line for line in worse.stderr.splitlines() if line.startswith("requirement not met"))
    assert line.startswith("requirement not met: no_regression: worse than job ") and "bundle_mb" in line, line
    assert "REGRESSED" in worse.stderr
