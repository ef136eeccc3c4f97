"""Hostile and malformed submissions are answered with a clear 4xx in the one error shape, and nothing
is stored or queued for them."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import func, select, update

from service.core.models import Job
from tests.service.conftest import tiny_onnx


def _assert_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code, body
    assert body["error"]["message"]
    return body["error"]


def _job_count(env, headers) -> int:
    tenant_jobs = env.client.get("/jobs", headers=headers).json()
    return tenant_jobs["total"]


def _blobs(env) -> set[str]:
    return {p.name for p in env.store.root.glob("??/*")}


@pytest.fixture
def small_limit_client(env):
    from fastapi.testclient import TestClient

    from stack import create_app

    app = create_app(env.settings.model_copy(update={"max_upload_bytes": 64}))
    return TestClient(app)  # no lifespan: the database is already prepared


def test_oversize_upload_is_413_before_anything_is_stored(env, headers, small_limit_client):
    before = _blobs(env)
    big = tiny_onnx() + b"\x00" * 10_000  # larger than 64 bytes
    error = _assert_error(env.submit(headers, model=big, client=small_limit_client), 413, "payload_too_large")
    assert error["details"]["max_upload_bytes"] == 64
    assert _blobs(env) == before and _job_count(env, headers) == 0
    assert not list(env.store.staging_dir().glob("upload-*"))


def test_oversize_streamed_upload_without_content_length_is_413(env, headers, small_limit_client):
    boundary = "b0undary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="spec"\r\n\r\n{json.dumps({"target": "cpu-ort"})}'
        f'\r\n--{boundary}\r\nContent-Disposition: form-data; name="model"; filename="m.onnx"\r\n\r\n'
    ).encode()

    def body():  # a generator: httpx sends it chunked, with no Content-Length
        yield head
        for _ in range(200):
            yield b"\x08" * 1024
        yield f"\r\n--{boundary}--\r\n".encode()

    response = small_limit_client.post(
        "/optimize",
        headers={**headers, "Content-Type": f"multipart/form-data; boundary={boundary}"},
        content=body(),
    )
    _assert_error(response, 413, "payload_too_large")
    assert _job_count(env, headers) == 0


def test_declared_content_length_is_checked_first(env, headers, small_limit_client):
    request = httpx.Request(
        "POST",
        "http://testserver/optimize",
        headers={**headers, "Content-Length": "999999999", "Content-Type": "multipart/form-data; boundary=x"},
        content=b"",
    )
    response = small_limit_client.send(request)
    _assert_error(response, 413, "payload_too_large")


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (b"this is a text file, not a model\n", "not an ONNX model"),
        (tiny_onnx()[: len(tiny_onnx()) // 2], "truncated"),
        (b"", "empty"),
    ],
    ids=["text", "truncated", "empty"],
)
def test_not_onnx_is_422_with_reason(env, headers, model, reason):
    before = _blobs(env)
    error = _assert_error(env.submit(headers, model=model), 422, "invalid_model")
    assert reason in error["message"] and reason in error["details"]["reason"]
    assert _blobs(env) == before and _job_count(env, headers) == 0 and env.enqueued == []


def test_model_without_graph_is_422(env, headers):
    from onnx import ModelProto, helper

    no_graph = ModelProto(ir_version=9, opset_import=[helper.make_opsetid("", 17)]).SerializeToString()
    error = _assert_error(env.submit(headers, model=no_graph), 422, "invalid_model")
    assert "no graph" in error["message"]


def test_invalid_spec_is_422_with_field_errors(env, headers):
    error = _assert_error(
        env.submit(headers, spec={"target": "cpu-ort", "objectiv": "latency", "latency_repeats": 0}),
        422,
        "invalid_spec",
    )
    locations = {tuple(d["loc"]) for d in error["details"]}
    assert ("objectiv",) in locations and ("latency_repeats",) in locations
    _assert_error(env.submit(headers, spec="{not json"), 422, "invalid_spec")
    _assert_error(env.submit(headers, spec={"objective": "latency"}), 422, "invalid_spec")
    assert _job_count(env, headers) == 0


def test_unknown_target_is_422(env, headers):
    error = _assert_error(env.submit(headers, spec={"target": "quantum-toaster"}), 422, "unknown_target")
    assert "cpu-ort" in error["message"]  # names the targets that do exist


def test_invalid_custom_target_is_422(env, headers):
    _assert_error(env.submit(headers, spec={"target": {"name": "x"}}), 422, "invalid_target")


def test_custom_target_with_unknown_toolchain_or_constraint_is_422_naming_it(env, headers):
    custom = {"name": "acme-npu", "vendor": "acme", "adapter": "accelerator", "supported_ops": ["Relu"]}
    error = _assert_error(env.submit(headers, spec={"target": {**custom, "toolchain": "nope"}}), 422, "invalid_target")
    assert "unknown toolchain 'nope'" in json.dumps(error)
    bad_limit = {**custom, "op_constraints": {"Relu": {"kernal_max": 3}}}
    error = _assert_error(env.submit(headers, spec={"target": bad_limit}), 422, "invalid_target")
    assert "kernal_max" in json.dumps(error)


def test_custom_accelerator_target_is_queued(env, headers):
    custom = {"name": "acme-npu", "vendor": "acme", "adapter": "accelerator", "supported_ops": ["Relu"]}
    response = env.submit(headers, spec={"target": custom})
    assert response.status_code == 202, response.text
    assert env.job(response.json()["job_id"]).target == "acme-npu"


def test_missing_form_parts_are_422(env, headers):
    no_spec = env.client.post("/optimize", headers=headers, files={"model": ("m.onnx", tiny_onnx())})
    _assert_error(no_spec, 422, "invalid_upload")
    no_model = env.client.post("/optimize", headers=headers, data={"spec": '{"target": "cpu-ort"}'})
    _assert_error(no_model, 422, "invalid_upload")
    not_multipart = env.client.post("/optimize", headers=headers, json={"target": "cpu-ort"})
    _assert_error(not_multipart, 422, "invalid_upload")


def test_quota_of_queued_jobs_is_429(env):
    headers = env.new_key(max_queued_jobs=2)
    for alpha in (0.1, 0.2):
        assert env.submit(headers, model=tiny_onnx(alpha)).status_code == 202
    error = _assert_error(env.submit(headers, model=tiny_onnx(0.3)), 429, "quota_exceeded")
    assert error["details"] == {"active": 2, "queued": 2, "running": 0, "limit": 2}
    # Cancelling one frees a slot.
    first = env.client.get("/jobs", headers=headers).json()["items"][0]["id"]
    env.client.delete(f"/jobs/{first}", headers=headers)
    assert env.submit(headers, model=tiny_onnx(0.3)).status_code == 202
    with env.sessions() as session:
        assert (
            session.scalar(
                select(func.count()).select_from(Job).where(Job.status == "queued", Job.id.in_(env.enqueued))
            )
            == 2
        )


def test_quota_counts_running_jobs_too(env):
    headers = env.new_key(max_queued_jobs=2)
    for alpha in (0.1, 0.2):
        assert env.submit(headers, model=tiny_onnx(alpha)).status_code == 202
    with env.sessions() as session:
        session.execute(update(Job).where(Job.id.in_(env.enqueued)).values(status="running"))
        session.commit()
    error = _assert_error(env.submit(headers, model=tiny_onnx(0.3)), 429, "quota_exceeded")
    assert error["details"] == {"active": 2, "queued": 0, "running": 2, "limit": 2}
    env.finish(env.enqueued[0])
    assert env.submit(headers, model=tiny_onnx(0.3)).status_code == 202


def test_framework_errors_use_the_error_shape(env, headers):
    _assert_error(env.client.get("/no/such/route", headers=headers), 404, "not_found")
    _assert_error(env.client.put("/jobs", headers=headers), 405, "method_not_allowed")
    error = _assert_error(env.client.get("/jobs?limit=100000", headers=headers), 422, "invalid_request")
    assert error["details"][0]["loc"] == ["query", "limit"]


def test_unhandled_exception_is_500_in_the_error_shape(env):
    from fastapi.testclient import TestClient

    from stack import create_app

    app = create_app(env.settings)

    @app.get("/boom")
    def boom():
        raise RuntimeError("secret internals")

    response = TestClient(app, raise_server_exceptions=False).get("/boom")
    error = _assert_error(response, 500, "internal_error")
    assert "secret" not in error["message"]
    # The client gets an incident id; the operator finds the traceback under it.
    incident_id = error["details"]["incident"]
    assert incident_id in error["message"]
    from service.core.models import Incident

    with env.sessions() as session:
        incident = session.get(Incident, incident_id)
        assert incident is not None and incident.job_id is None
        assert "RuntimeError: secret internals" in incident.traceback
        assert incident.summary == "Internal server error on GET /boom"


def test_quota_holds_under_concurrent_submissions(env):
    import threading

    headers = env.new_key(max_queued_jobs=2)
    statuses = []

    def post(alpha):
        statuses.append(env.submit(headers, model=tiny_onnx(alpha)).status_code)

    threads = [threading.Thread(target=post, args=(0.01 * i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [202, 202, 429, 429, 429, 429]


def test_unknown_rule_name_is_422_before_queuing(env, headers):
    error = _assert_error(
        env.submit(headers, spec={"target": "cpu-ort", "disabled_rules": ["layer_norm", "layer_nrom"]}),
        422,
        "invalid_options",
    )
    assert "layer_nrom" in error["message"] and error["details"] == {"unknown_rules": ["layer_nrom"]}
    assert _job_count(env, headers) == 0 and env.enqueued == []


def test_impossible_shape_bucket_is_422_naming_the_bucket(env, headers):
    from tests.core.test_preflight import positions_model

    spec = {"target": "cpu-ort", "shape_buckets": {"seq": [32, 128]}}
    error = _assert_error(env.submit(headers, model=positions_model(), spec=spec), 422, "invalid_options")
    assert "shape bucket 'seq128' (seq=128) cannot run" in error["message"]
    assert "this model takes at most 64 positions" in error["message"] and "seq <= 64" in error["message"]
    assert error["details"]["bucket"] == "seq128" and error["details"]["dims"] == {"seq": 128}
    assert error["details"]["limit"] == {"dim": "seq", "max": 64}
    assert _job_count(env, headers) == 0 and env.enqueued == []
    # Without shape_buckets on a static part the default seq 128 is capped for this model, not refused: queued.
    capped = env.submit(headers, model=positions_model(), spec={"target": "rockchip-rk3588"})
    assert capped.status_code == 202, capped.text
    # The same model with buckets it can run is queued.
    ok = env.submit(
        headers, model=positions_model(), spec={"target": "cpu-ort", "shape_buckets": {"seq": [32]}}
    )
    assert ok.status_code == 202, ok.text


def test_a_huge_offset_is_422_not_a_database_overflow(env, headers):
    """Found by bench.fuzz: offset 2^63 overflowed SQLite's INTEGER (500)."""
    response = env.client.get("/jobs?limit=1&offset=9223372036854775808", headers=headers)
    _assert_error(response, 422, "invalid_request")
    assert env.client.get("/jobs?limit=1&offset=2147483647", headers=headers).status_code == 200


