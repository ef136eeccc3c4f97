"""``flexdsa submit`` against a real uvicorn server in embedded mode (SQLite, in-process worker, tmp data dir):
a job that succeeds (artifacts downloaded), one that fails (exit 1 with the job's error), requests the server
refuses (exit 2 with its message), and the client's own guards.

The live server helpers are in ``tests/service/live.py``, shared with the dashboard's browser tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator

import httpx
import onnx
import pytest
import typer
from typer.testing import CliRunner

from service.client import Client, ClientError, fetch_artifacts, register, safe_destination
from tests.service.live import (
    BERT,
    JOB_TIMEOUT_S,
    REPO,
    LiveServer,
    embedded_server,
    failing_onnx,
    free_port,
    wait_for_job,
)


@pytest.fixture(scope="module")
def live(tmp_path_factory) -> Iterator[LiveServer]:
    with embedded_server(tmp_path_factory.mktemp("client-server")) as server:
        yield server


@pytest.fixture
def server(live) -> str:
    return live.url


@pytest.fixture
def cli():
    app = typer.Typer()
    register(app)
    app.command("noop", hidden=True)(lambda: None)  # a second command keeps `submit` a named subcommand
    runner = CliRunner()
    return lambda *args: runner.invoke(app, [str(a) for a in args], env={"FLEXDSA_API_KEY": None})


def test_submit_wait_downloads_every_artifact(server, cli, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"measure_latency": False, "objective": "balanced"}))
    out = tmp_path / "out"
    result = cli(
        "submit", BERT, "--target", "cpu-ort", "--server", server, "--spec", spec, "--wait", "-o", out
    )
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip().splitlines()[0]
    job = httpx.get(f"{server}/jobs/{job_id}").json()
    assert job["status"] == "succeeded"
    assert job["spec"]["objective"] == "balanced" and job["spec"]["measure_latency"] is False

    listed = {a["name"]: a["size"] for a in httpx.get(f"{server}/jobs/{job_id}/artifacts").json()["items"]}
    assert {p.name: p.stat().st_size for p in out.iterdir()} == listed
    model = onnx.load_model(out / "model.onnx")
    onnx.checker.check_model(model)
    report = json.loads((out / "report.json").read_text())
    assert report["nodes"]["total_after"] < report["nodes"]["total_before"]
    assert "Succeeded: nodes" in result.output


def test_submit_without_wait_prints_the_job_and_returns(server, cli, tmp_path):
    model = tmp_path / "bad.onnx"
    model.write_bytes(failing_onnx())
    result = cli("submit", model, "--target", "cpu-ort", "--server", server, "--quiet")
    assert result.exit_code == 0, result.output
    job_id = result.stdout.strip()
    assert httpx.get(f"{server}/jobs/{job_id}").status_code == 200


def test_failed_job_exits_1_with_its_error(server, tmp_path):
    """Through the installed entry point, as a user runs it."""
    model = tmp_path / "unsupported.onnx"
    model.write_bytes(failing_onnx())
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXDSA_")}
    result = subprocess.run(
        [sys.executable, "-m", "flexdsa_core.cli", "submit", str(model), "--target", "cpu-ort",
         "--server", server, "--wait", "-o", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=REPO, env={**env, "COLUMNS": "300"}, timeout=JOB_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "failed (unsupported_model)" in result.stderr
    assert "acme.custom" in result.stderr
    assert not (tmp_path / "out").exists()


def test_the_headline_speedup_agrees_across_report_api_and_cli(server, cli, tmp_path):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"latency_repeats": 9}))
    out = tmp_path / "out"
    result = cli("submit", BERT, "--target", "cpu-ort", "--server", server, "--spec", spec, "-o", out)
    assert result.exit_code == 0, result.output
    job = httpx.get(f"{server}/jobs/{result.stdout.strip().splitlines()[0]}").json()
    report = json.loads((out / "report.json").read_text())
    top = report["headline"]
    assert top["source"] == "this CPU, measured" and len(top["interval"]) == 2
    assert job["report_summary"]["headline"] == top and job["report_summary"]["speedup"] == top["speedup"]
    assert f"speed-up: {top['text']}" in " ".join(result.output.split())


def test_refresh_runs_again_where_the_cache_would_answer(server, cli, tmp_path):
    from tests.service.conftest import tiny_onnx

    model = tmp_path / "tiny.onnx"
    model.write_bytes(tiny_onnx(alpha=0.37))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"measure_latency": False}))
    common = ("submit", model, "--target", "cpu-ort", "--server", server, "--spec", spec, "--wait")
    first = cli(*common)
    assert first.exit_code == 0, first.output
    cached = cli(*common)
    assert cached.exit_code == 0 and "answered from an identical earlier job" in " ".join(cached.output.split())
    for flag in (["--refresh"], ["--cache", "refresh"]):
        fresh = cli(*common, *flag)
        assert fresh.exit_code == 0, fresh.output
        assert "answered from an identical earlier job" not in " ".join(fresh.output.split())
        job = httpx.get(f"{server}/jobs/{fresh.stdout.strip().splitlines()[0]}").json()
        assert job["spec"]["cache"] == "refresh" and job["cached_from_job_id"] is None and job["status"] == "succeeded"
    wrong = cli(*common, "--cache", "sometimes")
    assert wrong.exit_code == 2 and "cache" in wrong.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--target", "no-such-target"], "unknown_target"),
        (["--target", "cpu-ort", "--api-key", "fdsa_wrong_key"], "invalid_api_key"),
    ],
)
def test_refused_request_exits_2_with_the_servers_message(server, cli, tmp_path, args, expected):
    model = tmp_path / "m.onnx"
    model.write_bytes(failing_onnx())
    result = cli("submit", model, *args, "--server", server, "--wait")
    assert result.exit_code == 2
    assert expected in result.output


def test_unreachable_server_exits_2(cli, tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes(failing_onnx())
    result = cli("submit", model, "--target", "cpu-ort", "--server", f"http://127.0.0.1:{free_port()}")
    assert result.exit_code == 2
    assert "Cannot reach" in result.output


def test_bundle_zip_is_downloaded_and_unpacked_instead_of_each_file(live, tmp_path):
    """When a job offers bundle.zip, the client fetches that one file and unpacks it."""
    from service.core.db import make_engine, make_session_factory
    from service.core.models import Artifact
    from service.storage.store import make_store

    server = live.url
    created = httpx.post(
        f"{server}/optimize",
        files={"model": ("bad.onnx", failing_onnx())},
        data={"spec": json.dumps({"target": "cpu-ort"})},
    ).json()
    wait_for_job(server, created["job_id"])
    bundle = tmp_path / "bundle.zip"
    with zipfile.ZipFile(bundle, "w") as archive:
        archive.writestr("model.onnx", b"onnx bytes")
        archive.writestr("vendor/convert.sh", b"#!/bin/sh\n")
    settings = live.settings()
    key = make_store(settings).put_file(bundle)
    engine = make_engine(settings.database_url)
    with make_session_factory(engine)() as session:
        session.add(Artifact(job_id=created["job_id"], name="bundle.zip", blob_key=key,
                             size=bundle.stat().st_size, content_type="application/zip"))  # fmt: skip
        session.add(Artifact(job_id=created["job_id"], name="report.json", blob_key=key, size=1))
        session.commit()
    engine.dispose()

    client = Client(server, None)
    try:
        written = fetch_artifacts(client, created["job_id"], tmp_path / "out")
    finally:
        client.close()
    assert (tmp_path / "out" / "vendor" / "convert.sh").read_bytes() == b"#!/bin/sh\n"
    assert (tmp_path / "out" / "model.onnx").read_bytes() == b"onnx bytes"
    assert not (tmp_path / "out" / "report.json").exists()  # the bundle alone was fetched
    assert len(written) == 3


@pytest.mark.parametrize("name", ["../escape", "/etc/passwd", "a/../../b", "a\\..\\b", ""])
def test_artifact_names_never_leave_the_output_folder(tmp_path, name):
    with pytest.raises(ClientError):
        safe_destination(tmp_path, name)


def test_nested_artifact_names_stay_nested(tmp_path):
    assert safe_destination(tmp_path, "bucket_128/model.onnx") == tmp_path / "bucket_128" / "model.onnx"
