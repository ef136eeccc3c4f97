"""POST /optimize with a 'calibration' file (issue 7): stored beside the model and recorded on the job;
samples that do not fit the model, or that a fp32 request would not use, are refused with 422 before queuing."""

from __future__ import annotations

import io

import numpy as np
from sqlalchemy import func, select

from service.core.models import Job
from tests.service.conftest import tiny_onnx


def _npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _submit(env, headers, calibration: bytes, spec: dict):
    import json

    return env.client.post(
        "/optimize",
        headers=headers,
        files={
            "model": ("model.onnx", tiny_onnx(), "application/octet-stream"),
            "calibration": ("samples.npz", calibration, "application/octet-stream"),
        },
        data={"spec": json.dumps(spec)},
    )


def _jobs(env) -> int:
    with env.sessions() as session:
        return session.scalar(select(func.count()).select_from(Job))


def test_calibration_is_stored_beside_the_model_and_keys_the_job_cache(env, headers):
    samples = _npz(x=np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32))
    spec = {"target": "cpu-ort", "precision": "int8"}
    response = _submit(env, headers, samples, spec)
    assert response.status_code == 202, response.text
    job = env.job(response.json()["job_id"])
    assert job.calibration_blob_key and env.store.read_bytes(job.calibration_blob_key) == samples
    assert env.enqueued == [job.id]
    other = _submit(env, headers, _npz(x=np.ones((6, 8), np.float32)), spec)
    assert env.job(other.json()["job_id"]).job_cache_key != job.job_cache_key  # other samples, other job
    plain = env.submit(headers, spec=spec).json()
    assert env.job(plain["job_id"]).calibration_blob_key is None
    assert not list(env.store.staging_dir().glob("calibration-*")), "calibration temp files must not linger"


def test_calibration_that_does_not_fit_the_model_is_refused_before_queuing(env, headers):
    before = _jobs(env)
    wrong = _submit(env, headers, _npz(x=np.zeros((6, 9), np.float32)), {"target": "cpu-ort", "precision": "int8"})
    assert wrong.status_code == 422, wrong.text
    error = wrong.json()["error"]
    assert error["code"] == "invalid_calibration"
    assert "'x' dim 1 is 9, the model fixes it to 8" in error["message"]
    named = _submit(env, headers, _npz(pixels=np.zeros((6, 8), np.float32)), {"target": "cpu-ort", "precision": "int8"})
    assert named.status_code == 422 and "missing 'x'" in named.json()["error"]["message"]
    garbage = _submit(env, headers, b"not an npz", {"target": "cpu-ort", "precision": "mixed"})
    assert garbage.status_code == 422 and "not an .npz file" in garbage.json()["error"]["message"]
    unused = _submit(env, headers, _npz(x=np.zeros((6, 8), np.float32)), {"target": "cpu-ort"})
    assert unused.status_code == 422 and "precision is fp32" in unused.json()["error"]["message"]
    assert _jobs(env) == before and env.enqueued == []
    assert not list(env.store.staging_dir().glob("calibration-*"))


def test_a_precision_the_target_cannot_have_is_refused_before_queuing(env, headers):
    refused = env.submit(headers, spec={"target": "cpu-ort", "precision": "fp16"})
    assert refused.status_code == 422, refused.text
    assert "'fp16' is for accelerator targets" in refused.json()["error"]["message"]
    assert env.enqueued == []


def test_an_int8_only_target_without_samples_is_refused_before_queuing_naming_the_fix(env, headers):
    """The KV260's DPU computes int8 only: without samples it would quantise on synthetic inputs and claim an
    accuracy it never measured. Refused with 422 before queuing; allowed explicitly, it queues."""
    before = _jobs(env)
    for spec in ({"target": "xilinx-kv260"}, {"target": "xilinx-kv260", "precision": "int8"}):
        refused = env.submit(headers, spec=spec)
        assert refused.status_code == 422, refused.text
        message = refused.json()["error"]["message"]
        assert "computes int8 only" in message and "'calibration' file" in message, message
        assert "allow_synthetic_calibration" in message
    assert _jobs(env) == before and env.enqueued == []
    samples = _npz(x=np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32))
    with_samples = _submit(env, headers, samples, {"target": "xilinx-kv260", "precision": "int8"})
    assert with_samples.status_code == 202, with_samples.text
    allowed = env.submit(headers, spec={"target": "xilinx-kv260", "allow_synthetic_calibration": True})
    assert allowed.status_code == 202, allowed.text


def test_accuracy_metrics_naming_outputs_the_model_lacks_are_refused_before_queuing(env, headers):
    spec = {"target": "cpu-ort", "precision": "int8", "accuracy": {"outputs": {"nope": "top1"}}}
    refused = env.submit(headers, spec=spec)
    assert refused.status_code == 422, refused.text
    assert "accuracy names outputs the model does not have: 'nope'" in refused.json()["error"]["message"]
    bad_slices = {"target": "cpu-ort", "accuracy": {"outputs": {"y": {"metric": "slices", "slices": {
        "a": {"start": 0, "stop": 4}, "b": {"start": 3, "stop": 5}}}}}}  # fmt: skip
    overlapping = env.submit(headers, spec=bad_slices)
    assert overlapping.status_code == 422 and "overlap" in overlapping.text
