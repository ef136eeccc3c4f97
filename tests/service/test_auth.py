"""API keys and tenant isolation."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from service.auth import authenticate, create_api_key, generate_key, hash_key, parse_prefix


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
    from service.auth import revoke_api_key

    with env.sessions() as session:
        key, row = create_api_key(session, "revoked-tenant", "old")
        session.commit()
        assert authenticate(session, key) is not None
        revoke_api_key(session, row.prefix)
        session.commit()
    assert env.client.get("/jobs", headers={"X-API-Key": key}).status_code == 401


def test_other_tenants_job_is_404_everywhere(env, headers):
    job_id = env.submit(headers).json()["job_id"]
    env.finish(job_id, artifacts={"bundle.zip": b"secret"})
    intruder = env.new_key()
    for method, path in [
        ("GET", f"/jobs/{job_id}"),
        ("GET", f"/jobs/{job_id}/events"),
        ("GET", f"/jobs/{job_id}/artifacts"),
        ("GET", f"/jobs/{job_id}/artifacts/bundle.zip"),
        ("DELETE", f"/jobs/{job_id}"),
    ]:
        response = env.client.request(method, path, headers=intruder)
        assert response.status_code == 404, (method, path)
        assert response.json()["error"]["code"] == "job_not_found"
    assert env.client.get("/jobs", headers=intruder).json()["total"] == 0
    assert env.client.get(f"/jobs/{job_id}", headers=headers).status_code == 200


def test_unknown_job_is_404_like_another_tenants(env, headers):
    response = env.client.get("/jobs/00000000-0000-0000-0000-000000000000", headers=headers)
    assert response.status_code == 404 and response.json()["error"]["code"] == "job_not_found"


def test_optional_auth_acts_as_default_tenant(tmp_path):
    from service.app import create_app
    from service.config import Settings

    settings = Settings(data_dir=tmp_path, embedded_worker=False)
    assert settings.auth == "optional"
    with TestClient(create_app(settings)) as client:
        assert client.get("/jobs").status_code == 200
        with client.app.state.session_factory() as session:
            from sqlalchemy import select

            from service.models import Tenant

            assert session.scalar(select(Tenant.name).where(Tenant.name == "default")) == "default"
        # A wrong key is still refused: the caller meant a tenant, not 'default'.
        assert client.get("/jobs", headers={"X-API-Key": "fdsa_000000000000_x"}).status_code == 401
