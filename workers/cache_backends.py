"""The service's kernel-cache layers and their statistics.

``build_kernel_cache(settings, tenant_id=...)`` stacks ``LRU -> Redis -> Postgres`` (distributed) or
``LRU -> SQL table`` (embedded, the same ``kernel_cache`` table on SQLite). Every backend honours the core's
contract: a cache that is down is a cache that misses, so ``get``/``put`` log the outage and never raise.
After a backend call fails, that layer is skipped for ``retry_after_s`` so a dead Redis costs one timeout,
not one per kernel.

Each tenant has a cache of its own (every key a job reads or writes carries its tenant, ``tenant_key``):
a hit on a kernel another tenant compiled would tell a tenant, through its job's report and its statistics
(or the time its job took), which layer shapes that other tenant works on; and one tenant's entries can
never answer another's job. Identical layers of one tenant's models still share one entry.

Statistics (hits, misses, puts, seconds saved) are counted per job by ``MeteredCache`` in the pipeline
process and added to the shared totals by ``service.cache.stats.record_cache_stats``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from flexdsa_core.cache import LayeredCache, LRUCache
from service.cache.stats import insert_ignoring_duplicates

log = logging.getLogger(__name__)

KERNEL_KEY_PREFIX = "flexdsa:kernel:"
DEFAULT_REDIS_TTL_S = 7 * 24 * 3600
LRU_ENTRIES = 4096


class _Breaker:
    """Skips a backend for a while after it failed, so an outage costs one timeout per window."""

    def __init__(self, name: str, retry_after_s: float) -> None:
        self.name = name
        self.retry_after_s = retry_after_s
        self._open_until = 0.0
        self._lock = threading.Lock()

    def allows(self) -> bool:
        return time.monotonic() >= self._open_until

    def trip(self, action: str, err: BaseException) -> None:
        with self._lock:
            already_open = time.monotonic() < self._open_until
            self._open_until = time.monotonic() + self.retry_after_s
        if not already_open:
            log.warning(
                "kernel cache layer %s unavailable (%s: %s); treating it as a miss for %.0f s",
                self.name,
                action,
                err,
                self.retry_after_s,
            )


class RedisCache:
    """The hot layer: kernel entries in Redis with an expiry (refreshed on every put)."""

    name = "redis"

    def __init__(
        self,
        url: str,
        ttl_s: int = DEFAULT_REDIS_TTL_S,
        *,
        timeout_s: float = 1.0,
        retry_after_s: float = 10.0,
    ) -> None:
        import redis

        self.ttl_s = ttl_s
        self._client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._breaker = _Breaker(self.name, retry_after_s)

    def get(self, key: str) -> bytes | None:
        if not self._breaker.allows():
            return None
        try:
            return self._client.get(KERNEL_KEY_PREFIX + key)
        except Exception as err:  # a down cache is a miss, whatever the client raised
            self._breaker.trip("get", err)
            return None

    def put(self, key: str, value: bytes) -> None:
        if not self._breaker.allows():
            return
        try:
            self._client.set(KERNEL_KEY_PREFIX + key, value, ex=self.ttl_s)
        except Exception as err:
            self._breaker.trip("put", err)


class PostgresCache:
    """The durable layer: the ``kernel_cache`` table (Postgres in distributed mode, SQLite embedded).

    A hit bumps ``hits``/``last_hit_at`` so an operator can see which kernels earn their keep and prune
    the rest by ``last_hit_at``.
    """

    name = "postgres"

    def __init__(self, session_factory: Callable[[], Any], *, retry_after_s: float = 10.0) -> None:
        self._sessions = session_factory
        self._breaker = _Breaker(self.name, retry_after_s)

    def get(self, key: str) -> bytes | None:
        from sqlalchemy import select, update

        from service.core.models import KernelCacheEntry, utcnow

        if not self._breaker.allows():
            return None
        try:
            with self._sessions() as session, session.begin():
                value = session.scalar(select(KernelCacheEntry.value).where(KernelCacheEntry.key == key))
                if value is not None:
                    session.execute(
                        update(KernelCacheEntry)
                        .where(KernelCacheEntry.key == key)
                        .values(hits=KernelCacheEntry.hits + 1, last_hit_at=utcnow())
                    )
                return bytes(value) if value is not None else None
        except Exception as err:
            self._breaker.trip("get", err)
            return None

    def put(self, key: str, value: bytes) -> None:
        if not self._breaker.allows():
            return
        try:
            with self._sessions() as session, session.begin():
                session.execute(insert_ignoring_duplicates(session, key, value))
        except Exception as err:
            self._breaker.trip("put", err)


def tenant_key(tenant_id: int | None, key: str) -> str:
    """The key the layers store ``key`` under for ``tenant_id`` (None: no tenant, tests and tools)."""
    return key if tenant_id is None else f"tenant:{int(tenant_id)}:{key}"


class MeteredCache(LayeredCache):
    """``LayeredCache`` kept to one tenant's entries (``tenant_key``) that also accepts ``saved(seconds)``
    from the core, for the time-saved statistic."""

    def __init__(self, *layers, tenant_id: int | None) -> None:
        super().__init__(*layers)
        self.tenant_id = tenant_id

    def get(self, key: str) -> bytes | None:
        return super().get(tenant_key(self.tenant_id, key))

    def put(self, key: str, value: bytes) -> None:
        super().put(tenant_key(self.tenant_id, key), value)

    def saved(self, seconds: float) -> None:
        self.stats.seconds_saved += max(0.0, float(seconds))


def build_kernel_cache(
    settings, session_factory: Callable[[], Any] | None = None, *, tenant_id: int | None
) -> MeteredCache:
    """The kernel cache a job of ``tenant_id`` uses: LRU -> Redis -> SQL table (Redis only when configured),
    holding that tenant's entries only. ``tenant_id=None`` (no tenant: tests and tools) is one cache shared
    by every such caller, never by a tenant's job."""
    from service.core.db import session_factory_for

    layers: list = [LRUCache(LRU_ENTRIES)]
    if settings.redis_url:
        ttl_s = settings.kernel_cache_ttl_s
        layers.append(RedisCache(settings.redis_url, ttl_s))
    layers.append(PostgresCache(session_factory or session_factory_for(settings)))
    return MeteredCache(*layers, tenant_id=tenant_id)


# --- statistics ---------------------------------------------------------------------------------------
