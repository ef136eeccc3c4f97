"""The CI example (``examples/ci/github-actions.yml``) does what it says: its ``flexdsa`` steps, run as written
(the workflow's environment, bash) against a live service that requires keys, succeed and leave the bundles
in ``out/``; run again, as the next pipeline run would, the gated step compares the model with its previous job
and still passes ``no_regression``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.service.live import JOB_TIMEOUT_S, REPO, embedded_server

WORKFLOW = REPO / "examples" / "ci" / "github-actions.yml"


def _steps() -> tuple[dict, list[dict]]:
    """The job's environment and its steps that run ``flexdsa``."""
    workflow = yaml.safe_load(WORKFLOW.read_text())
    [job] = workflow["jobs"].values()
    steps = [step for step in job["steps"] if "flexdsa submit" in step.get("run", "")]
    assert len(steps) == 2, steps
    return job["env"], steps


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    data = tmp_path_factory.mktemp("ci-example")
    with embedded_server(data, auth="required", toolchains_dir=str(data / "no-toolchains")) as server:
        yield server


def _run_steps(service, workdir: Path, key: str) -> list[subprocess.CompletedProcess]:
    job_env, steps = _steps()
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEXDSA_")}
    # What the workflow's ${{ vars.* }} and ${{ secrets.* }} hold in CI; `flexdsa` is the installed command.
    env = {**clean, **{k: v for k, v in job_env.items() if not str(v).startswith("${{")},
           "FLEXDSA_SERVER": service.url, "FLEXDSA_API_KEY": key, "COLUMNS": "120",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{clean.get('PATH', '')}"}  # fmt: skip
    return [
        subprocess.run(["bash", "-e", "-c", step["run"]], cwd=workdir, env=env, capture_output=True, text=True,
                       timeout=JOB_TIMEOUT_S * 4)  # fmt: skip
        for step in steps
    ]


def test_the_ci_example_runs_against_a_live_service(service, tmp_path):
    assert shutil.which("flexdsa", path=str(Path(sys.executable).parent)), "the flexdsa command is not installed"
    made = subprocess.run(
        [sys.executable, "-m", "flexdsa_core.cli", "keys", "create", "--tenant", "ci"], capture_output=True,
        text=True, cwd=REPO, env={**os.environ, "FLEXDSA_DATA_DIR": str(service.data_dir)}, timeout=120,
    )  # fmt: skip
    key = made.stdout.strip()
    workdir = tmp_path / "checkout"
    (workdir / "examples").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "tiny_bert.onnx", workdir / "examples" / "tiny_bert.onnx")

    gated, compared = _run_steps(service, workdir, key)
    assert gated.returncode == 0, gated.stderr
    assert "requirement met: speedup>=1.0" in gated.stderr and "requirement met: no_regression" in gated.stderr
    assert (workdir / "out" / "cpu-ort" / "model.onnx").exists()
    assert compared.returncode == 0, compared.stderr
    assert (workdir / "out" / "compare" / "xilinx-kv260" / "manifest.json").exists()

    # The next pipeline run: the same model again, compared with this one.
    again, _ = _run_steps(service, workdir, key)
    assert again.returncode == 0, again.stderr
    first_job = gated.stdout.splitlines()[0]
    assert f"vs job {first_job[:8]} (previous of model 'tiny-bert')" in again.stderr
    job = httpx.get(f"{service.url}/jobs/{again.stdout.splitlines()[0]}", headers={"X-API-Key": key}, timeout=10).json()
    assert job["model_name"] == "tiny-bert" and job["previous"]["job_id"] == first_job
