"""The C heap of a pipeline process: glibc's allocator set up so that memory a stage frees goes back to the
system, rather than staying resident as free space in the heap (issue 22's memory goal).

A run is a sequence of big transient allocations: a model's protobuf parsed and serialised again, weights
made arrays, ONNX Runtime sessions built and dropped. By default glibc raises its mmap threshold each time
a big block is freed (up to 32 MiB), so after the first few the next ones come from the heap, and a block
freed in the heap's middle stays resident; ppocr_rec's run had up to 58 MiB of free heap resident at its
peaks (``mallinfo2``). With the threshold fixed, blocks of ``MMAP_THRESHOLD`` bytes and more are mapped on
their own and unmapped when freed; the heap is trimmed once ``TRIM_THRESHOLD`` bytes are free at its top;
and at most ``ARENA_MAX`` arenas (threads' allocations otherwise spread over up to 8 per core, each holding
its own free space and 64 MiB of address space, which counts against the run's memory limit).

The Python heap is the other half: ``freeze_imports()`` takes the objects the loaded libraries made (onnx,
onnxscript, ONNX Runtime, numpy: some 150k once they are in) out of the cyclic collector's full passes, which
otherwise walk them all each time a run's new objects trigger one (MobileNetV2: 0.07-0.11 s a pass, one per job
in a fresh process; none once they are frozen).

``tune()`` is for a process's entry point (the CLI, the worker's pipeline process), before the model's work
starts; it changes the whole process's allocator. On anything but glibc (musl, macOS, Windows) it does
nothing. (``malloc_trim`` between stages was tried as well: it lowered the resident size between stages but
not the peaks, which fall inside a stage, so it is not done.)
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import platform
import sys

# mallopt(3) parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

MMAP_THRESHOLD = 128 * 1024  # glibc's own starting value, kept fixed instead of growing with each free
TRIM_THRESHOLD = 128 * 1024
ARENA_MAX = 2


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


def tune() -> bool:
    """Fix glibc's mmap and trim thresholds and cap its arenas (module docstring). True if applied."""
    libc = _glibc()
    if libc is None:
        return False
    settings = ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD), (_M_TRIM_THRESHOLD, TRIM_THRESHOLD), (_M_ARENA_MAX, ARENA_MAX))
    return all(libc.mallopt(parameter, value) == 1 for parameter, value in settings)


def freeze_imports() -> None:
    """Leave what is alive now out of the cyclic collector's passes (``gc.freeze``): for a process's entry point,
    once its imports are done and before a model is read, so that what it freezes is the libraries' modules,
    classes and functions, which live as long as the process anyway. A run's own objects are collected as
    before. Not collected first: that full pass would cost what it saves; the few cycles the imports left
    behind stay, as they would until the next full pass."""
    gc.freeze()
