"""Gates on the service side (``service/jobs/gates.py``), on PostgreSQL and SQLite: a job names its model, finds the
previous successful job of that model on the same target, and carries its requirements' verdicts in the API;
unknown requirement names are refused before queuing with "did you mean"."""

from __future__ import annotations

from service.core.models import Job
from service.jobs import gates
from tests.service.conftest import tiny_onnx


def _summary(speedup: float, latency_s: float, cpu_nodes: int = 0) -> dict:
    return {
        "nodes_before": 3, "nodes_after": 2, "speedup": speedup,
        "headline": {"speedup": speedup, "source": "roofline estimate", "text": f"{speedup:.2f}x, roofline estimate"},
        "comparison": {"latency": {"seconds": latency_s, "source": "roofline estimate"},
                       "accuracy": {"value": 1e-6, "metric": "max_abs", "source": "ONNX Runtime validation"},
                       "cpu_fallback_nodes": cpu_nodes},
    }  # fmt: skip


def _finish_and_conclude(env, job_id: str, summary: dict, artifact: bytes) -> dict:
    """Play the worker's end of a job: artifacts and summary, then the gates, as ``workers.execute`` does."""
    env.finish(job_id, artifacts={"model.onnx": artifact}, report=summary)
    with env.sessions() as session:
        job = session.get(Job, job_id)
        gates.conclude(session, job, gates.bundle_bytes(session, job_id))
        session.commit()
    return env.client.get(f"/jobs/{job_id}", headers=env.headers).json()


def test_a_job_names_its_model_and_compares_with_its_predecessor(env, headers):
    env.headers = headers
    spec = {"target": "nvidia-orin-nano", "requirements": ["speedup>=1.5", "no_regression"]}
    first = env.submit(headers, tiny_onnx(0.11), spec, filename="detector.onnx").json()["job_id"]
    other = env.submit(headers, tiny_onnx(0.12), {**spec, "model_name": "another"}).json()["job_id"]
    second = env.submit(headers, tiny_onnx(0.13), {**spec, "model_name": "detector"}).json()["job_id"]

    done = _finish_and_conclude(env, first, _summary(2.0, 0.001), b"x" * 1000)
    assert done["status"] == "succeeded" and done["model_name"] == "detector"
    assert done["previous"] is None
    assert [(r["expr"], r["met"]) for r in done["requirements"]] == [("speedup>=1.5", True), ("no_regression", True)]

    _finish_and_conclude(env, other, _summary(3.0, 0.0001), b"y" * 10)  # another model: never a predecessor
    done = _finish_and_conclude(env, second, _summary(1.2, 0.0013, cpu_nodes=1), b"z" * 1000)
    assert done["status"] == "succeeded"  # a missed requirement does not fail the job: its artifacts are real
    assert done["previous"]["job_id"] == first
    rows = {row["figure"]: row for row in done["previous"]["rows"]}
    assert rows["latency_ms"]["previous"] == 1.0 and rows["latency_ms"]["current"] == 1.3
    assert rows["latency_ms"]["regressed"] is True and rows["cpu_nodes"]["regressed"] is True
    assert rows["bundle_mb"]["regressed"] is False and rows["accuracy"]["regressed"] is None
    verdicts = {r["expr"]: r for r in done["requirements"]}
    assert verdicts["speedup>=1.5"]["met"] is False and verdicts["speedup>=1.5"]["figure"] == 1.2
    assert verdicts["no_regression"]["met"] is False
    assert verdicts["no_regression"]["figure"] == ["latency_ms", "cpu_nodes"]


def test_an_unknown_requirement_is_refused_before_queuing(env, headers):
    response = env.submit(headers, spec={"target": "cpu-ort", "requirements": ["sped>=1.2"]})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_spec" and "Did you mean 'speedup'" in error["message"]
    assert env.enqueued == []


def test_a_job_from_the_job_cache_is_judged_as_itself(env, headers):
    env.headers = headers
    model = tiny_onnx(0.14)
    first = env.submit(headers, model, {"target": "cpu-ort"}).json()["job_id"]
    _finish_and_conclude(env, first, _summary(1.1, 0.001), b"w" * 100)
    cached = env.submit(headers, model, {"target": "cpu-ort", "requirements": ["speedup>=2"]}).json()
    assert cached["cached"] is True
    job = env.client.get(f"/jobs/{cached['job_id']}", headers=headers).json()
    assert job["previous"]["job_id"] == first
    assert job["requirements"] == [
        {"expr": "speedup>=2", "figure": 1.1, "met": False, "detail": "1.10x, roofline estimate"}
    ]
