"""The pipeline process: ``python -m workers.child`` runs one job's optimisation, isolated from the worker.

ONNX Runtime runs native code on untrusted models; a model that segfaults it must fail its job, not kill
the worker. So the worker (``workers.execute``) starts this process per job and only watches it.

Protocol. stdin: one JSON line ``{"job_id", "tenant_id", "model_blob_key", "model_filename", "spec",
"settings", "work_dir"}`` (``work_dir``: a folder the worker made for this job's temporary files and removes
after; ``tenant_id``: whose kernel cache the job uses), then kept open: EOF on stdin means the worker died,
and this process exits at once. stdout: JSON lines,
``{"type": "progress", "stage", "fraction", "message"}`` while running, then exactly one of
``{"type": "result", "artifacts": [{"name", "blob_key", "size", "content_type"}], "report_summary",
"cache_stats"}`` or ``{"type": "error", "code", "message", "details", "cache_stats"}``. Anything the
libraries print goes to stderr (fd 1 is re-pointed there), which the worker keeps for crash reports.
Artifacts are written to the content-addressed store before the result is sent, so the worker only records
rows; blobs written by an attempt that then dies are harmless (same content, same key).

The optimizer is ``optimizer_class()``, the compiler this package ships; nothing in a request or the
environment chooses another (the tests' stand-in is installed by the tests' own entry point,
``tests/workers/hooked_child.py``, which patches this module and then runs ``main``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import mimetypes
import os
import signal
import sys
import tempfile
import threading
import traceback
import uuid
from pathlib import Path, PurePath

log = logging.getLogger("workers.child")
# The error code of an attempt that could not reach the artifact store: the service's fault, retried.
STORE_UNAVAILABLE = "artifact_store_unavailable"

_CONTENT_TYPES = {
    ".onnx": "application/octet-stream",
    ".json": "application/json",
    ".py": "text/x-python",
    ".sh": "text/x-shellscript",
    ".txt": "text/plain",
    ".md": "text/markdown",
    ".cfg": "text/plain",
    ".ini": "text/plain",
    ".zip": "application/zip",
}


def content_type_for(name: str) -> str:
    suffix = PurePath(name).suffix.lower()
    return _CONTENT_TYPES.get(suffix) or mimetypes.guess_type(name)[0] or "application/octet-stream"


class _Channel:
    """JSON lines to the worker over the original stdout, one writer at a time."""

    def __init__(self, fd: int) -> None:
        self._stream = os.fdopen(fd, "w", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()

    def send(self, message: dict) -> None:
        line = json.dumps(message, default=str)
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()


def _die_with_worker() -> None:
    """On Linux, have the kernel SIGKILL us when the worker dies (PR_SET_PDEATHSIG), so a pipeline never
    outlives the worker that watches it; the stdin watch below covers other systems and the startup race."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


def _exit_when_worker_dies() -> None:
    """The worker holds our stdin open; EOF means it is gone, and an orphaned pipeline must not linger."""
    try:
        while sys.stdin.buffer.read(65536):
            pass
    finally:
        os._exit(70)


def optimizer_class():
    """The compiler a job runs: the one this package ships."""
    from flexdsa_core import FlexDSAOptimizer

    return FlexDSAOptimizer


def progress_reporter(channel: _Channel):
    def progress(stage: str, fraction: float, message: str = "") -> None:
        channel.send({"type": "progress", "stage": stage, "fraction": float(fraction), "message": message})

    return progress


