"""Processes that parse untrusted models get the environment they need, not the service's secrets.

The pipeline process (``workers.child``, ONNX Runtime on the upload) keeps what Python, the numeric libraries
and the object store's credential chain read; the vendor compilers (run by the core, inside it) get an
environment made up from nothing. Both are started here for real and report what they were given.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from flexdsa_core.toolchains.base import Toolchain

SECRETS = {
    "FLEXDSA_OPERATOR_TOKEN": "operator-secret-operator-secret-0123",
    "FLEXDSA_DATABASE_URL": "postgresql+psycopg://flexdsa:db-password@db/flexdsa",
    "FLEXDSA_REDIS_URL": "redis://:redis-password@redis/0",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "SOME_OTHER_TOKEN": "unrelated-secret",
}


def test_the_pipeline_process_gets_no_service_variables(monkeypatch):
    import subprocess

    from workers.pipeline_process import _child_env

    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    env = _child_env()
    printed = subprocess.run(
        [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    seen = json.loads(printed)
    for name in ("FLEXDSA_OPERATOR_TOKEN", "FLEXDSA_DATABASE_URL", "FLEXDSA_REDIS_URL", "SOME_OTHER_TOKEN"):
        assert name not in seen, name
    assert seen["AWS_SECRET_ACCESS_KEY"] == "aws-secret"  # the job reads and writes the object store with it
    assert "workers" in os.listdir(seen["PYTHONPATH"].split(os.pathsep)[0])  # it can import the package


def test_a_vendor_compiler_runs_in_an_environment_of_its_own(tmp_path, monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import json, os, sys\n"
        "json.dump({'ok': True, 'env': dict(os.environ)}, open(sys.argv[2], 'w'))\n"
    )
    toolchain = Toolchain(name="envcheck", description="", targets=(), requirements=(), driver=str(driver))
    home = toolchain.home(tmp_path)
    (home / "venv" / "bin").mkdir(parents=True)
    (home / "venv" / "bin" / "python").symlink_to(sys.executable)
    (home / "ready.json").write_text(json.dumps({"requirements": [], "versions": {}}))
    workdir = tmp_path / "work"
    workdir.mkdir()
    env = toolchain.run(tmp_path, {}, workdir=workdir)["env"]
    assert not set(SECRETS) & set(env), sorted(env)
    assert Path(env["HOME"]).is_relative_to(workdir)  # its home is its run's folder
    assert env["PATH"].split(os.pathsep)[0] == str(home / "venv" / "bin")
