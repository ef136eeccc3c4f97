"""Per-tenant submit rate limit: 429 with Retry-After past the limit, decided before the body is read, per
tenant (another tenant is not affected), counted in Redis when the service has one."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from service.core.ratelimit import WINDOW_S
from tests.service.conftest import tiny_onnx


@pytest.fixture(params=["in-process", pytest.param("redis", marks=pytest.mark.services)])
def limited(request, tmp_path):
    from service.core.config import Settings
    from stack import create_app

    extra = {}
    if request.param == "redis":
        redis_url = request.getfixturevalue("redis_url")
        extra = {"redis_url": redis_url}
        # The counters are keyed by tenant id, and every test's fresh database numbers its tenants from 1: the
        # other service tests' submits on the shared Redis, in the same minute, would count for these tenants
        # too (seen: one and two submits already counted).
        import redis

        client = redis.Redis.from_url(redis_url)
        try:
            stale = list(client.scan_iter("flexdsa:rate:*"))
            if stale:
                client.delete(*stale)
        finally:
            client.close()
    settings = Settings(data_dir=tmp_path, auth="required", embedded_worker=False, submit_rate_per_minute=3, **extra)
    app = create_app(settings)
    with TestClient(app) as client:
        yield app, client


def _key(app, tenant: str) -> dict[str, str]:
    import uuid

    from service.auth.keys import create_api_key

    with app.state.session_factory() as session:
        key, _ = create_api_key(session, f"{tenant}-{uuid.uuid4().hex[:8]}", "test")
        session.commit()
    return {"X-API-Key": key}


def _submit(client, headers, alpha: float):
    return client.post(
        "/optimize", headers=headers, files={"model": ("m.onnx", tiny_onnx(alpha))}, data={"spec": '{"target":"cpu-ort"}'}
    )


def _fresh_window(margin_s: float = 15.0) -> None:
    """Wait for the next one-minute window (``ratelimit``: aligned to the clock's minutes) when fewer than
    ``margin_s`` seconds are left in this one, so that the submits that follow all count in one window. A
    minute turning between them (two submits in one window, two in the next) failed the test once."""
    left = WINDOW_S - time.time() % WINDOW_S
    if left < margin_s:
        time.sleep(left + 0.2)


def test_past_the_rate_a_tenant_gets_429_with_retry_after(limited):
    app, client = limited
    first, second = _key(app, "a"), _key(app, "b")
    _fresh_window()
    statuses = [_submit(client, first, 0.1 * n).status_code for n in range(1, 5)]
    assert statuses == [202, 202, 202, 429]
    refused = _submit(client, first, 0.9)
    assert refused.status_code == 429
    body = refused.json()["error"]
    assert body["code"] == "rate_limited" and body["details"]["limit_per_minute"] == 3
    assert 1 <= int(refused.headers["Retry-After"]) <= 61
    assert _submit(client, second, 0.5).status_code == 202  # another tenant is not affected