def run(request: dict, channel: _Channel) -> dict:
    """Run one job's pipeline; return the result message (FlexDSAError and bugs become error messages)."""
    from flexdsa_core import FlexDSAError, RequestSpec
    from flexdsa_core.compare import comparison_row
    from service.core.config import Settings
    from service.storage.store import (
        DISK_FULL_ERRNOS,
        BlobNotFoundError,
        ChecksumMismatchError,
        StoreUnavailableError,
        make_store,
    )
    from workers.cache_backends import build_kernel_cache

    settings = Settings(**request["settings"])
    store = make_store(settings, patient=True)  # an object store's outage is waited out, not a failure
    cache = build_kernel_cache(settings, tenant_id=request["tenant_id"])  # the job's tenant's entries only
    # Every temporary file of this job (the core's included) goes under the folder the worker made for
    # it, and the worker removes that folder whatever happens to this process.
    work_dir = Path(request.get("work_dir") or tempfile.mkdtemp(prefix="flexdsa-job-"))
    tempfile.tempdir = str(work_dir)
    try:
        _limit_memory(settings.job_memory_limit_mb)  # from here on, the model's work counts against it
        spec = RequestSpec.model_validate(request["spec"])
        # Only the base name: the upload's name never chooses where we write ('..' would be the parent
        # folder itself; rows from before the API sanitised names may still hold one).
        base_name = PurePath(request["model_filename"] or "").name
        model_path = work_dir / (base_name if base_name not in ("", ".", "..") else "model.onnx")
        # Fetched into this job's own folder and checked against its sha256 on the way: the worker needs no
        # folder shared with the API, only the store.
        store.fetch_to(request["model_blob_key"], model_path)
        extra = {}
        if request.get("calibration_blob_key"):  # handed over like the model: a file in the job's folder
            extra["calibration"] = work_dir / "calibration.npz"
            store.fetch_to(request["calibration_blob_key"], extra["calibration"])
        optimizer = optimizer_class()(spec.target_spec(), toolchain_root=settings.toolchains_dir)
        result = optimizer.optimize(
            model_path, spec.options(), cache=cache, progress=progress_reporter(channel), **extra,
        )
        artifacts = [_store_artifact(store, name, content) for name, content in sorted(result.artifacts.items())]
        summary = result.report_summary()
        # The row a job group's comparison reads (GET /groups/{id}): kept with the summary, so a group is
        # answered from the job rows alone.
        try:
            summary["comparison"] = comparison_row(result.report)
        except Exception:  # a report shape the comparison does not know must not fail a finished job
            log.exception("no comparison row for this job's report")
        return {"type": "result", "artifacts": artifacts, "report_summary": summary,
                "cache_stats": _cache_stats(cache, summary)}
    except BlobNotFoundError:
        return {
            "type": "error", "code": "model_unavailable",
            "message": "the uploaded model is no longer in the artifact store; submit it again",
            "details": {"blob_key": request["model_blob_key"]}, "cache_stats": cache.stats.as_dict(),
        }
    except ChecksumMismatchError as err:
        return {
            "type": "error", "code": "blob_corrupt",
            "message": f"{err}; submit the model again (an operator may have to restore the store)",
            "details": {"blob_key": err.key, "read_sha256": err.actual}, "cache_stats": cache.stats.as_dict(),
        }
    except StoreUnavailableError as err:  # still unreachable after the patience: the worker retries the job
        return {
            "type": "error", "code": STORE_UNAVAILABLE, "message": str(err),
            "details": {"patience_s": settings.store_outage_patience_s}, "cache_stats": cache.stats.as_dict(),
        }
    except FlexDSAError as err:
        return {
            "type": "error", "code": err.code, "message": err.message, "details": err.details,
            "cache_stats": cache.stats.as_dict(),
        }
    except MemoryError:  # the model's demand, not a bug: say what to change
        return {
            "type": "error", "code": "memory_limit_exceeded",
            "message": f"the job needed more memory than a job may use here ({settings.job_memory_limit_mb} MiB, "
                       "FLEXDSA_JOB_MEMORY_LIMIT_MB); give smaller input_shapes / shape_buckets, or switch "
                       "validation off (validate_outputs=false)",
            "details": {"limit_mb": settings.job_memory_limit_mb}, "cache_stats": cache.stats.as_dict(),
        }
    except OSError as err:
        if err.errno not in DISK_FULL_ERRNOS:
            return _internal_error(err, cache)
        # The machine's disk, not the model and not a bug: the job fails saying so, the operator sees it.
        print(f"flexdsa pipeline: disk full ({err})", file=sys.stderr, flush=True)
        return {
            "type": "error", "code": "insufficient_storage",
            "message": "the service's disk filled up while this job wrote its files; nothing is wrong with the "
                       "model: submit it again once an operator has freed space",
            "details": {"errno": errno.errorcode.get(err.errno, err.errno)}, "cache_stats": cache.stats.as_dict(),
        }
    except Exception as err:  # a bug in the core: final; the traceback goes to the operators, not the user
        return _internal_error(err, cache)


