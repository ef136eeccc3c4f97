"""Targets, cache stats, health/readiness, metrics, OpenAPI, router discovery, configuration and the CLI."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from typer.testing import CliRunner

from service.cache.stats import record_cache_stats
from service.core.config import Settings
from service.core.models import KernelCacheEntry
from stack import create_app
from tests.service.conftest import OPERATOR_HEADERS, tiny_onnx


def test_targets_list_and_detail(env, headers):
    targets = env.client.get("/targets", headers=headers).json()
    assert "cpu-ort" in {t["name"] for t in targets}
    detail = env.client.get("/targets/cpu-ort", headers=headers).json()
    assert detail["spec"]["name"] == "cpu-ort" and isinstance(detail["fusion_rules"], list)
    from flexdsa_core.fusions import discover_rules

    assert [r["name"] for r in detail["fusion_rules"]] == [r.name for r in discover_rules()]
    assert detail["switchable"]["fusions"] == [r.name for r in discover_rules()]
    assert "partial_shape_folding" in detail["switchable"]["passes"] and "ort_layout" in detail["switchable"]["target"]
    missing = env.client.get("/targets/quantum-toaster", headers=headers)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_target"


def test_cache_stats(env, headers):
    with env.sessions() as session:
        session.add(KernelCacheEntry(key=f"kernel:{env.backend}-stats", value=b"{}", hits=3))
        session.commit()
    tenant_id = env.job(env.submit(headers, spec={"target": "cpu-ort", "seed": 98}).json()["job_id"]).tenant_id
    # As the workers do: each job's counters go to the service total (Redis hash, or a reserved row of the
    # kernel_cache table in embedded mode) and to its tenant's.
    record_cache_stats(env.settings, {"hits": 5, "misses": 2, "seconds_saved": 1.5}, env.sessions, tenant_id)
    spec = {"target": "cpu-ort", "seed": 99}
    first = env.submit(headers, spec=spec).json()["job_id"]
    env.finish(first)
    env.submit(headers, spec=spec)
    stats = env.client.get("/cache/stats", headers=headers).json()
    assert stats["scope"] == "tenant"
    assert stats["job_cache"] == {"hits": 1, "jobs": 3}
    assert stats["kernel_cache"]["hits"] == 5 and stats["kernel_cache"]["seconds_saved"] == 1.5
    assert stats["kernel_cache"]["misses"] == 2
    assert stats["kernel_cache"]["entries"] is None  # shared by all tenants: not a tenant's figure
    service = env.client.get("/cache/stats", headers=OPERATOR_HEADERS).json()
    assert service["scope"] == "service"
    assert service["kernel_cache"]["entries"] >= 1 and service["kernel_cache"]["stored_hits"] >= 3
    assert service["kernel_cache"]["hits"] >= 5 and service["job_cache"]["jobs"] >= 3


def test_healthz_and_readyz(env):
    assert env.client.get("/healthz").json()["status"] == "ok"
    ready = env.client.get("/readyz")
    assert ready.status_code == 200, ready.text
    expected = {"database", "artifact_store"} | ({"redis"} if env.settings.redis_url else set())
    assert set(ready.json()["checks"]) == expected


@pytest.mark.services
def test_readyz_fails_clearly_on_unmigrated_database(create_pg_database, tmp_path):
    url = create_pg_database(migrated=False)
    app = create_app(Settings(data_dir=tmp_path, database_url=url, auth="required", embedded_worker=False))
    response = TestClient(app).get("/readyz")  # no lifespan: start-up would refuse (next test)
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "not_ready"
    assert "flexdsa db upgrade" in error["details"]["checks"]["database"]
    assert error["details"]["checks"]["artifact_store"] == "ok"


@pytest.mark.services
def test_startup_refuses_unmigrated_postgres(create_pg_database, tmp_path):
    from service.core.db import DatabaseNotMigratedError

    url = create_pg_database(migrated=False)
    app = create_app(Settings(data_dir=tmp_path, database_url=url, auth="required", embedded_worker=False))
    with pytest.raises(DatabaseNotMigratedError, match="flexdsa db upgrade"), TestClient(app):
        pass


def test_embedded_sqlite_migrates_itself(tmp_path):
    with TestClient(create_app(Settings(data_dir=tmp_path, embedded_worker=False))) as client:
        assert client.get("/readyz").status_code == 200
    assert (tmp_path / "flexdsa.db").exists()


def test_readyz_reports_unreachable_redis_and_broker(env, tmp_path):
    settings = env.settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    response = TestClient(create_app(settings)).get("/readyz")
    assert response.status_code == 503
    checks = response.json()["error"]["details"]["checks"]
    assert checks["database"] == "ok" and checks["redis"] != "ok"


def test_health_answers_name_no_host_except_to_operators(env):
    """An unauthenticated /readyz or /healthz says which dependency failed and the kind of error, not the error
    line (it names hosts and ports of the service's network); the operator token reads the line."""
    settings = env.settings.model_copy(update={"redis_url": "redis://redis-7.internal.example:1/0"})
    client = TestClient(create_app(settings))
    for path in ("/readyz", "/healthz"):
        anonymous = client.get(path).text
        assert "redis-7.internal.example" not in anonymous, anonymous
        assert "redis" in anonymous  # which check failed is still said
        operator = client.get(path, headers=OPERATOR_HEADERS).text
        assert "redis-7.internal.example" in operator, operator


def test_metrics(env, headers):
    env.submit(headers)
    text = env.client.get("/metrics", headers=OPERATOR_HEADERS).text
    assert 'flexdsa_jobs{status="queued"}' in text
    assert "flexdsa_upload_bytes_total" in text
    assert 'flexdsa_http_requests_total{method="POST",route="/optimize",status="202"}' in text


def test_metrics_cover_failures_durations_stages_and_the_cache(env, headers):
    from datetime import timedelta

    from service.core.models import Job, JobEvent, utcnow

    job_id = env.submit(headers, model=tiny_onnx(0.77)).json()["job_id"]
    with env.sessions() as session:
        job = session.get(Job, job_id)
        start = utcnow() - timedelta(seconds=10)
        job.status, job.started_at, job.finished_at = "failed", start, start + timedelta(seconds=8)
        job.error = {"code": "run_budget_exceeded", "message": "validation ran past its budget", "details": {}}
        for offset, stage in ((0, "ingest"), (2, "fusion"), (8, "done")):
            session.add(JobEvent(job_id=job_id, kind="progress", status="running", stage=stage, progress=0.5,
                                 message=None, at=start + timedelta(seconds=offset)))  # fmt: skip
        session.commit()
    text = env.client.get("/metrics", headers=OPERATOR_HEADERS).text
    assert 'flexdsa_jobs_failed_by_code{code="run_budget_exceeded"}' in text
    assert 'flexdsa_job_seconds_recent{stat="max",status="failed"}' in text
    assert 'flexdsa_stage_seconds_recent{stage="fusion"}' in text
    assert 'flexdsa_kernel_cache{stat="hits"}' in text


def test_openapi_documents_the_contract(env):
    schema = env.client.get("/openapi.json").json()
    for path in [
        "/optimize",
        "/jobs",
        "/jobs/{job_id}",
        "/jobs/{job_id}/events",
        "/jobs/{job_id}/artifacts",
        "/jobs/{job_id}/artifacts/{name}",
        "/targets",
        "/targets/{name}",
        "/cache/stats",
        "/healthz",
        "/readyz",
        "/metrics",
    ]:
        assert path in schema["paths"], path
    body = schema["paths"]["/optimize"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert body["properties"]["spec"]["contentSchema"] == {"$ref": "#/components/schemas/RequestSpec"}
    assert "target" in schema["components"]["schemas"]["RequestSpec"]["properties"]
    assert "Tolerance" in schema["components"]["schemas"]
    assert "ErrorResponse" in schema["components"]["schemas"]
    assert env.client.get("/docs").status_code == 200


def test_routers_are_discovered():
    from service.app import discover_routers

    names = {name for name, _ in discover_routers()}
    assert {"jobs.optimize_routes", "jobs.routes", "targets.routes", "cache.routes", "health.routes"} <= names


# --- configuration ----------------------------------------------------------------------------------------


def test_embedded_defaults(tmp_path):
    settings = Settings(data_dir=tmp_path)
    assert settings.mode == "embedded" and settings.auth == "optional"
    assert settings.database_url == f"sqlite:///{(tmp_path / 'flexdsa.db').as_posix()}"
    assert settings.artifact_dir == tmp_path / "artifacts"
    assert settings.max_upload_bytes == 1024**3


def test_settings_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("FLEXDSA_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("FLEXDSA_MAX_QUEUED_JOBS_PER_TENANT", "7")
    from service.core.config import get_settings

    get_settings.cache_clear()
    try:
        assert get_settings().max_queued_jobs_per_tenant == 7 and get_settings() is get_settings()
    finally:
        get_settings.cache_clear()


def test_distributed_mode_requires_keys_and_a_shared_database():
    settings = Settings(broker_url="redis://localhost/0", database_url="postgresql+psycopg://h/db")
    assert settings.mode == "distributed" and settings.auth == "required"
    with pytest.raises(ValidationError, match="FLEXDSA_AUTH=optional is refused"):
        Settings(broker_url="redis://localhost/0", database_url="postgresql+psycopg://h/db", auth="optional")
    with pytest.raises(ValidationError, match="needs a database every worker can reach"):
        Settings(broker_url="redis://localhost/0")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"broker_visibility_timeout_s": 2000}, "must exceed FLEXDSA_JOB_HARD_TIME_LIMIT_S"),
        ({"job_soft_time_limit_s": 2100}, "must be below FLEXDSA_JOB_HARD_TIME_LIMIT_S"),
        ({"reconcile_interval_s": 60}, "must be below FLEXDSA_LEASE_SECONDS"),
    ],
)
def test_unsafe_limits_are_refused(overrides, message):
    with pytest.raises(ValidationError, match=message):
        Settings(**overrides)


