"""The distributed path end to end: the API (``create_app``) commits and enqueues, a real Celery worker
process runs the job, the API serves its state, artifacts and cache statistics; the identical request is
answered from the whole-job cache, and DELETE stops a running job."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from tests.workers.conftest import tiny_model, wait_for

pytestmark = pytest.mark.services

OPERATOR_TOKEN = "operator-token-for-the-e2e-tests"


@pytest.fixture
def api(settings):
    from service.auth.keys import create_api_key
    from service.core.db import session_factory_for
    from stack import create_app

    with session_factory_for(settings)() as session, session.begin():
        key, _ = create_api_key(session, "e2e")
    settings = settings.model_copy(update={"operator_token": SecretStr(OPERATOR_TOKEN)})
    with TestClient(create_app(settings)) as client:
        client.headers["X-API-Key"] = key
        yield client


def _submit(api, model: bytes):
    response = api.post("/optimize", files={"model": ("m.onnx", model)},
                        data={"spec": json.dumps({"target": "cpu-ort"})})
    assert response.status_code == 202, response.text
    return response.json()


def _job(api, job_id: str) -> dict:
    return api.get(f"/jobs/{job_id}").json()


def test_submit_run_download_and_resubmit(api, start_worker):
    start_worker("w1")
    job_id = _submit(api, tiny_model())["job_id"]
    job = wait_for(lambda: (j := _job(api, job_id))["status"] in {"succeeded", "failed"} and j, 60, "the job")
    assert job["status"] == "succeeded", job["error"]
    items = api.get(f"/jobs/{job_id}/artifacts").json()["items"]
    assert sorted(a["name"] for a in items) == ["manifest.json", "model.onnx", "report.json"]
    assert all(api.get(a["url"]).status_code == 200 for a in items)

    again = _submit(api, tiny_model())
    assert again["status"] == "succeeded" and again["cached"] is True

    stats = api.get("/cache/stats").json()  # the tenant's own view: its job's misses, no shared figures
    assert stats["scope"] == "tenant" and stats["kernel_cache"]["misses"] == 3
    assert stats["kernel_cache"]["entries"] is None
    assert stats["job_cache"]["hits"] == 1
    operator = {"X-API-Key": "", "Authorization": f"Bearer {OPERATOR_TOKEN}"}
    service_wide = api.get("/cache/stats", headers=operator).json()
    assert service_wide["scope"] == "service" and service_wide["kernel_cache"]["entries"] == 3


def test_delete_cancels_a_running_job(api, start_worker):
    start_worker("w1", FLEXDSA_TEST_STAGE_DELAY_S="3")
    job_id = _submit(api, tiny_model((0.5,)))["job_id"]
    wait_for(lambda: _job(api, job_id)["stage"] is not None, 45, "the job to start")
    assert api.delete(f"/jobs/{job_id}").status_code in (200, 202)
    job = wait_for(lambda: (j := _job(api, job_id))["status"] in {"cancelled", "succeeded", "failed"} and j,
                   15, "the cancellation")
    assert job["status"] == "cancelled"
