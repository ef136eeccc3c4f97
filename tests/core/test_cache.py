"""The cache layers the core ships: LRU, layered write-back, the CLI's disk cache."""

from flexdsa_core import load_target
from flexdsa_core.cache import DiskCache, LayeredCache, LRUCache, kernel_key


def test_lru_evicts_least_recently_used():
    cache = LRUCache(max_entries=2)
    cache.put("a", b"1")
    cache.put("b", b"2")
    assert cache.get("a") == b"1"  # a is now the most recent
    cache.put("c", b"3")
    assert cache.get("b") is None and cache.get("a") == b"1" and cache.get("c") == b"3"


def test_layered_cache_writes_slow_hits_back_and_counts(tmp_path):
    fast, slow = LRUCache(), DiskCache(tmp_path)
    slow.put("k", b"v")
    layered = LayeredCache(fast, slow)
    assert layered.get("k") == b"v" and fast.get("k") == b"v"
    assert layered.get("missing") is None
    assert layered.stats.hits == 1 and layered.stats.misses == 1 and layered.stats.by_layer == {"disk": 1}


def test_disk_cache_survives_a_new_instance_and_misses_when_unwritable(tmp_path):
    DiskCache(tmp_path).put("kernel:x", b"measured")
    assert DiskCache(tmp_path).get("kernel:x") == b"measured"
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    unwritable = DiskCache(blocked)
    unwritable.put("kernel:y", b"z")  # must not raise
    assert unwritable.get("kernel:y") is None


def test_kernel_key_depends_on_target_and_compiler_version():
    canonical = {"op": "MatMul", "shapes": [[1, 128, 768], [768, 768]]}
    cpu = load_target("cpu-ort")
    base = kernel_key(canonical, cpu, "0.1.0")
    assert base == kernel_key(dict(canonical), cpu, "0.1.0")
    assert base != kernel_key(canonical, cpu.model_copy(update={"version": "2"}), "0.1.0")
    assert base != kernel_key(canonical, cpu, "0.2.0")
    assert base != kernel_key(canonical, None, "0.1.0")  # a figure for any target is kept apart
