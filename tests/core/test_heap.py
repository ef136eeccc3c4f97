"""``heap.tune``: a big block the pipeline frees goes back to the system (issue 22's memory goal).

By default glibc raises its mmap threshold to the size of each big block freed, so the next blocks of that
size come from the heap, and one freed below a live allocation stays resident. Measured in fresh
interpreters (resident memory from /proc): eight 8 MiB buffers, each freed after a small allocation that
outlives it, as a stage's transients are."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from flexdsa_core import heap

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20

PROBE = """
import json, os, sys
from flexdsa_core import heap

def rss():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

tuned = heap.tune() if sys.argv[1] == "tuned" else False
before = rss()
survivors = []
for _ in range(8):
    transient = bytearray(8 << 20)  # written through: every page resident
    survivors.append(bytearray(4096))  # allocated after it, still alive when it is freed
    del transient
print(json.dumps({"tuned": tuned, "kept": rss() - before}))
"""

glibc_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="glibc's allocator is the one tuned (a no-op elsewhere)",
)


def _kept(mode: str) -> dict:
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, cwd=REPO, timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-2000:]
    return json.loads(probe.stdout.strip().splitlines()[-1])


@glibc_only
def test_freed_big_blocks_leave_the_process_once_tuned():
    untuned, tuned = _kept("default"), _kept("tuned")
    assert tuned["tuned"]
    # glibc's default keeps one freed 8 MiB block resident inside the heap; tuned, each was mapped on its own.
    assert untuned["kept"] >= 6 * MIB, untuned
    assert tuned["kept"] < 2 * MIB, tuned


def test_tune_is_a_no_op_off_glibc(monkeypatch):
    heap._glibc.cache_clear()
    monkeypatch.setattr(heap.platform, "libc_ver", lambda: ("", ""))
    try:
        assert heap.tune() is False
    finally:
        heap._glibc.cache_clear()
