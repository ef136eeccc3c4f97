"""The shapes a runtime served: a bounded histogram, sent back to the service for re-specialisation.

One entry per (request dims, bucket): how many requests, their input elements and the elements after padding
(so the padding waste is sum(padded - real) / sum(real) over the entries, in input elements: what the
device computes on for nothing, before any cost model). Refused requests are counted under bucket ``None``
with their dims (a shape larger than every bucket is exactly what re-specialisation must learn).

Bounded: at most ``max_entries`` distinct entries (the service takes at most that many per push); requests of
a new shape past that are counted in ``dropped`` only. ``snapshot()`` is the body of ``POST /jobs/{id}/traffic``
and of ``flexdsa traffic push``; ``reset()`` starts a new window after a push.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAX_ENTRIES = 4096


@dataclass
class _Cell:
    count: int = 0
    elements: int = 0
    padded_elements: int = 0


class Traffic:
    def __init__(self, bundle_version: str, target: str, *, max_entries: int = MAX_ENTRIES) -> None:
        self.bundle_version = bundle_version
        self.target = target
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self._cells: dict[tuple, _Cell] = {}
            self.dropped = 0
            self.since = time.time()

    def record(self, dims: dict[str, int], bucket: str | None, elements: int, padded_elements: int) -> None:
        key = (tuple(sorted(dims.items())), bucket)
        with self._lock:
            cell = self._cells.get(key)
            if cell is None:
                if len(self._cells) >= self.max_entries:
                    self.dropped += 1
                    return
                cell = self._cells[key] = _Cell()
            cell.count += 1
            cell.elements += elements
            cell.padded_elements += padded_elements

    @property
    def requests(self) -> int:
        with self._lock:
            return sum(c.count for c in self._cells.values()) + self.dropped

    def padding_waste(self) -> float:
        """sum(padded - real) / sum(real) input elements over the served requests."""
        with self._lock:
            cells = [c for (_, bucket), c in self._cells.items() if bucket is not None]
        real = sum(c.elements for c in cells)
        return (sum(c.padded_elements for c in cells) - real) / real if real else 0.0

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            entries = [
                {
                    "dims": dict(dims),
                    "bucket": bucket,
                    "count": cell.count,
                    "elements": cell.elements,
                    "padded_elements": cell.padded_elements,
                }
                for (dims, bucket), cell in sorted(
                    self._cells.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")
                )
            ]
            return {
                "bundle_version": self.bundle_version,
                "target": self.target,
                "since": self.since,
                "until": time.time(),
                "dropped": self.dropped,
                "entries": entries,
            }

    def save(self, path: str | Path) -> Path:
        """The snapshot as JSON at ``path`` (what ``flexdsa traffic push JOB FILE`` sends)."""
        path = Path(path)
        path.write_text(json.dumps(self.snapshot(), indent=1))
        return path
