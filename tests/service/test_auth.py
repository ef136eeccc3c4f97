"""API keys and tenant isolation."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.auth.keys import authenticate, create_api_key, generate_key, hash_key, parse_prefix


def test_key_format_and_hash():
    new = generate_key()
    assert new.key.startswith(f"fdsa_{new.prefix}_") and len(new.key) > 50
    assert parse_prefix(new.key) == new.prefix and new.key_hash == hash_key(new.key) != new.key
    assert parse_prefix("fdsa_short_x") is None and parse_prefix("Bearer abc") is None


@pytest.mark.parametrize("path", ["/jobs", "/targets", "/cache/stats", "/jobs/some-id"])
def test_missing_key_is_401(env, path):
    response = env.client.get(path)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "missing_api_key"


def test_wrong_key_is_401(env, headers):
    key = headers["X-API-Key"]
    for wrong in (key[:-2] + "xx", "fdsa_000000000000_nope", "not-a-key"):
        response = env.client.get("/jobs", headers={"X-API-Key": wrong})
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert env.submit({"X-API-Key": "fdsa_000000000000_nope"}).status_code == 401


def test_key_in_cookie_is_accepted(env, headers):
    client = TestClient(env.app, cookies={"flexdsa_key": headers["X-API-Key"]})
    assert client.get("/jobs").status_code == 200


def test_revoked_key_is_refused(env):
    from service.auth.keys import revoke_api_key

    with env.sessions() as session:
        key, row = create_api_key(session, "revoked-tenant", "old")
        session.commit()
        assert authenticate(session, key) is not None
        revoke_api_key(session, row.prefix)
        session.commit()
    assert env.client.get("/jobs", headers={"X-API-Key": key}).status_code == 401


# Routes whose {param} names no tenant's data: the same for everyone (a value to call them with).
PUBLIC_ROUTES = {
    "/targets/{name}": {"name": "cpu-ort"},
    "/ui/static/{name}": {"name": "dashboard.css"},
    "/docs/static/{name}": {"name": "swagger-ui.css"},
}
REFUSED = {401, 403, 404}
UNKNOWN_IDS = {"job_id": "00000000-0000-4000-8000-000000000000", "incident_id": "ffffffffffff", "name": "bundle.zip",
               "group_id": "00000000-0000-4000-8000-000000000001"}


def _id_routes() -> list[tuple[str, str]]:
    """(method, path) of every route with a path parameter, from the routers the app is assembled from:
    a route added tomorrow is in this list without anyone editing the test."""
    from service.app import discover_routers

    return sorted(
        (method, route.path)
        for _, router in discover_routers()
        for route in router.routes
        if "{" in route.path
        for method in route.methods - {"HEAD", "OPTIONS"}
    )


def _victim(env) -> tuple[dict, dict, list[str]]:
    """A tenant with a finished job, its artifact and an incident: (its headers, the value for each path
    parameter, strings that must reach nobody else)."""
    import uuid

    from service.core.models import Incident
    from tests.runtime.tiny_models import MASKED, masked_bundle, model_bytes

    tag = uuid.uuid4().hex[:12]
    headers = env.new_key(f"victim-{tag}")
    # A real bundle with a dynamic dim, and traffic pushed for it, so the traffic routes serve the owner too.
    job_id = env.submit(headers, model=model_bytes(MASKED), filename=f"secret-{tag}.onnx").json()["job_id"]
    env.finish(job_id, artifacts={**masked_bundle(), "bundle.zip": f"artifact-secret-{tag}".encode()})
    entry = {"dims": {"batch": 1, "seq": 4}, "bucket": "batch1_seq8", "count": 3, "elements": 60, "padded_elements": 120}
    pushed = env.client.post(f"/jobs/{job_id}/traffic", headers=headers, json={"bundle_version": tag, "entries": [entry]})
    assert pushed.status_code == 201, pushed.text
    with env.sessions() as session:
        session.add(
            Incident(
                id=tag, job_id=job_id, tenant_id=env.job(job_id).tenant_id, attempt=1, code="internal_error",
                summary="deliberate", traceback=f"trace-secret-{tag}",
            )
        )  # fmt: skip
        session.commit()
    # A job group of the same tenant, for the group routes.
    grouped = env.submit(headers, model=model_bytes(MASKED), spec={"targets": ["cpu-ort"]}, filename=f"secret-{tag}.onnx")
    assert grouped.status_code == 202, grouped.text
    group_id = grouped.json()["group_id"]
    values = {"job_id": job_id, "incident_id": tag, "name": "bundle.zip", "group_id": group_id}
    return headers, values, [f"victim-{tag}", f"secret-{tag}", f"artifact-secret-{tag}", f"trace-secret-{tag}"]


def _url(path: str, values: dict[str, str]) -> str:
    import re

    def value(match) -> str:
        name = match.group(1)
        assert name in values, f"{path}: the BOLA test has no value for {{{name}}}; add one to _victim"
        return values[name]

    return re.sub(r"\{(\w+)(?::\w+)?\}", value, path)


def test_no_route_with_an_id_reads_another_tenants_data(env):
    """BOLA over every route with a path parameter: the owner (its key, or the operator token for the
    operators' routes) reads it; another tenant, by key or cookie, and a caller with no key get a refusal
    carrying nothing of the owner's, and a DELETE by another tenant changes nothing."""
    from tests.service.conftest import OPERATOR_HEADERS

    routes = _id_routes()
    assert {("GET", "/jobs/{job_id}"), ("GET", "/ui/jobs/{job_id}"), ("GET", "/incidents/{incident_id}")} <= set(routes)
    owner, values, secrets = _victim(env)
    job_id = values["job_id"]
    intruder = env.new_key()
    callers = {
        "key": (intruder, {}),
        "cookie": ({}, {"flexdsa_key": intruder["X-API-Key"]}),
        "none": ({}, {}),
    }
    checked = []
    for method, path in routes:
        url = _url(path, {**values, **PUBLIC_ROUTES.get(path, {})})
        if method == "GET":  # the values are live: the owner is served
            served = env.client.get(url, headers={**owner, **OPERATOR_HEADERS}, follow_redirects=False)
            assert served.status_code == 200, (path, served.status_code, served.text[:300])
        for who, (headers, cookies) in callers.items():
            client = TestClient(env.app, cookies=cookies)
            response = client.request(method, url, headers=headers, follow_redirects=False)
            body = response.text
            assert not [s for s in secrets if s in body], (method, path, who, body[:300])
            if path in PUBLIC_ROUTES:
                continue
            login = response.status_code == 303 and "/ui/login" in response.headers["location"]
            assert response.status_code in REFUSED or login, (method, path, who, response.status_code, body[:300])
            # No existence oracle: the owner's id is answered exactly as an id nobody has.
            unknown = client.request(method, _url(path, UNKNOWN_IDS), headers=headers, follow_redirects=False)
            assert response.status_code == unknown.status_code, (method, path, who)
            checked.append((method, path, who))
    assert env.job(job_id).status == "succeeded"  # no DELETE by another tenant cancelled it
    assert env.client.get(f"/jobs/{job_id}/artifacts/bundle.zip", headers=owner).content == secrets[2].encode()
    assert len(checked) == 3 * (len(routes) - sum(path in PUBLIC_ROUTES for _, path in routes))
    assert env.client.get("/jobs", headers=intruder).json()["total"] == 0


def test_unknown_job_is_404_like_another_tenants(env, headers):
    response = env.client.get("/jobs/00000000-0000-0000-0000-000000000000", headers=headers)
    assert response.status_code == 404 and response.json()["error"]["code"] == "job_not_found"


def test_optional_auth_acts_as_default_tenant(tmp_path):
    from service.core.config import Settings
    from stack import create_app

    settings = Settings(data_dir=tmp_path, embedded_worker=False)
    assert settings.auth == "optional"
    with TestClient(create_app(settings)) as client:
        assert client.get("/jobs").status_code == 200
        with client.app.state.session_factory() as session:
            from sqlalchemy import select

            from service.core.models import Tenant

            assert session.scalar(select(Tenant.name).where(Tenant.name == "default")) == "default"
        # A wrong key is still refused: the caller meant a tenant, not 'default'.
        assert client.get("/jobs", headers={"X-API-Key": "fdsa_000000000000_x"}).status_code == 401


def test_bearer_api_key_is_the_same_tenant_as_x_api_key(env, headers):
    from tests.service.conftest import OPERATOR_HEADERS

    bearer = {"Authorization": f"Bearer {headers['X-API-Key']}"}
    job_id = env.submit(bearer).json()["job_id"]
    listed = env.client.get("/jobs", headers=headers).json()["items"]
    assert [j["id"] for j in listed] == [job_id]  # submitted with Bearer, seen with X-API-Key
    assert env.client.get(f"/jobs/{job_id}", headers=bearer).status_code == 200
    other = {"Authorization": f"Bearer {env.new_key()['X-API-Key']}"}
    assert env.client.get(f"/jobs/{job_id}", headers=other).status_code == 404  # another tenant's
    wrong = env.client.get("/jobs", headers={"Authorization": "Bearer fdsa_000000000000_nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    # /cache/stats answers both: a tenant's key as a bearer token gets the tenant's view, the operator token
    # the service's; an operator surface refuses a tenant's key.
    assert env.client.get("/cache/stats", headers=bearer).json()["scope"] == "tenant"
    assert env.client.get("/cache/stats", headers=OPERATOR_HEADERS).json()["scope"] == "service"
    metrics = env.client.get("/metrics", headers=bearer)
    assert metrics.status_code == 401 and metrics.json()["error"]["code"] == "operator_token_required"
    assert env.client.get("/metrics", headers=OPERATOR_HEADERS).status_code == 200


def test_openapi_declares_both_ways_to_send_the_key(env):
    document = env.client.get("/openapi.json").json()
    schemes = document["components"]["securitySchemes"]
    assert schemes["ApiKey"] == {"type": "apiKey", "in": "header", "name": "X-API-Key", "description": schemes["ApiKey"]["description"]}
    assert schemes["Bearer"]["type"] == "http" and schemes["Bearer"]["scheme"] == "bearer"
    jobs = document["paths"]["/jobs"]["get"]["security"]
    assert {"ApiKey": []} in jobs and {"Bearer": []} in jobs
    optimize = document["paths"]["/optimize"]["post"]["security"]
    assert {"ApiKey": []} in optimize and {"Bearer": []} in optimize
