"""The kernel cache interface, and the in-process LRU layer.

A kernel's key is ``kernel_key(canonical_form, target, compiler_version)``: a hash of what the kernel
computes (ops, attributes, shapes, dtypes; never weight values), so identical layers in one model and
across jobs share one entry. The target part is the spec's name, version and the hash of its whole content
(``TargetSpec.content_sha256``), never the name alone: a custom spec that shares a built-in's name and
version but not its figures never reads (nor writes) the built-in's entries. Values are opaque bytes (the
core stores JSON). The service stacks ``LRUCache -> Redis -> Postgres`` with ``LayeredCache``; the core only
ever sees ``KernelCache``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    puts: int = 0
    seconds_saved: float = 0.0
    by_layer: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {
            "hits": self.hits,
            "misses": self.misses,
            "puts": self.puts,
            "seconds_saved": round(self.seconds_saved, 6),
            "hits_by_layer": dict(self.by_layer),
        }


class TargetIdentity(Protocol):
    """What a cache key takes of a target (``TargetSpec`` is one)."""

    name: str
    version: str

    @property
    def content_sha256(self) -> str: ...


@runtime_checkable
class KernelCache(Protocol):
    """What the core needs of a cache. ``get`` returns None on a miss; neither method may raise on a
    backend outage (a cache that is down is a cache that misses)."""

    name: str

    def get(self, key: str) -> bytes | None: ...

    def put(self, key: str, value: bytes) -> None: ...


class NullCache:
    name = "none"

    def get(self, key: str) -> bytes | None:
        return None

    def put(self, key: str, value: bytes) -> None:
        return None


class LRUCache:
    """Thread-safe in-process LRU bounded by entry count."""

    name = "lru"

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, bytes] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> bytes | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: str, value: bytes) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class DiskCache:
    """One file per entry under ``folder`` (sharded by key hash, written atomically): the CLI's cache, so
    kernel measurements made on this machine are made once, not on every ``flexdsa optimize``."""

    name = "disk"

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def _path(self, key: str) -> Path:
        digest = hashlib.sha256(key.encode()).hexdigest()
        return self.folder / digest[:2] / digest

    def get(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except OSError:
            return None

    def put(self, key: str, value: bytes) -> None:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as handle:
                handle.write(value)
            os.replace(handle.name, path)
        except OSError:  # a cache that cannot write is a cache that misses next time
            return


class LayeredCache:
    """Looks layers up in order (fastest first); a hit in a slow layer is written back to the faster ones."""

    name = "layered"

    def __init__(self, *layers: KernelCache) -> None:
        self.layers = list(layers)
        self.stats = CacheStats()

    def get(self, key: str) -> bytes | None:
        for depth, layer in enumerate(self.layers):
            value = layer.get(key)
            if value is not None:
                self.stats.hits += 1
                self.stats.by_layer[layer.name] = self.stats.by_layer.get(layer.name, 0) + 1
                for faster in self.layers[:depth]:
                    faster.put(key, value)
                return value
        self.stats.misses += 1
        return None

    def put(self, key: str, value: bytes) -> None:
        self.stats.puts += 1
        for layer in self.layers:
            layer.put(key, value)


class StatsCache:
    """Wraps any cache to count hits, misses and the seconds hits saved (callers report ``saved``)."""

    def __init__(self, inner: KernelCache) -> None:
        self.inner = inner
        self.name = inner.name
        self.stats = CacheStats()

    def get(self, key: str) -> bytes | None:
        value = self.inner.get(key)
        if value is None:
            self.stats.misses += 1
        else:
            self.stats.hits += 1
        return value

    def put(self, key: str, value: bytes) -> None:
        self.stats.puts += 1
        self.inner.put(key, value)

    def saved(self, seconds: float) -> None:
        self.stats.seconds_saved += seconds


def kernel_key(canonical: dict | str, target: TargetIdentity | None, compiler_version: str) -> str:
    """Cache key of one kernel. ``canonical`` must hold ops, attributes, shapes and dtypes, no weights;
    ``target`` is the spec the figure is for (its whole content is in the key), None only for a figure that
    holds on any target (a shape probe)."""
    body = canonical if isinstance(canonical, str) else json.dumps(canonical, sort_keys=True, default=str)
    scope = "any" if target is None else f"{target.name}@{target.version}#{target.content_sha256}"
    digest = hashlib.sha256(f"{scope}|{compiler_version}|{body}".encode()).hexdigest()
    return f"kernel:{digest}"
