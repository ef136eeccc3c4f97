"""Operator surfaces are operators' only: ``/metrics`` needs the operator token (or, with none configured,
is off in distributed mode and loopback-only in embedded mode); ``/cache/stats`` shows a tenant its own
counters and an operator the service's."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr, ValidationError

from service.cache.stats import record_cache_stats
from service.core.config import Settings
from stack import create_app
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


@pytest.mark.services
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


# --- the dashboard's incident pages ---------------------------------------------------------------------


def _failed_job_with_incident(env, headers) -> tuple[str, str, str]:
    """A failed job as the worker leaves it after an internal error: the user's error quotes the incident
    id, the incidents table holds the traceback. Returns (job id, incident id, traceback)."""
    import uuid

    from service.core.models import Incident, Job, utcnow

    job_id = env.submit(headers, spec={"target": "cpu-ort", "seed": 4242}).json()["job_id"]
    incident = uuid.uuid4().hex[:12]
    trace = f'Traceback (most recent call last):\n  File "optimizer.py"\nRuntimeError: secret-{incident}'
    with env.sessions() as session:
        job = session.get(Job, job_id)
        job.status, job.finished_at = "failed", utcnow()
        job.error = {
            "code": "internal_error",
            "message": f"the optimizer failed unexpectedly (RuntimeError); incident {incident} is recorded",
            "details": {"incident": incident},
        }
        session.add(
            Incident(
                id=incident, job_id=job_id, tenant_id=job.tenant_id, attempt=1, code="internal_error",
                summary=job.error["message"], traceback=trace,
            )
        )  # fmt: skip
        session.commit()
    return job_id, incident, trace


def test_incident_pages_show_the_traceback_to_operators_only(env, headers):
    job_id, incident, trace = _failed_job_with_incident(env, headers)
    secret = trace.splitlines()[-1]

    listed = env.client.get("/ui/incidents", headers=OPERATOR_HEADERS)
    assert listed.status_code == 200 and f"/ui/incidents/{incident}" in listed.text
    page = env.client.get(f"/ui/incidents/{incident}", headers=OPERATOR_HEADERS)
    assert page.status_code == 200
    assert secret in page.text and job_id in page.text and "internal_error" in page.text
    tenant_id = env.job(job_id).tenant_id
    assert f"(id {tenant_id})" in page.text and " UTC" in page.text  # tenant and time

    # Tenants (key in header or cookie), no credentials, or a wrong token: the page is simply not there.
    intruders = [
        ({}, {}),
        (headers, {}),
        ({}, {"flexdsa_key": headers["X-API-Key"]}),
        ({"Authorization": "Bearer wrong-token-wrong-token-wrong"}, {}),
        ({}, {"flexdsa_operator": "wrong-token-wrong-token-wrong"}),
    ]
    for sent, cookies in intruders:
        client = TestClient(env.app, cookies=cookies)
        for path in (f"/ui/incidents/{incident}", "/ui/incidents"):
            response = client.get(path, headers=sent)
            assert response.status_code == 404, (path, sent, cookies)
            assert secret not in response.text and incident not in response.text
    assert env.client.get("/ui/incidents/ffffffffffff", headers=OPERATOR_HEADERS).status_code == 404

    # The tenant's own job page quotes the id, without the traceback and without a link it could not open.
    mine = env.client.get(f"/ui/jobs/{job_id}", headers=headers)
    assert mine.status_code == 200 and f"Incident <code>{incident}</code>" in mine.text
    assert secret not in mine.text and "Traceback" not in mine.text
    assert f"/ui/incidents/{incident}" not in mine.text


def test_operator_token_login_opens_the_incident_pages(env, headers):
    _, incident, trace = _failed_job_with_incident(env, headers)
    client = TestClient(env.app)
    wrong = client.post("/ui/operator", data={"token": "not-the-token-not-the-token", "next": "/ui/incidents"})
    assert wrong.status_code == 401 and "flexdsa_operator" not in wrong.cookies
    foreign = client.post(
        "/ui/operator", data={"token": OPERATOR_TOKEN}, headers={"Origin": "https://evil.example"}
    )
    assert foreign.status_code == 403 and "flexdsa_operator" not in foreign.cookies

    answer = client.post(
        "/ui/operator", data={"token": OPERATOR_TOKEN, "next": f"/ui/incidents/{incident}"}, follow_redirects=False
    )
    assert answer.status_code == 303 and answer.headers["location"].endswith(f"/ui/incidents/{incident}")
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui/" in cookie
    page = client.get(f"/ui/incidents/{incident}")
    assert page.status_code == 200 and trace.splitlines()[-1] in page.text
    # The cookie opens the dashboard's pages, not the JSON API (which takes the bearer header).
    assert client.get(f"/incidents/{incident}").status_code == 401
    client.post("/ui/logout")
    assert client.get(f"/ui/incidents/{incident}").status_code == 404