def test_a_file_under_another_field_name_is_422_naming_the_model_field(env, headers):
    response = env.client.post(
        "/optimize", headers=headers,
        files={"file": ("m.onnx", tiny_onnx() * 200, "application/octet-stream")},  # far over a text field's 4 KiB
        data={"spec": '{"target": "cpu-ort"}'},
    )  # fmt: skip
    error = _assert_error(response, 422, "invalid_upload")
    assert "'file' carries a file" in error["message"] and "field named 'model'" in error["message"]
    assert error["details"] == {"field": "file", "expected": "model"}


def test_a_mistyped_spec_key_gets_did_you_mean(env, headers):
    spec = {"target": "cpu-ort", "shape_bucket": {"seq": [8]}, "accuracy": {"min_cosin": 0.9}, "zzz": 1}
    error = _assert_error(env.submit(headers, spec=spec), 422, "invalid_spec")
    assert "did you mean" in error["message"] and "'shape_buckets'" in error["message"]
    by_key = {tuple(d["loc"]): d for d in error["details"]}
    assert by_key[("shape_bucket",)]["did_you_mean"] == "shape_buckets"
    assert by_key[("accuracy", "min_cosin")]["did_you_mean"] == "min_cosine"
    assert "did_you_mean" not in by_key[("zzz",)] and "Accepted here: " in by_key[("zzz",)]["msg"]