# --- CLI --------------------------------------------------------------------------------------------------


def _cli():
    import typer

    from service.cli import register

    app = typer.Typer()
    register(app)
    return app


@pytest.mark.services
def test_cli_db_upgrade_and_keys_create(create_pg_database, monkeypatch, tmp_path):
    from service.auth.keys import authenticate
    from service.core.config import get_settings
    from service.core.db import check_migrated, make_engine, make_session_factory

    url = create_pg_database(migrated=False)
    monkeypatch.setenv("FLEXDSA_DATABASE_URL", url)
    monkeypatch.setenv("FLEXDSA_DATA_DIR", str(tmp_path))
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        refused = runner.invoke(_cli(), ["keys", "create", "--tenant", "acme"])
        assert refused.exit_code == 1 and "flexdsa db upgrade" in refused.output
        upgraded = runner.invoke(_cli(), ["db", "upgrade"])
        assert upgraded.exit_code == 0, upgraded.output
        engine = make_engine(url)
        check_migrated(engine)
        created = runner.invoke(_cli(), ["keys", "create", "--tenant", "acme", "--name", "ci"])
        assert created.exit_code == 0, created.output
        key = created.stdout.strip().splitlines()[0]
        with make_session_factory(engine)() as session:
            assert authenticate(session, key).name == "acme"
        engine.dispose()
    finally:
        get_settings.cache_clear()


def test_cli_worker_refuses_embedded_mode(monkeypatch, tmp_path):
    from service.core.config import get_settings

    monkeypatch.setenv("FLEXDSA_DATA_DIR", str(tmp_path))
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(_cli(), ["worker"])
        assert result.exit_code == 1 and "FLEXDSA_BROKER_URL" in result.output
    finally:
        get_settings.cache_clear()
