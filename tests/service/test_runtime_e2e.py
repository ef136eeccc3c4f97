"""The loop the Shape Tracker closes at run time, over HTTP against a real server (embedded mode, its worker
in-process): a bundle deployed with flexdsa_runtime serves a skewed length trace, `flexdsa traffic push`
sends what it saw, `flexdsa respecialise` compiles the next version from it (the old bucket's kernels from the
cache), and the runtime updates to that version: its buckets follow the traffic, the padding waste falls,
and the outputs are still the original model's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import numpy as np

from flexdsa_runtime import Runtime
from flexdsa_runtime.service_client import download_bundle
from tests.runtime.conftest import assert_close, original_outputs
from tests.runtime.tiny_models import MASKED, model_bytes
from tests.service.live import REPO, embedded_server, wait_for_job

SPEC = {"target": "rockchip-rk3588", "shape_buckets": {"batch": [1], "seq": [64]}, "measure_latency": False}
LENGTHS = {3: 50, 5: 60, 7: 40, 10: 25, 16: 10, 30: 4, 64: 1}


def _cli(server, *args: str) -> str:
    env = {**os.environ, "FLEXDSA_SERVER": server.url}
    done = subprocess.run(
        [sys.executable, "-m", "flexdsa_core.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def _serve(runtime: Runtime) -> list[tuple[dict, dict]]:
    rng = np.random.default_rng(3)
    served = []
    for seq, count in LENGTHS.items():
        for _ in range(count):
            feeds = {
                "x": rng.standard_normal((1, seq, 4)).astype(np.float32),
                "attention_mask": np.ones((1, seq), np.int64),
            }
            served.append((feeds, runtime.run(feeds)))
    return served


def test_traffic_in_a_new_version_out(tmp_path):
    empty_toolchains = tmp_path / "no-toolchains"  # the rknn compile is not what this test is about
    empty_toolchains.mkdir()
    (tmp_path / "server").mkdir()
    with embedded_server(tmp_path / "server", toolchains_dir=str(empty_toolchains)) as server:
        created = httpx.post(
            f"{server.url}/optimize",
            files={"model": ("masked.onnx", model_bytes(MASKED))},
            data={"spec": json.dumps(SPEC)},
        ).json()
        first = wait_for_job(server.url, created["job_id"])
        assert first["status"] == "succeeded", first["error"]
        bundle = download_bundle(server.url, first["id"], tmp_path / "v1.zip")

        with Runtime.open(bundle, store=tmp_path / "device") as runtime:
            for feeds, got in _serve(runtime):
                assert_close(original_outputs(model_bytes(MASKED), feeds), got)
            waste_before = runtime.traffic.padding_waste()
            runtime.traffic.save(tmp_path / "traffic.json")
            assert "Stored" in _cli(server, "traffic", "push", first["id"], str(tmp_path / "traffic.json"))
            assert "proposed" in _cli(server, "traffic", "propose", first["id"])
            shown = _cli(server, "traffic", "show", first["id"])
            assert f"{sum(LENGTHS.values())} requests in 1 push(es)" in shown and "batch1_seq64" in shown
            assert '"auto_respecialise_waste": 0.5' in _cli(server, "traffic", "policy", first["id"], "--waste", "0.5")
            assert '"auto_respecialise_waste": null' in _cli(server, "traffic", "policy", first["id"])

            child_id = _cli(server, "respecialise", first["id"], "--wait").strip().splitlines()[-1]
            child = wait_for_job(server.url, child_id)
            assert child["status"] == "succeeded", child["error"]
            assert child["parent_job_id"] == first["id"] and child["bundle_version"] == 2
            report = httpx.get(f"{server.url}/jobs/{child_id}/artifacts/report.json").json()
            assert report["cache"]["hits"] > 0  # the unchanged seq-64 bucket's kernels came from the cache

            result = runtime.update(download_bundle(server.url, child_id, tmp_path / "v2.zip"))
            assert result["previous_traffic"]["entries"]
            values = sorted({b.dims["seq"] for b in runtime.bundle.buckets})
            assert len(values) > 1 and values[-1] == 64 and values[0] < 10, (
                values
            )  # the traffic's short lengths
            for feeds, _ in _serve(runtime):
                assert_close(original_outputs(model_bytes(MASKED), feeds), runtime.run(feeds))
            assert runtime.traffic.padding_waste() < waste_before / 2

        versions = httpx.get(f"{server.url}/jobs/{child_id}/versions").json()["versions"]
        assert [v["job"]["bundle_version"] for v in versions] == [1, 2]
        with Runtime.open(store=tmp_path / "device") as restarted:  # the device restarts on the new version
            assert restarted.version == result["version"]
