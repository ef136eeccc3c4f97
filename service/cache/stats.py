"""Kernel-cache statistics, written by the workers and read by the API and the operators' views.

Hits, misses, puts and seconds saved are counted per job by the pipeline's cache and added here to shared
totals (``record_cache_stats``): the Redis hash ``flexdsa:cache:stats`` when Redis is configured, else a
reserved row of the ``kernel_cache`` table. Each job's figures are also added to its tenant's own total
(``flexdsa:cache:stats:tenant:<id>``, or the reserved row with that suffix), so ``GET /cache/stats`` shows a
tenant its own counters and an operator the service-wide ones. A tenant's hits are on its own jobs' entries
only (the kernel cache is kept per tenant, ``workers.cache_backends.tenant_key``). Part of the service's
persistence layer, so that the API reads what the workers write without importing the workers.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

STATS_KEY = "flexdsa:cache:stats"
# The embedded-mode stats live in the kernel_cache table under a key no kernel can have (kernel keys
# start with "kernel:").
SQL_STATS_ROW = "__flexdsa_cache_stats__"


def insert_ignoring_duplicates(session, key: str, value: bytes):
    """INSERT ... ON CONFLICT DO NOTHING: two workers measuring the same kernel at once both succeed."""
    from service.core.models import KernelCacheEntry

    if session.get_bind().dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return (
        insert(KernelCacheEntry).values(key=key, value=value).on_conflict_do_nothing(index_elements=["key"])
    )



_COUNTERS = ("hits", "misses", "puts")


def stats_redis_key(tenant_id: int | None = None) -> str:
    return STATS_KEY if tenant_id is None else f"{STATS_KEY}:tenant:{int(tenant_id)}"


def stats_sql_row(tenant_id: int | None = None) -> str:
    return SQL_STATS_ROW if tenant_id is None else f"{SQL_STATS_ROW}:tenant:{int(tenant_id)}"


def is_stats_row(key_column):
    """SQL condition: the row holds statistics (service-wide or a tenant's), not a kernel."""
    return key_column.startswith(SQL_STATS_ROW, autoescape=True)


def record_cache_stats(
    settings, stats: dict, session_factory: Callable[[], Any] | None = None, tenant_id: int | None = None
) -> None:
    """Add one job's cache statistics (``CacheStats.as_dict()``) to the service-wide totals, and to its
    tenant's when ``tenant_id`` is given. Never raises."""
    increments = {name: int(stats.get(name) or 0) for name in _COUNTERS}
    seconds_saved = float(stats.get("seconds_saved") or 0.0)
    by_layer = {f"hits_{layer}": int(n) for layer, n in (stats.get("hits_by_layer") or {}).items()}
    if not any(increments.values()) and not seconds_saved:
        return
    try:
        scopes = [None] if tenant_id is None else [None, tenant_id]
        if settings.redis_url:
            _record_in_redis(settings.redis_url, increments | by_layer, seconds_saved, scopes)
        else:
            sessions = session_factory or _default_sessions(settings)
            for scope in scopes:
                _record_in_sql(sessions, increments | by_layer, seconds_saved, stats_sql_row(scope))
    except Exception as err:
        log.warning("could not record kernel cache statistics (%s); they are lost for this job", err)


def read_cache_stats(
    settings, session_factory: Callable[[], Any] | None = None, tenant_id: int | None = None
) -> dict:
    """Service-wide totals (or one tenant's, with ``tenant_id``): hits, misses, puts, hit_rate, seconds_saved,
    hits_by_layer, and entries (durable, service-wide; None in a tenant's view, which holds only its own)."""
    totals: dict[str, Any] = {}
    try:
        if settings.redis_url:
            import redis

            client = redis.Redis.from_url(settings.redis_url, socket_timeout=2, socket_connect_timeout=2)
            totals = {k.decode(): v.decode() for k, v in client.hgetall(stats_redis_key(tenant_id)).items()}
        else:
            totals = _read_sql_stats(session_factory or _default_sessions(settings), stats_sql_row(tenant_id))
    except Exception as err:
        log.warning("could not read kernel cache statistics: %s", err)
    if tenant_id is not None:
        return _shape_stats(totals, None)
    return _shape_stats(totals, _count_entries(session_factory or _default_sessions(settings)))


def _shape_stats(raw: dict, entries: int | None) -> dict:
    hits, misses = int(float(raw.get("hits", 0))), int(float(raw.get("misses", 0)))
    return {
        "hits": hits,
        "misses": misses,
        "puts": int(float(raw.get("puts", 0))),
        "hit_rate": round(hits / (hits + misses), 4) if hits + misses else 0.0,
        "seconds_saved": round(float(raw.get("seconds_saved", 0.0)), 3),
        "hits_by_layer": {
            k.removeprefix("hits_"): int(float(v)) for k, v in raw.items() if k.startswith("hits_")
        },
        "entries": entries,
    }


def _record_in_redis(url: str, increments: dict[str, int], seconds_saved: float, scopes: list) -> None:
    import redis

    client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
    pipe = client.pipeline(transaction=True)
    for key in (stats_redis_key(scope) for scope in scopes):
        for name, n in increments.items():
            if n:
                pipe.hincrby(key, name, n)
        if seconds_saved:
            pipe.hincrbyfloat(key, "seconds_saved", seconds_saved)
    pipe.execute()


def _record_in_sql(session_factory, increments: dict[str, int], seconds_saved: float, row_key: str) -> None:
    from sqlalchemy import select

    from service.core.models import KernelCacheEntry

    with session_factory() as session, session.begin():
        session.execute(insert_ignoring_duplicates(session, row_key, b"{}"))
        # Row lock on Postgres; SQLite serialises writers anyway.
        row = session.scalar(
            select(KernelCacheEntry).where(KernelCacheEntry.key == row_key).with_for_update()
        )
        totals = json.loads(bytes(row.value) or b"{}")
        for name, n in increments.items():
            totals[name] = int(totals.get(name, 0)) + n
        totals["seconds_saved"] = float(totals.get("seconds_saved", 0.0)) + seconds_saved
        row.value = json.dumps(totals).encode()


def _read_sql_stats(session_factory, row_key: str = SQL_STATS_ROW) -> dict:
    from sqlalchemy import select

    from service.core.models import KernelCacheEntry

    with session_factory() as session:
        value = session.scalar(select(KernelCacheEntry.value).where(KernelCacheEntry.key == row_key))
    return json.loads(bytes(value)) if value else {}


def _count_entries(session_factory) -> int | None:
    from sqlalchemy import func, select

    from service.core.models import KernelCacheEntry

    try:
        with session_factory() as session:
            return session.scalar(
                select(func.count())
                .select_from(KernelCacheEntry)
                .where(~is_stats_row(KernelCacheEntry.key))
            )
    except Exception as err:
        log.warning("could not count kernel cache entries: %s", err)
        return None


def _default_sessions(settings):
    from service.core.db import session_factory_for

    return session_factory_for(settings)
