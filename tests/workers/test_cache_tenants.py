"""One tenant's kernel-cache figures say nothing of another tenant's work.

The attack: tenant A submits a model holding a layer shape it wants to know about; a kernel-cache hit in its
job's report or in ``GET /cache/stats`` tells it that another tenant compiled that shape. The kernel cache is
kept per tenant (a job reads and writes only its tenant's entries), so a tenant's hits are hits on its own
earlier jobs; layers shared between its own models still hit. Real PostgreSQL and Redis, the API's own
``/cache/stats``, jobs run by ``execute_job`` with the stand-in optimizer.
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from tests.workers.conftest import create_job, load_job, tiny_model
from workers.execute import execute_job

pytestmark = pytest.mark.services

OPERATOR_TOKEN = "operator-token-for-the-tenant-cache-tests"


@pytest.fixture
def api(settings):
    from service.auth.keys import create_api_key
    from service.core.db import session_factory_for
    from stack import create_app

    keys = {}
    with session_factory_for(settings)() as session, session.begin():
        for tenant in ("alice", "bob"):
            keys[tenant], _ = create_api_key(session, tenant)
    with TestClient(
        create_app(settings.model_copy(update={"operator_token": SecretStr(OPERATOR_TOKEN)}))
    ) as client:
        yield client, keys


def _run(settings, model: bytes, tenant: str) -> dict:
    job_id = create_job(settings, model, tenant=tenant)
    assert execute_job(job_id, settings=settings, worker_id="t1") == "succeeded"
    return load_job(settings, job_id).report_summary


def test_a_tenant_gets_no_hit_on_another_tenants_kernels(settings, api):
    client, keys = api
    assert _run(settings, tiny_model((0.1, 0.2, 0.3)), "bob")["cache_hits"] == 0
    # Alice's model shares two layers with Bob's: nothing in her job or her statistics may say so.
    assert _run(settings, tiny_model((0.1, 0.2, 0.7)), "alice")["cache_hits"] == 0
    response = client.get("/cache/stats", headers={"X-API-Key": keys["alice"]})
    mine = response.json()
    assert mine["scope"] == "tenant"
    assert (mine["kernel_cache"]["hits"], mine["kernel_cache"]["misses"]) == (0, 3)
    assert mine["kernel_cache"]["entries"] is None and mine["kernel_cache"]["stored_hits"] is None
    assert "kernel:" not in response.text  # no key, hence no layer, of anyone

    # Her own layers still hit: the cache is kept per tenant, not switched off.
    assert _run(settings, tiny_model((0.1, 0.7, 0.9)), "alice")["cache_hits"] == 2
    mine = client.get("/cache/stats", headers={"X-API-Key": keys["alice"]}).json()["kernel_cache"]
    assert (mine["hits"], mine["misses"]) == (2, 4)
    theirs = client.get("/cache/stats", headers={"X-API-Key": keys["bob"]}).json()["kernel_cache"]
    assert (theirs["hits"], theirs["misses"]) == (0, 3)

    operator = client.get("/cache/stats", headers={"Authorization": f"Bearer {OPERATOR_TOKEN}"}).json()
    assert operator["scope"] == "service"
    assert (operator["kernel_cache"]["hits"], operator["kernel_cache"]["misses"]) == (2, 7)
    assert operator["kernel_cache"]["entries"] == 7  # Bob's 3 and Alice's 4, each kept apart
