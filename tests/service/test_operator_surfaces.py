"""Operator surfaces are operators' only: ``/metrics`` needs the operator token (or, with none configured,
is off in distributed mode and loopback-only in embedded mode); ``/cache/stats`` shows a tenant its own
counters and an operator the service's."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr, ValidationError

from service.app import create_app
from service.cache_stats import record_cache_stats
from service.config import Settings
from tests.service.conftest import OPERATOR_HEADERS, OPERATOR_TOKEN


def _code(response) -> str:
    return response.json()["error"]["code"]


@pytest.mark.parametrize(
    "sent",
    [{}, {"Authorization": "Bearer wrong-token-wrong-token-wrong"}, {"Authorization": OPERATOR_TOKEN}],
)
def test_metrics_without_the_operator_token_is_401(env, headers, sent):
    response = env.client.get("/metrics", headers={**headers, **sent})  # a tenant's key is not enough
    assert response.status_code == 401, response.text
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert "flexdsa_jobs" not in response.text


def test_metrics_with_the_operator_token(env):
    response = env.client.get("/metrics", headers=OPERATOR_HEADERS)
    assert response.status_code == 200 and "flexdsa_http_requests_total" in response.text


def test_metrics_without_a_configured_token_is_off_in_distributed_mode(pg_database_url, redis_url, tmp_path):
    settings = Settings(
        data_dir=tmp_path, database_url=pg_database_url, broker_url=redis_url, redis_url=redis_url
    )
    client = TestClient(create_app(settings), client=("127.0.0.1", 50000))  # even from loopback
    response = client.get("/metrics")
    assert response.status_code == 404 and "FLEXDSA_OPERATOR_TOKEN" in response.json()["error"]["message"]
    # A bearer token when none is configured is wrong, not a way in.
    assert client.get("/metrics", headers=OPERATOR_HEADERS).status_code == 401


def test_metrics_without_a_configured_token_is_loopback_only_in_embedded_mode(tmp_path):
    app = create_app(Settings(data_dir=tmp_path))
    with TestClient(app, client=("127.0.0.1", 50000)) as local:
        assert local.get("/metrics").status_code == 200
    with TestClient(app, client=("::1", 50000)) as local_v6:
        assert local_v6.get("/metrics").status_code == 200
    with TestClient(app, client=("192.0.2.7", 50000)) as remote:
        assert remote.get("/metrics").status_code == 404


def test_a_short_operator_token_is_refused_at_start_up(tmp_path):
    with pytest.raises(ValidationError, match="FLEXDSA_OPERATOR_TOKEN is shorter"):
        Settings(data_dir=tmp_path, operator_token=SecretStr("letmein"))


def test_cache_stats_are_per_tenant_for_tenants_and_global_for_operators(env):
    alice, bob = env.new_key(), env.new_key()
    alice_id = env.job(env.submit(alice).json()["job_id"]).tenant_id
    bob_id = env.job(env.submit(bob).json()["job_id"]).tenant_id
    before = env.client.get("/cache/stats", headers=OPERATOR_HEADERS).json()["kernel_cache"]
    record_cache_stats(env.settings, {"hits": 4, "misses": 1, "seconds_saved": 2.0}, env.sessions, alice_id)
    record_cache_stats(env.settings, {"hits": 9, "misses": 6}, env.sessions, bob_id)

    mine = env.client.get("/cache/stats", headers=alice).json()
    assert mine["scope"] == "tenant"
    assert (mine["kernel_cache"]["hits"], mine["kernel_cache"]["misses"]) == (4, 1)
    assert mine["kernel_cache"]["entries"] is None and mine["job_cache"]["jobs"] == 1
    theirs = env.client.get("/cache/stats", headers=bob).json()["kernel_cache"]
    assert (theirs["hits"], theirs["misses"]) == (9, 6)

    service = env.client.get("/cache/stats", headers=OPERATOR_HEADERS).json()
    assert service["scope"] == "service"
    assert service["kernel_cache"]["hits"] - before["hits"] == 13
    assert service["kernel_cache"]["misses"] - before["misses"] == 7
    assert service["kernel_cache"]["entries"] is not None and service["job_cache"]["jobs"] >= 2

    wrong = env.client.get("/cache/stats", headers={**alice, "Authorization": "Bearer nope"})
    assert wrong.status_code == 401 and _code(wrong) == "invalid_operator_token"
    assert env.client.get("/cache/stats").status_code == 401  # neither a key nor a token
