"""A database outage answers 503 with Retry-After (never 500), /healthz names the dependency that is down,
and the API serves again within seconds of the database's return, without a restart.

The outage is real: the app reaches PostgreSQL through a TCP relay on loopback, and the test cuts the
relay (open connections reset, new ones refused) and restores it, as a restarting database server looks
from the API's side, without stopping the PostgreSQL server the other tests share."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import make_url

from tests.relay import Relay

pytestmark = pytest.mark.services


@pytest.fixture
def relayed_app(pg_database_url, tmp_path):
    from service.core.config import Settings
    from stack import create_app

    url = make_url(pg_database_url)
    relay = Relay((url.host or "127.0.0.1", url.port or 5432))
    settings = Settings(
        data_dir=tmp_path,
        database_url=url.set(host="127.0.0.1", port=relay.port).render_as_string(hide_password=False),
        auth="required",
        embedded_worker=False,
    )
    app = create_app(settings)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            yield relay, app, client
    finally:
        relay.close()


def _key(app) -> dict[str, str]:
    from service.auth.keys import create_api_key

    with app.state.session_factory() as session:
        key, _ = create_api_key(session, "outage-tenant", "test")
        session.commit()
    return {"X-API-Key": key}


def test_database_outage_is_503_then_recovers_without_restart(relayed_app):
    relay, app, client = relayed_app
    headers = _key(app)
    assert client.get("/jobs", headers=headers).status_code == 200
    assert client.get("/healthz").json()["dependencies"]["database"] == "ok"

    relay.cut()
    for path in ("/jobs", "/jobs/0123456789abcdef0123456789abcdef", "/cache/stats"):
        response = client.get(path, headers=headers)
        assert response.status_code == 503, (path, response.status_code, response.text)
        assert response.headers["Retry-After"].isdigit()
        assert response.json()["error"]["code"] == "database_unavailable"
    submit = client.post(
        "/optimize", headers=headers, files={"model": ("m.onnx", b"x")}, data={"spec": '{"target":"cpu-ort"}'}
    )
    assert submit.status_code == 503, submit.text
    health = client.get("/healthz")
    assert health.status_code == 200  # the process is alive; it says what is not
    assert health.json()["status"] == "degraded"
    assert health.json()["dependencies"]["database"].startswith("down:")

    relay.restore()
    deadline = time.monotonic() + 10
    while client.get("/jobs", headers=headers).status_code != 200:
        assert time.monotonic() < deadline, "the API did not serve again within 10 s of the database's return"
        time.sleep(0.2)
    assert client.get("/healthz").json()["status"] == "ok"
