"""Cache statistics: the kernel cache (durable entries, hit/miss counters) and the whole-job cache.

A tenant sees its own counters: the kernel-cache hits, misses and time saved of its own jobs, and its own
whole-job cache hits. Its hits are hits on kernels its own earlier jobs compiled (each tenant has a kernel
cache of its own, ``workers/cache_backends.py``), so no figure here tells of another tenant's layers. An operator (``Authorization: Bearer <FLEXDSA_OPERATOR_TOKEN>``) sees the service-wide
totals, the durable entry count and every tenant's jobs together. ``scope`` says which view answered.
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from sqlalchemy import func, select

from service.cache.schemas import CacheStatsOut, JobCacheStats, KernelCacheStats
from service.cache.stats import is_stats_row, read_cache_stats, stats_redis_key
from service.core.models import Job, KernelCacheEntry
from service.core.schemas import ERROR_RESPONSES
from service.deps import SessionDep, SettingsDep, TenantUnlessOperator

log = logging.getLogger("flexdsa.service")

router = APIRouter(tags=["cache"], responses=ERROR_RESPONSES)


def _redis_counters(redis_client, tenant_id: int | None) -> dict | None:
    """Counters as the workers wrote them (HINCRBY hits / misses, HINCRBYFLOAT seconds_saved)."""
    if redis_client is None:
        return None
    try:
        raw = redis_client.hgetall(stats_redis_key(tenant_id))
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


def _kernel_stats(request: Request, session, settings, tenant_id: int | None) -> KernelCacheStats:
    entries = stored_hits = None
    if tenant_id is None:  # the durable entries are shared by every tenant: an operator's figure
        entries, stored_hits = session.execute(
            select(func.count(), func.coalesce(func.sum(KernelCacheEntry.hits), 0)).where(
                ~is_stats_row(KernelCacheEntry.key)
            )
        ).one()
    counters = _redis_counters(request.app.state.redis, tenant_id)
    if counters is None:  # embedded mode: the workers keep their totals in the database
        counters = read_cache_stats(settings, tenant_id=tenant_id)
    return KernelCacheStats(
        entries=entries,
        stored_hits=int(stored_hits) if stored_hits is not None else None,
        hits=int(counters.get("hits", 0)),
        misses=int(counters.get("misses", 0)),
        seconds_saved=float(counters.get("seconds_saved", 0.0)),
        redis=counters if request.app.state.redis is not None else None,
    )


@router.get(
    "/cache/stats",
    response_model=CacheStatsOut,
    summary="Kernel cache and whole-job cache statistics: a tenant's own, or service-wide for operators",
)
def cache_stats(
    request: Request, tenant: TenantUnlessOperator, session: SessionDep, settings: SettingsDep
) -> CacheStatsOut:
    tenant_id = tenant.id if tenant is not None else None
    jobs = select(func.count(Job.cached_from_job_id), func.count())
    if tenant_id is not None:
        jobs = jobs.where(Job.tenant_id == tenant_id)
    job_hits, job_total = session.execute(jobs).one()
    return CacheStatsOut(
        scope="service" if tenant_id is None else "tenant",
        kernel_cache=_kernel_stats(request, session, settings, tenant_id),
        job_cache=JobCacheStats(hits=job_hits, jobs=job_total),
    )