def _internal_error(err: Exception, cache) -> dict:
    incident, trace = _log_incident()
    return {
        "type": "error",
        "code": "internal_error",
        "message": f"the optimizer failed unexpectedly ({type(err).__name__}); incident {incident} is recorded "
        "for the operators (quote it when you report this)",
        "details": {"incident": incident},
        "incident_traceback": trace,
        "cache_stats": cache.stats.as_dict(),
    }


def _log_incident() -> tuple[str, str]:
    """A short id the user can quote, and the current traceback. The worker stores both (``incidents``
    table) and logs them; stderr gets a copy for a child that dies before it can send its message."""
    incident = uuid.uuid4().hex[:12]
    trace = traceback.format_exc(limit=30)
    print(f"flexdsa pipeline incident {incident}:\n{trace}", file=sys.stderr, flush=True)
    return incident, trace


def _limit_memory(limit_mb: int | None) -> None:
    """Cap this process's address space (soft limit only: a vendor toolchain it starts may raise it again)
    so one job's model cannot take the machine's memory from the others."""
    if not limit_mb or not sys.platform.startswith("linux"):
        return
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = limit_mb * 1024 * 1024
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _store_artifact(store, name: str, content) -> dict:
    """Artifacts come as bytes, or as a path for large files the core wrote to disk."""
    if isinstance(content, (str, os.PathLike)):
        path = Path(content)
        return {"name": name, "blob_key": store.put_file(path), "size": path.stat().st_size,
                "content_type": content_type_for(name)}
    data = bytes(content)
    return {"name": name, "blob_key": store.put_bytes(data), "size": len(data),
            "content_type": content_type_for(name)}


def _preload() -> None:
    from flexdsa_core.optimizer import preload

    optimizer_class()
    preload()  # what a job would import inside its stages
    import service.core.config  # noqa: F401
    import service.storage.store  # noqa: F401
    import workers.cache_backends  # noqa: F401
    from service.core import models  # noqa: F401


def _cache_stats(cache, summary) -> dict:
    """The layered cache's counts; the time saved is known to the core, which wraps the cache to count it."""
    stats = cache.stats.as_dict()
    core_stats = summary.get("cache") if isinstance(summary, dict) else None
    if isinstance(core_stats, dict):
        stats["seconds_saved"] = max(stats["seconds_saved"], float(core_stats.get("seconds_saved") or 0.0))
    return stats


def main() -> int:
    _die_with_worker()
    from flexdsa_core import heap

    heap.tune()  # before the imports and the job: freed memory goes back to the system (flexdsa_core/heap.py)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # Keep the real stdout for the protocol; anything a library prints lands in stderr instead.
    channel = _Channel(os.dup(1))
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        _preload()  # a warm spare does its imports before a job arrives
        heap.freeze_imports()  # then leaves them out of the collector's full passes (flexdsa_core/heap.py)
        preload_error = None
    except Exception as err:  # e.g. a broken install: the job fails with this, not as a "crash"
        preload_error = err
    line = sys.stdin.readline()
    if not line:  # a spare that was never used: the worker went away or discarded it
        return 0
    threading.Thread(target=_exit_when_worker_dies, name="worker-watch", daemon=True).start()
    try:
        if preload_error is not None:
            raise preload_error
        message = run(json.loads(line), channel)
    except MemoryError:  # past the job's memory limit outside the pipeline proper (reading its result)
        message = {"type": "error", "code": "memory_limit_exceeded",
                   "message": "the job needed more memory than a job may use here (FLEXDSA_JOB_MEMORY_LIMIT_MB); "
                              "give smaller input_shapes / shape_buckets", "details": {}}
    except BaseException as err:  # anything outside the pipeline: report it rather than die silently
        incident, trace = _log_incident()
        message = {"type": "error", "code": "internal_error",
                   "message": f"the pipeline process failed ({type(err).__name__}); incident {incident} is recorded "
                              "for the operators (quote it when you report this)",
                   "details": {"incident": incident}, "incident_traceback": trace}
    channel.send(message)
    sys.stderr.flush()
    # Skip interpreter shutdown: the stdin watcher holds the stdin lock, and finalising around it can
    # abort the process after its result is already sent.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
