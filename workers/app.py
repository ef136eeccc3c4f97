"""The Celery app: ``celery -A workers.app worker`` runs Flex-DSA jobs from the broker.

The task is thin: it carries a job id and calls ``execute_job``, which claims the job with a
lease in the database, so a re-delivered message is harmless. Delivery settings follow from that:

- ``acks_late`` + ``task_reject_on_worker_lost``: a message is acknowledged only after the job ran, so a
  worker lost mid-job leaves it to be delivered again.
- Redis ``visibility_timeout`` above the hard time limit: the broker re-delivers an unacknowledged message
  only once no live worker can still be running it.
- ``worker_prefetch_multiplier=1``: a worker holds one job at a time; others stay in the queue for idle
  workers rather than waiting behind a long job.
- Celery's own time limits sit above the job's (``execute_job`` enforces those itself and kills only the
  pipeline process); Celery's hard limit is the last resort if the worker itself hangs.

Each worker also runs the reconciler (``workers.reconciler``) in a thread of its main process, so jobs
whose message was lost (Redis restarted) or whose worker died are published again.
"""

from __future__ import annotations

import logging
import os
import socket

from celery import signals

from service.core.config import get_settings
from service.jobs.task_queue import QUEUE, TASK_NAME, create_celery  # noqa: F401 - re-exported

log = logging.getLogger(__name__)

app = create_celery(get_settings())


def worker_id() -> str:
    """This worker process, as written in a job's lease: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


@app.task(name=TASK_NAME)
def run_job(job_id: str) -> str:
    from service.jobs.dispatch import enqueue
    from workers.execute import execute_job

    settings = get_settings()
    return execute_job(
        job_id, settings=settings, worker_id=worker_id(),
        requeue=lambda again: enqueue(again, settings, requeued=True),
    )


# --- structured logs: Celery sets its handlers up, then they get the JSON formatter and the job fields ---


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def _structured_logs(logger=None, **_kwargs) -> None:
    from service.core.logs import structure

    structure(logger, get_settings().log_format)


# --- the reconciler in each worker's main process -------------------------------------------------------

_reconciler = None


@signals.worker_init.connect
def _refuse_unmigrated_database(**_kwargs) -> None:
    settings = get_settings()
    if not settings.is_sqlite:
        from service.core.db import check_migrated, make_engine

        engine = make_engine(settings.database_url)
        try:
            check_migrated(engine)
        finally:
            engine.dispose()


@signals.worker_ready.connect
def _start_reconciler(**_kwargs) -> None:
    global _reconciler
    from service.jobs.dispatch import enqueue
    from workers.reconciler import ReconcilerThread

    settings = get_settings()
    # Everything the reconciler publishes was accepted earlier and lost on the way: it goes ahead of new jobs.
    _reconciler = ReconcilerThread(settings, lambda job_id: enqueue(job_id, settings, requeued=True))
    _reconciler.start()


@signals.worker_shutdown.connect
def _stop_reconciler(**_kwargs) -> None:
    if _reconciler is not None:
        _reconciler.stop()
