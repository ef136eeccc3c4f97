"""``enqueue(job_id, settings)``: hand a committed job to whoever runs jobs in this mode.

Distributed: publish ``flexdsa.run_job(job_id)`` to the broker by task name, a job published again ahead
of new ones (``service.jobs.task_queue``: Redis priorities). Embedded: hand the id to the local runner that the
in-process worker registered when it started (``use_local_runner``; the service does not know the workers,
the composition root starts them); with none running, the job waits in the database for the worker's first
sweep. Call it only after the job row is committed (the worker may start before this returns).
It never raises: a broker outage leaves the job ``queued`` in the database, and the reconciler publishes it
again once the broker is back, so the API can still answer 202.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

_apps: dict[str, object] = {}
_apps_lock = threading.Lock()
_local_runner: Callable[[str], bool] | None = None


def use_local_runner(submit: Callable[[str], bool] | None) -> None:
    """Where embedded-mode jobs go: the in-process worker's ``submit`` while it runs, None after."""
    global _local_runner
    _local_runner = submit


def celery_app_for(settings):
    """The Celery app publishing to ``settings.broker_url`` (one per broker URL, built on first use)."""
    from service.jobs.task_queue import create_celery

    with _apps_lock:
        app = _apps.get(settings.broker_url)
        if app is None:
            app = _apps[settings.broker_url] = create_celery(settings)
        return app


def enqueue(job_id: str, settings, *, requeued: bool = False) -> bool:
    """Publish the job; True when handed over, False when it stays for the reconciler. ``requeued``: the
    job is published again (worker lost, pipeline crashed and retried): it goes ahead of new jobs."""
    if settings.mode == "embedded":
        runner = _local_runner
        if runner is None:
            log.info("job %s: no embedded worker running; it will pick the job up when started", job_id)
            return False
        return runner(job_id)
    from service.jobs.task_queue import NEW_JOB_PRIORITY, QUEUE, REQUEUED_JOB_PRIORITY, TASK_NAME

    try:
        celery_app_for(settings).send_task(
            TASK_NAME, args=[job_id], queue=QUEUE,
            priority=REQUEUED_JOB_PRIORITY if requeued else NEW_JOB_PRIORITY,
            retry=True, retry_policy={"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5},
        )
        return True
    except Exception as err:
        log.warning("job %s: could not publish to the broker (%s); the reconciler will retry", job_id, err)
        return False
