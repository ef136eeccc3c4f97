"""Prometheus metrics, one registry per app (so several apps in one test process never collide).

Jobs by status are read from the database at scrape time: the database is the source of truth, and
workers on other machines change it, so a counter kept in this process would be wrong.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from sqlalchemy import func, select

from service.models import Job, JobStatus

log = logging.getLogger("flexdsa.service")


class _JobsByStatus:
    def __init__(self, session_factory) -> None:
        self.session_factory = session_factory

    def describe(self):
        return [GaugeMetricFamily("flexdsa_jobs", "Jobs by status (all tenants)", labels=["status"])]

    def collect(self):
        family = GaugeMetricFamily("flexdsa_jobs", "Jobs by status (all tenants)", labels=["status"])
        counts = {status.value: 0 for status in JobStatus}
        try:
            with self.session_factory() as session:
                counts.update(
                    dict(session.execute(select(Job.status, func.count()).group_by(Job.status)).all())
                )
        except Exception as err:  # a scrape must not fail because the database is down
            log.warning("metrics: cannot count jobs: %s", err)
            return
        for status, count in sorted(counts.items()):
            family.add_metric([status], count)
        yield family


class Metrics:
    def __init__(self, session_factory) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "flexdsa_http_requests", "HTTP requests", ["method", "route", "status"], registry=self.registry
        )
        self.request_seconds = Histogram(
            "flexdsa_http_request_seconds",
            "HTTP request duration",
            ["method", "route"],
            registry=self.registry,
        )
        self.upload_bytes = Counter("flexdsa_upload_bytes", "Model bytes received", registry=self.registry)
        self.jobs_submitted = Counter(
            "flexdsa_jobs_submitted", "Jobs submitted", ["cached"], registry=self.registry
        )
        self.registry.register(_JobsByStatus(session_factory))


class MetricsMiddleware:
    """Pure ASGI (not BaseHTTPMiddleware), so streamed responses (SSE, downloads) pass through untouched.
    Routes are labelled by their template (``/jobs/{job_id}``), never the raw path."""

    def __init__(self, app, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status_holder = {"status": 500}

        async def send_wrapper(message):
            if message["type"] == "http.response.start":
                status_holder["status"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            method = scope.get("method", "")
            self.metrics.requests.labels(method, route, str(status_holder["status"])).inc()
            self.metrics.request_seconds.labels(method, route).observe(time.perf_counter() - started)
