"""The embedded path end to end: `flexdsa serve`'s app with its in-process worker runs a real job on SQLite,
streams its progress, serves its artifacts, and answers the identical request from the whole-job cache."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import zipfile

from fastapi.testclient import TestClient

from service.core.config import Settings
from stack import create_app
from tests.service.conftest import tiny_onnx


def test_embedded_job_runs_to_completion(tmp_path):
    settings = Settings(
        data_dir=tmp_path
    )  # no variables: SQLite, local store, in-process worker, no key needed
    with TestClient(create_app(settings)) as client:
        submit = lambda: client.post(  # noqa: E731
            "/optimize",
            files={"model": ("tiny.onnx", tiny_onnx())},
            data={"spec": json.dumps({"target": "cpu-ort"})},
        )
        job_id = submit().json()["job_id"]
        with client.stream("GET", f"/jobs/{job_id}/events") as response:
            kinds = [
                line.split(":", 1)[1].strip() for line in response.iter_lines() if line.startswith("event:")
            ]
        assert kinds[0] == "queued" and kinds[-1] == "end"
        job = client.get(f"/jobs/{job_id}").json()
        assert job["status"] == "succeeded", job["error"]
        artifacts = client.get(f"/jobs/{job_id}/artifacts").json()["items"]
        assert artifacts and all(client.get(a["url"]).status_code == 200 for a in artifacts)
        bundle = client.get(f"/jobs/{job_id}/artifacts/bundle.zip")
        assert bundle.status_code == 200 and bundle.headers["content-type"] == "application/zip"
        with zipfile.ZipFile(io.BytesIO(bundle.content)) as archive:
            assert sorted(archive.namelist()) == sorted(a["name"] for a in artifacts)
            assert archive.read("report.json") == client.get(f"/jobs/{job_id}/artifacts/report.json").content
        # Unzipped as a user does, every file is readable by its group and others (0644), not 0600.
        if shutil.which("unzip"):
            (tmp_path / "bundle.zip").write_bytes(bundle.content)
            subprocess.run(["unzip", "-q", "bundle.zip", "-d", "unzipped"], cwd=tmp_path, check=True)
            modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "unzipped").rglob("*") if p.is_file()}
            assert modes and set(modes.values()) == {0o644}, modes
        again = submit().json()
        assert again["cached"] is True and again["status"] == "succeeded"


def test_an_endless_loop_fails_within_its_budget_and_the_next_job_still_runs(tmp_path):
    """Issue 9: a 60-byte model with a Loop of 10^9 iterations holds the (single) embedded worker only for
    its run budget; it fails with what to change, and a normal job submitted right after it succeeds."""
    import time

    from tests.core.test_run_budget import endless_loop_model

    with TestClient(create_app(Settings(data_dir=tmp_path))) as client:
        def submit(model: bytes, spec: dict) -> str:
            answer = client.post("/optimize", files={"model": ("m.onnx", model)}, data={"spec": json.dumps(spec)})
            assert answer.status_code == 202, answer.text
            return answer.json()["job_id"]

        started = time.monotonic()
        endless = submit(endless_loop_model(), {"target": "cpu-ort", "run_budget_s": 3})
        normal = submit(tiny_onnx(), {"target": "cpu-ort"})
        deadline = started + 240
        while time.monotonic() < deadline:
            states = {job_id: client.get(f"/jobs/{job_id}").json() for job_id in (endless, normal)}
            if all(s["status"] in ("succeeded", "failed") for s in states.values()):
                break
            time.sleep(0.5)
        assert states[endless]["status"] == "failed"
        assert states[endless]["error"]["code"] == "run_budget_exceeded"
        assert "run_budget_s" in states[endless]["error"]["message"]
        assert states[normal]["status"] == "succeeded", states[normal]["error"]
