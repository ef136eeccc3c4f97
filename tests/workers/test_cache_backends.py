"""The kernel cache layers: real Redis and PostgreSQL, SQLite for embedded mode, and outages (a cache that
is down is a cache that misses, quickly, without raising)."""

from __future__ import annotations

import pytest

from flexdsa_core.cache import KernelCache, LRUCache
from service.cache.stats import read_cache_stats, record_cache_stats
from service.core.config import Settings
from service.core.db import session_factory_for
from workers.cache_backends import PostgresCache, RedisCache, build_kernel_cache

pytestmark = pytest.mark.services

DEAD_REDIS = "redis://127.0.0.1:1/0"


def test_layers_fill_from_the_durable_one(settings, redis_client):
    cache = build_kernel_cache(settings, tenant_id=None)
    assert isinstance(cache, KernelCache)
    assert [layer.name for layer in cache.layers] == ["lru", "redis", "postgres"]
    cache.put("kernel:a", b"1")
    assert redis_client.get("flexdsa:kernel:kernel:a") == b"1"

    fresh = build_kernel_cache(settings, tenant_id=None)  # a new pipeline process: empty LRU
    redis_client.flushdb()
    assert fresh.get("kernel:a") == b"1"  # from Postgres, written back to Redis and the LRU
    assert fresh.stats.by_layer == {"postgres": 1}
    assert redis_client.get("flexdsa:kernel:kernel:a") == b"1"
    assert fresh.get("kernel:a") == b"1" and fresh.stats.by_layer["lru"] == 1
    assert fresh.get("kernel:missing") is None and fresh.stats.misses == 1


def test_each_tenant_reads_only_its_own_entries(settings, redis_client):
    mine = build_kernel_cache(settings, tenant_id=1)
    mine.put("kernel:t", b"mine")
    assert redis_client.get("flexdsa:kernel:tenant:1:kernel:t") == b"mine"
    assert build_kernel_cache(settings, tenant_id=2).get("kernel:t") is None  # not Redis, not Postgres
    assert build_kernel_cache(settings, tenant_id=None).get("kernel:t") is None
    redis_client.flushdb()
    assert build_kernel_cache(settings, tenant_id=1).get("kernel:t") == b"mine"  # the durable layer, as 1's


def test_duplicate_puts_are_fine(settings):
    cache = PostgresCache(session_factory_for(settings))
    cache.put("kernel:b", b"first")
    cache.put("kernel:b", b"second")  # two workers measuring the same kernel at once
    assert cache.get("kernel:b") == b"first"


def test_redis_outage_is_a_fast_miss():
    """A dead Redis costs one failed call, then the layer is skipped for a while: counted at the client, not
    timed. What that saves per kernel (against a live Redis and against no breaker) is measured by
    ``python -m bench.mechanics`` (Redis outage)."""
    cache = RedisCache(DEAD_REDIS, 60)
    calls = []
    for method in ("get", "set"):
        real = getattr(cache._client, method)

        def counted(*args, _real=real, _method=method, **kwargs):
            calls.append(_method)
            return _real(*args, **kwargs)

        setattr(cache._client, method, counted)
    for n in range(50):
        assert cache.get(f"kernel:{n}") is None
        cache.put(f"kernel:{n}", b"x")
    assert calls == ["get"]  # one failed call reached Redis; the other 99 were skipped


def test_database_outage_is_a_miss(tmp_path):
    dead = Settings(database_url="postgresql+psycopg://postgres@127.0.0.1:1/none", data_dir=tmp_path)
    cache = PostgresCache(session_factory_for(dead))
    assert cache.get("kernel:x") is None
    cache.put("kernel:x", b"1")


def test_whole_stack_with_redis_down_still_works(settings):
    down = settings.model_copy(update={"redis_url": DEAD_REDIS})
    cache = build_kernel_cache(down, tenant_id=None)
    cache.put("kernel:c", b"v")
    assert build_kernel_cache(down, tenant_id=None).get("kernel:c") == b"v"


def test_stats_accumulate_in_redis(settings):
    record_cache_stats(settings, {"hits": 3, "misses": 1, "puts": 1, "seconds_saved": 0.5,
                                  "hits_by_layer": {"redis": 2, "postgres": 1}})
    record_cache_stats(settings, {"hits": 1, "misses": 0, "puts": 0, "seconds_saved": 0.25})
    stats = read_cache_stats(settings)
    assert (stats["hits"], stats["misses"], stats["puts"]) == (4, 1, 1)
    assert stats["seconds_saved"] == 0.75 and stats["hit_rate"] == 0.8
    assert stats["hits_by_layer"] == {"redis": 2, "postgres": 1}


def test_embedded_mode_uses_the_sqlite_table_for_entries_and_stats(tmp_path):
    from service.core.db import make_engine, upgrade

    embedded = Settings(data_dir=tmp_path)
    upgrade(make_engine(embedded.database_url))
    cache = build_kernel_cache(embedded, tenant_id=None)
    assert [layer.name for layer in cache.layers] == ["lru", "postgres"]
    assert isinstance(cache.layers[0], LRUCache)
    cache.put("kernel:e", b"v")
    assert build_kernel_cache(embedded, tenant_id=None).get("kernel:e") == b"v"
    record_cache_stats(embedded, {"hits": 2, "misses": 2, "seconds_saved": 1.5})
    record_cache_stats(embedded, {"hits": 1, "misses": 0})
    stats = read_cache_stats(embedded)
    assert (stats["hits"], stats["misses"], stats["seconds_saved"], stats["entries"]) == (3, 2, 1.5, 1)


def test_recording_stats_never_raises(tmp_path):
    down = Settings(database_url="postgresql+psycopg://postgres@127.0.0.1:1/none", broker_url=DEAD_REDIS,
                    redis_url=DEAD_REDIS, data_dir=tmp_path, auth="required")
    record_cache_stats(down, {"hits": 1})
    assert read_cache_stats(down)["hits"] == 0


@pytest.mark.parametrize("backend", ["redis", "sqlite"])
def test_stats_are_kept_per_tenant_beside_the_service_total(settings, tmp_path, backend):
    import random

    from service.core.db import make_engine, upgrade

    if backend == "sqlite":
        settings = Settings(data_dir=tmp_path)
        upgrade(make_engine(settings.database_url))
    before = read_cache_stats(settings)
    mine, theirs = random.sample(range(10**6, 10**7), 2)  # tenant ids no other test uses
    record_cache_stats(settings, {"hits": 3, "misses": 1, "seconds_saved": 0.5}, tenant_id=mine)
    record_cache_stats(settings, {"hits": 7, "misses": 2}, tenant_id=theirs)
    own = read_cache_stats(settings, tenant_id=mine)
    assert (own["hits"], own["misses"], own["seconds_saved"], own["entries"]) == (3, 1, 0.5, None)
    assert read_cache_stats(settings, tenant_id=theirs)["hits"] == 7
    total = read_cache_stats(settings)
    assert (total["hits"] - before["hits"], total["misses"] - before["misses"]) == (10, 3)
    assert total["entries"] == before["entries"]  # the tenants' rows are not kernels
