"""The embedded-mode worker: a few threads inside the API process run queued jobs (no broker needed).

``start(settings)`` starts ``settings.embedded_worker_threads`` threads (1-2 is right: each job runs in its
own pipeline process anyway) and a reconciler that, at start and then every ``reconcile_interval_s``,
picks up jobs left queued (e.g. submitted before a restart) or running with a lapsed lease. While it runs,
``service.jobs.dispatch.enqueue`` in embedded mode lands in its ``submit``. ``stop()`` lets running jobs go: their pipeline process dies with the
thread, the lease lapses, and the next start runs them again.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading

from service.jobs.dispatch import use_local_runner

log = logging.getLogger(__name__)

_STOP = object()


class InProcessWorker:
    def __init__(self, settings) -> None:
        from workers.reconciler import ReconcilerThread

        self.settings = settings
        self._queue: queue.Queue = queue.Queue()
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, args=(n,), name=f"flexdsa-worker-{n}", daemon=True)
            for n in range(max(1, settings.embedded_worker_threads))
        ]
        self._reconciler = ReconcilerThread(settings, self.submit, first_queued_after_s=0)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()
        self._reconciler.start()

    def submit(self, job_id: str) -> bool:
        with self._lock:
            if job_id in self._pending:  # already waiting: one queue entry per job is enough
                return True
            self._pending.add(job_id)
        self._queue.put(job_id)
        return True

    def stop(self, timeout_s: float = 5.0) -> None:
        global _worker
        with _worker_lock:
            if _worker is self:  # stopped through its handle: the next start() builds a fresh worker
                _worker = None
                use_local_runner(None)
        self._reconciler.stop(timeout_s)
        for _ in self._threads:
            self._queue.put(_STOP)
        for thread in self._threads:
            thread.join(timeout_s)

    def _work(self, n: int) -> None:
        from workers.execute import execute_job

        worker_id = f"{socket.gethostname()}:{os.getpid()}:embedded-{n}"
        while True:
            job_id = self._queue.get()
            if job_id is _STOP:
                return
            with self._lock:
                self._pending.discard(job_id)
            try:
                execute_job(job_id, settings=self.settings, worker_id=worker_id, requeue=self.submit)
            except Exception:
                log.exception("job %s: the embedded worker failed; the reconciler will retry it", job_id)


_worker: InProcessWorker | None = None
_worker_lock = threading.Lock()


def start(settings) -> InProcessWorker:
    """Start the embedded worker (once) and make it where ``service.jobs.dispatch.enqueue`` sends jobs."""
    global _worker
    with _worker_lock:
        if _worker is None:
            _worker = InProcessWorker(settings)
            _worker.start()
            use_local_runner(_worker.submit)
        return _worker


def stop(timeout_s: float = 5.0) -> None:
    global _worker
    with _worker_lock:
        worker, _worker = _worker, None
        use_local_runner(None)
    if worker is not None:
        worker.stop(timeout_s)
