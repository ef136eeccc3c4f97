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

from service.core.models import Job, JobStatus

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


RECENT_S = 3600  # job durations and stage times are over the jobs that finished in the last hour
RECENT_JOBS = 1000


class _JobOutcomes:
    """Failures by error code, and job and stage durations of recently finished jobs, read at scrape time
    from the database (workers on other machines write them there)."""

    def __init__(self, session_factory) -> None:
        self.session_factory = session_factory

    def describe(self):
        return []

    def collect(self):
        from datetime import timedelta

        from service.core.models import JobEvent, utcnow

        try:
            with self.session_factory() as session:
                code = Job.error["code"].as_string()
                failures = session.execute(
                    select(code, func.count()).where(Job.status == JobStatus.failed.value).group_by(code)
                ).all()
                since = utcnow() - timedelta(seconds=RECENT_S)
                recent = session.execute(
                    select(Job.id, Job.status, Job.started_at, Job.finished_at)
                    .where(Job.finished_at >= since, Job.started_at.is_not(None), Job.cached_from_job_id.is_(None))
                    .order_by(Job.finished_at.desc())
                    .limit(RECENT_JOBS)
                ).all()
                events = session.execute(
                    select(JobEvent.job_id, JobEvent.stage, JobEvent.at)
                    .where(JobEvent.job_id.in_([r.id for r in recent]))
                    .order_by(JobEvent.job_id, JobEvent.at, JobEvent.id)
                ).all() if recent else []
        except Exception as err:  # a scrape must not fail because the database is down
            log.warning("metrics: cannot read job outcomes: %s", err)
            return
        failed = GaugeMetricFamily("flexdsa_jobs_failed_by_code", "Failed jobs by error code", labels=["code"])
        for error_code, count in sorted(failures, key=lambda row: str(row[0])):
            failed.add_metric([str(error_code or "unknown")], count)
        yield failed
        durations = GaugeMetricFamily(
            "flexdsa_job_seconds_recent", "Run time of jobs finished in the last hour", labels=["status", "stat"]
        )
        by_status: dict[str, list[float]] = {}
        for row in recent:
            by_status.setdefault(row.status, []).append((row.finished_at - row.started_at).total_seconds())
        for status, values in sorted(by_status.items()):
            for stat, value in (("mean", sum(values) / len(values)), ("max", max(values)), ("count", len(values))):
                durations.add_metric([status, stat], value)
        yield durations
        stages = GaugeMetricFamily(
            "flexdsa_stage_seconds_recent",
            "Total time spent per pipeline stage by jobs finished in the last hour (from their progress events)",
            labels=["stage"],
        )
        totals: dict[str, float] = {}
        previous = None
        for job_id, stage, at in events:
            if previous is not None and previous[0] == job_id and previous[1]:
                totals[previous[1]] = totals.get(previous[1], 0.0) + (at - previous[2]).total_seconds()
            previous = (job_id, stage, at)
        for stage, seconds in sorted(totals.items()):
            stages.add_metric([stage], seconds)
        yield stages


class _KernelCache:
    def __init__(self, read_stats) -> None:
        self.read_stats = read_stats

    def describe(self):
        return []

    def collect(self):
        try:
            stats = self.read_stats()
        except Exception as err:
            log.warning("metrics: cannot read cache stats: %s", err)
            return
        family = GaugeMetricFamily("flexdsa_kernel_cache", "Kernel cache counters (service-wide)", labels=["stat"])
        for stat in ("hits", "misses", "hit_rate", "seconds_saved"):
            if stats.get(stat) is not None:
                family.add_metric([stat], float(stats[stat]))
        yield family


class Metrics:
    def __init__(self, session_factory, read_cache_stats=None) -> None:
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
        self.registry.register(_JobsByStatus(session_factory))  # queue depth: flexdsa_jobs{status="queued"}
        self.registry.register(_JobOutcomes(session_factory))
        if read_cache_stats is not None:
            self.registry.register(_KernelCache(read_cache_stats))


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
