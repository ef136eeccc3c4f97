"""One upload compared across several targets: POST /optimize with ``targets`` makes a job group (one job
per target, the model stored once, validated before anything is queued) and GET /groups/{id} returns the
comparison, on PostgreSQL and on SQLite. The workers are played by the test (``env.finish``); the real
pipeline runs in tests/service/test_compare_e2e.py."""

from __future__ import annotations

from sqlalchemy import func, select

from flexdsa_core import list_targets
from service.core.models import Job, JobGroup
from service.groups.service import group_status

ALL = [t.name for t in list_targets()]


def _row(target: str) -> dict:
    """A comparison row as the worker writes it (flexdsa_core.compare.comparison_row)."""
    return {
        "target": target, "vendor": "v", "bucket": "batch1",
        "latency": {"seconds": 1e-3, "source": "roofline estimate", "partial": False, "detail": ""},
        "energy": {"joules": None, "source": "not known", "detail": "the target's power is unsourced"},
        "vendor_estimate": None,
        "accuracy": {"value": 1e-6, "metric": "max_abs", "ok": True, "source": "ONNX Runtime validation", "detail": ""},
        "accelerator_flop_share": 0.9, "cpu_fallback_nodes": 2, "bundle_bytes": None, "vendor_alone": None,
    }  # fmt: skip


def test_several_targets_make_one_group_with_one_job_each(env, headers):
    response = env.submit(headers, spec={"targets": ["rockchip-rk3588", "cpu-ort"], "objective": "energy"})
    assert response.status_code == 202, response.text
    body = response.json()
    assert body["status_url"] == f"/groups/{body['group_id']}"
    assert [j["target"] for j in body["jobs"]] == ["cpu-ort", "rockchip-rk3588"]
    members = [env.job(j["job_id"]) for j in body["jobs"]]
    assert {m.group_id for m in members} == {body["group_id"]}
    assert all(m.status == "queued" and m.spec["objective"] == "energy" for m in members)
    assert len({m.model_blob_key for m in members}) == 1  # one upload, stored once
    assert sorted(env.enqueued) == sorted(m.id for m in members)
    group = env.client.get(body["status_url"], headers=headers).json()
    assert group["status"] == "queued" and group["targets"] == ["rockchip-rk3588", "cpu-ort"]
    assert [row["target"] for row in group["comparison"]] == ["rockchip-rk3588", "cpu-ort"]
    assert all(row["status"] == "queued" and "latency" not in row for row in group["comparison"])
    job = env.client.get(f"/jobs/{members[0].id}", headers=headers).json()
    assert job["group_id"] == body["group_id"]


def test_all_names_every_builtin_target(env, headers):
    body = env.submit(headers, spec={"targets": "all", "allow_synthetic_calibration": True}).json()
    assert sorted(j["target"] for j in body["jobs"]) == sorted(ALL)
    assert len(env.enqueued) == len(ALL)


def test_an_unknown_target_is_refused_before_anything_is_queued(env, headers):
    response = env.submit(headers, spec={"targets": ["cpu-ort", "rockchip-rk3589"]})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "unknown_target"
    assert "'rockchip-rk3589'" in error["message"] and "Did you mean 'rockchip-rk3588'" in error["message"]
    assert env.enqueued == []
    with env.sessions() as session:
        assert session.scalar(select(func.count()).select_from(Job).where(Job.model_filename == "never")) == 0


def test_target_and_targets_together_are_refused(env, headers):
    response = env.submit(headers, spec={"target": "cpu-ort", "targets": ["cpu-ort"]})
    assert response.status_code == 422 and "'target' and 'targets'" in response.json()["error"]["message"]


def test_an_option_one_target_refuses_names_that_target(env, headers):
    # xilinx-kv260 computes int8 only: without samples (or synthetic calibration allowed) it refuses.
    response = env.submit(headers, spec={"targets": ["cpu-ort", "xilinx-kv260"]})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["message"].startswith("Target xilinx-kv260:") and error["details"]["target"] == "xilinx-kv260"
    assert env.enqueued == []


def test_a_group_must_fit_under_the_quota_whole(env):
    headers = env.new_key(max_queued_jobs=2)
    response = env.submit(headers, spec={"targets": ["cpu-ort", "nvidia-orin-nano", "rockchip-rk3588"]})
    assert response.status_code == 429, response.text
    assert response.json()["error"]["details"]["adding"] == 3
    assert env.enqueued == []
    assert env.client.get("/jobs", headers=headers).json()["total"] == 0


def test_the_comparison_reads_each_job_and_its_bundle_size(env, headers):
    body = env.submit(headers, spec={"targets": ["cpu-ort", "nvidia-orin-nano"]}).json()
    first, second = body["jobs"]
    env.finish(first["job_id"], report={"comparison": _row("cpu-ort")}, artifacts={"a.json": b"x" * 100, "b.json": b"y" * 23})
    running = env.client.get(body["status_url"], headers=headers).json()
    assert running["status"] == "running"
    env.finish(second["job_id"], status="failed")
    with env.sessions() as session:
        job = session.get(Job, second["job_id"])
        job.error = {"code": "invalid_model", "message": "it broke", "details": {}}
        session.commit()
    group = env.client.get(body["status_url"], headers=headers).json()
    assert group["status"] == "partial"
    done, failed = group["comparison"]
    assert done["target"] == "cpu-ort" and done["bundle_bytes"] == 123 and done["job_id"] == first["job_id"]
    assert done["latency"]["source"] == "roofline estimate" and done["accelerator_flop_share"] == 0.9
    assert failed == {"target": "nvidia-orin-nano", "job_id": second["job_id"], "status": "failed", "error": "it broke"}


def test_another_tenants_group_is_not_found(env, headers):
    body = env.submit(headers, spec={"targets": ["cpu-ort"]}).json()
    other = env.client.get(body["status_url"], headers=env.new_key())
    assert other.status_code == 404 and other.json()["error"]["code"] == "group_not_found"
    assert env.client.get(body["status_url"]).status_code == 401


def test_an_idempotent_retry_returns_the_same_group(env, headers):
    first = env.submit(headers, spec={"targets": ["cpu-ort", "amd-xdna2"]}, idempotency_key="cmp-1")
    retry = env.submit(headers, spec={"targets": ["cpu-ort", "amd-xdna2"]}, idempotency_key="cmp-1")
    assert retry.status_code == 202 and retry.headers["Idempotent-Replayed"] == "true"
    assert retry.json()["group_id"] == first.json()["group_id"]
    with env.sessions() as session:
        assert session.scalar(select(func.count()).select_from(JobGroup).where(JobGroup.id == first.json()["group_id"])) == 1
    assert len(env.enqueued) == 2


def test_group_status():
    assert group_status(["queued", "queued"]) == "queued"
    assert group_status(["queued", "succeeded"]) == "running"
    assert group_status(["running", "failed"]) == "running"
    assert group_status(["succeeded", "succeeded"]) == "succeeded"
    assert group_status(["failed", "cancelled"]) == "failed"
    assert group_status(["succeeded", "failed"]) == "partial"
