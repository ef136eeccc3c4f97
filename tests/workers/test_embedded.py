"""Embedded mode: the in-process worker on SQLite (no broker) and the reconciler's sweeps."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update

from service.core.config import Settings
from service.core.db import session_factory_for
from service.core.models import Job, utcnow
from service.jobs.dispatch import enqueue
from tests.workers.conftest import STANDIN, create_job, load_job, wait_status
from workers import inprocess
from workers.reconciler import reconcile_once


@pytest.fixture
def embedded(tmp_path, monkeypatch):
    from service.core.db import make_engine, upgrade

    monkeypatch.setenv("FLEXDSA_TEST_OPTIMIZER", STANDIN)
    settings = Settings(data_dir=tmp_path, lease_seconds=4, reconcile_interval_s=1)
    upgrade(make_engine(settings.database_url))
    yield settings
    inprocess.stop()


def _age(settings, job_id: str, **values) -> None:
    with session_factory_for(settings)() as session, session.begin():
        session.execute(update(Job).where(Job.id == job_id).values(**values))


def test_embedded_worker_runs_waiting_and_new_jobs(embedded):
    waiting = create_job(embedded)  # submitted while no worker ran
    inprocess.start(embedded)
    assert wait_status(embedded, waiting, {"succeeded", "failed"}, 60).status == "succeeded"
    fresh = create_job(embedded, tenant="other")
    assert enqueue(fresh, embedded) is True
    assert wait_status(embedded, fresh, {"succeeded", "failed"}, 60).status == "succeeded"
    inprocess.stop()
    assert enqueue(create_job(embedded, tenant="third"), embedded) is False  # stays queued for the next start


def test_reconciler_republishes_only_stale_jobs(embedded):
    published: list[str] = []
    fresh = create_job(embedded)
    stale = create_job(embedded, tenant="b")
    _age(embedded, stale, updated_at=utcnow() - timedelta(minutes=5))
    lapsed = create_job(embedded, tenant="c")
    _age(embedded, lapsed, status="running", lease_owner="gone", attempts=1,
         lease_expires_at=utcnow() - timedelta(seconds=30), updated_at=utcnow() - timedelta(seconds=30))
    leased = create_job(embedded, tenant="d")
    _age(embedded, leased, status="running", lease_owner="alive", attempts=1,
         lease_expires_at=utcnow() + timedelta(minutes=1), updated_at=utcnow() - timedelta(seconds=30))

    assert sorted(reconcile_once(embedded, published.append)) == sorted([stale, lapsed])
    # Taken candidates are stamped, so a second reconciler in the same interval publishes nothing.
    assert reconcile_once(embedded, published.append) == []
    # A busy broker queue means messages still flow: queued jobs are left alone, lapsed leases are not.
    _age(embedded, stale, updated_at=utcnow() - timedelta(minutes=5))
    _age(embedded, lapsed, updated_at=utcnow() - timedelta(minutes=5))
    assert reconcile_once(embedded, published.append, broker_backlog=lambda: 7) == [lapsed]
    assert fresh not in published and leased not in published
    assert load_job(embedded, fresh).status == "queued"
