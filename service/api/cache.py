"""Cache statistics: the kernel cache (durable entries, shared Redis counters) and the whole-job cache."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from sqlalchemy import func, select

from service.api.deps import CurrentTenant, SessionDep, SettingsDep
from service.models import Job, KernelCacheEntry
from service.schemas import ERROR_RESPONSES, CacheStatsOut, JobCacheStats, KernelCacheStats
from workers.cache_backends import SQL_STATS_ROW, read_cache_stats

log = logging.getLogger("flexdsa.service")

router = APIRouter(tags=["cache"], responses=ERROR_RESPONSES)

# Written by the workers' cache layers: HINCRBY hits / misses, HINCRBYFLOAT seconds_saved.
REDIS_STATS_KEY = "flexdsa:cache:stats"


def _redis_counters(redis_client) -> dict | None:
    if redis_client is None:
        return None
    try:
        raw = redis_client.hgetall(REDIS_STATS_KEY)
    except Exception as err:
        log.warning("cache stats: Redis unavailable: %s", err)
        return None
    counters = {}
    for key, value in raw.items():
        key = key.decode() if isinstance(key, bytes) else key
        value = value.decode() if isinstance(value, bytes) else value
        try:
            counters[key] = int(value)
        except ValueError:
            counters[key] = float(value)
    return counters


@router.get(
    "/cache/stats", response_model=CacheStatsOut, summary="Kernel cache and whole-job cache statistics"
)
def cache_stats(
    request: Request, tenant: CurrentTenant, session: SessionDep, settings: SettingsDep
) -> CacheStatsOut:
    entries, stored_hits = session.execute(
        select(func.count(), func.coalesce(func.sum(KernelCacheEntry.hits), 0)).where(
            KernelCacheEntry.key != SQL_STATS_ROW
        )
    ).one()
    counters = _redis_counters(request.app.state.redis)
    if counters is None:  # embedded mode: the workers keep their totals in the database
        counters = read_cache_stats(settings)
    job_hits, job_total = session.execute(
        select(func.count(Job.cached_from_job_id), func.count()).where(Job.tenant_id == tenant.id)
    ).one()
    return CacheStatsOut(
        kernel_cache=KernelCacheStats(
            entries=entries,
            stored_hits=int(stored_hits),
            hits=int(counters.get("hits", 0)) if counters is not None else None,
            misses=int(counters.get("misses", 0)) if counters is not None else None,
            seconds_saved=float(counters.get("seconds_saved", 0.0)) if counters is not None else None,
            redis=counters,
        ),
        job_cache=JobCacheStats(hits=job_hits, jobs=job_total),
    )
