"""Generated requests over the whole OpenAPI document (schemathesis), with a valid tenant key and the
operator token: no route answers 5xx, whatever the parameters and bodies the schema admits (and the
negative cases schemathesis derives from it). ``python -m bench.soak`` is the place for volume; here a few
hundred requests per run keep the suite fast."""

from __future__ import annotations

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from pydantic import SecretStr

OPERATOR_TOKEN = "operator-token-for-the-fuzz-tests"
OPERATOR_PATHS = ("/metrics", "/incidents", "/incidents/{incident_id}", "/cache/stats")


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory):
    from service.auth.keys import create_api_key
    from service.core.config import Settings
    from stack import create_app

    settings_ = Settings(
        data_dir=tmp_path_factory.mktemp("fuzz"), auth="required", embedded_worker=False,
        operator_token=SecretStr(OPERATOR_TOKEN), submit_rate_per_minute=100_000, max_queued_jobs_per_tenant=100_000,
    )  # fmt: skip
    app = create_app(settings_)
    with TestClient(app):  # runs the lifespan: migrations, registries
        with app.state.session_factory() as session:
            key, _ = create_api_key(session, "fuzz", "test")
            session.commit()
        app.state.fuzz_key = key
        yield app


def test_no_generated_request_gets_a_server_error(fuzz_app):
    api = schemathesis.openapi.from_asgi("/openapi.json", fuzz_app)
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 15  # the whole API is generated for, not a corner of it
    sent = 0

    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def no_server_error(case):
            nonlocal sent
            headers = dict(case.headers or {})
            headers["X-API-Key"] = fuzz_app.state.fuzz_key  # generated keys would only test 401
            if case.path in OPERATOR_PATHS:
                headers["Authorization"] = f"Bearer {OPERATOR_TOKEN}"
            response = case.call(headers=headers)
            sent += 1
            assert response.status_code < 500, (
                f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:500]}"
            )

        no_server_error()
    print(f"schemathesis: {sent} requests over {len(operations)} operations")
    assert sent >= 100
