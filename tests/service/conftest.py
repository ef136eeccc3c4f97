"""Service test fixtures: the app on real PostgreSQL (with Redis) and on SQLite (the embedded path).

Tests that take ``env`` run once per backend. Each test gets its own tenants (unique names), so tests
share one database per session without seeing each other's jobs.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

# Operator surfaces (/metrics, service-wide /cache/stats) answer this bearer token in the test apps.
OPERATOR_TOKEN = "operator-token-for-the-service-tests"
OPERATOR_HEADERS = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


def tiny_onnx(alpha: float = 0.1) -> bytes:
    from onnx import TensorProto, helper

    node = helper.make_node("LeakyRelu", ["x"], ["y"], alpha=alpha)
    graph = helper.make_graph(
        [node],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9
    ).SerializeToString()


@dataclass
class ServiceEnv:
    backend: str
    settings: object
    app: object
    client: TestClient
    enqueued: list[str] = field(default_factory=list)

    @property
    def sessions(self):
        return self.app.state.session_factory

    @property
    def store(self):
        return self.app.state.store

    def new_key(self, tenant: str | None = None, max_queued_jobs: int | None = None) -> dict[str, str]:
        """A new tenant (unique name unless given) and its key, as request headers."""
        from service.auth.keys import create_api_key

        tenant = tenant or f"t-{uuid.uuid4().hex[:10]}"
        with self.sessions() as session:
            key, row = create_api_key(session, tenant, "test")
            row.tenant.max_queued_jobs = max_queued_jobs
            session.commit()
        return {"X-API-Key": key}

    def submit(
        self,
        headers,
        model: bytes | None = None,
        spec: dict | str | None = None,
        idempotency_key: str | None = None,
        filename: str = "model.onnx",
        client=None,
    ):
        spec = spec if spec is not None else {"target": "cpu-ort"}
        spec_text = spec if isinstance(spec, str) else json.dumps(spec)
        headers = dict(headers)
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        return (client or self.client).post(
            "/optimize",
            headers=headers,
            files={"model": (filename, tiny_onnx() if model is None else model, "application/octet-stream")},
            data={"spec": spec_text},
        )

    def job(self, job_id: str):
        from service.core.models import Job

        with self.sessions() as session:
            job = session.get(Job, job_id)
            job.events, job.artifacts  # noqa: B018 - load before the session closes
            return job

    def finish(
        self,
        job_id: str,
        status: str = "succeeded",
        artifacts: dict[str, bytes] | None = None,
        report: dict | None = None,
    ) -> None:
        """Play the worker: end the job and store its artifacts."""
        from service.core.models import Artifact, Job, utcnow

        with self.sessions() as session:
            job = session.get(Job, job_id)
            job.status, job.stage, job.progress = status, "done", 1.0
            job.started_at = job.started_at or utcnow()
            job.finished_at = utcnow()
            job.report_summary = report or {"nodes_before": 3, "nodes_after": 2}
            for name, data in (artifacts or {}).items():
                key = self.store.put_bytes(data)
                content_type = "application/zip" if name.endswith(".zip") else "application/json"
                session.add(
                    Artifact(
                        job_id=job_id, name=name, blob_key=key, size=len(data), content_type=content_type
                    )
                )
            job.record(status, "finished by the test")
            session.commit()


@pytest.fixture(scope="session", params=[pytest.param("postgres", marks=pytest.mark.services), "sqlite"])
def service_env(request, tmp_path_factory):
    from service.core.config import Settings

    data_dir = tmp_path_factory.mktemp(f"service-{request.param}")
    if request.param == "postgres":
        pg_url = request.getfixturevalue("pg_database_url")
        redis_url = request.getfixturevalue("redis_url")
        settings = Settings(
            data_dir=data_dir,
            database_url=pg_url,
            redis_url=redis_url,
            auth="required",
            embedded_worker=False,
            max_queued_jobs_per_tenant=20,
            operator_token=SecretStr(OPERATOR_TOKEN),
        )
    else:
        settings = Settings(
            data_dir=data_dir, auth="required", embedded_worker=False, operator_token=SecretStr(OPERATOR_TOKEN)
        )
    from stack import create_app

    app = create_app(settings)
    with TestClient(app) as client:
        yield ServiceEnv(backend=request.param, settings=settings, app=app, client=client)


@pytest.fixture
def env(service_env, monkeypatch) -> ServiceEnv:
    """The service on this backend; ``env.enqueued`` collects the ids handed to the workers."""
    import service.jobs.service

    service_env.enqueued = []
    monkeypatch.setattr(service.jobs.service, "enqueue", lambda job_id, settings: service_env.enqueued.append(job_id))
    return service_env


@pytest.fixture
def headers(env) -> dict[str, str]:
    return env.new_key()
