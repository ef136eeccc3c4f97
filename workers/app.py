"""The Celery app: ``celery -A workers.app worker`` runs Flex-DSA jobs from the broker.

The task is thin (STYLE.md 14): it carries a job id and calls ``execute_job``, which claims the job with a
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

from celery import Celery, signals

from service.config import get_settings

log = logging.getLogger(__name__)

TASK_NAME = "flexdsa.run_job"
QUEUE = "flexdsa"
# Margin between the job's own hard limit (enforced by execute_job) and Celery's limits on the task.
CELERY_LIMIT_MARGIN_S = 60


def create_celery(settings) -> Celery:
    app = Celery("flexdsa", broker=settings.broker_url, set_as_current=False)
    hard_s = settings.job_hard_time_limit_s
    app.conf.update(
        task_default_queue=QUEUE,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,  # the job row is the result
        task_serializer="json",
        accept_content=["json"],
        task_soft_time_limit=hard_s + CELERY_LIMIT_MARGIN_S // 2,
        task_time_limit=hard_s + CELERY_LIMIT_MARGIN_S,
        broker_transport_options={
            "visibility_timeout": max(settings.broker_visibility_timeout_s, hard_s + 2 * CELERY_LIMIT_MARGIN_S)
        },
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_send_task_events=False,
    )
    return app


def worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


app = create_celery(get_settings())


@app.task(name=TASK_NAME)
def run_job(job_id: str) -> str:
    from workers.execute import execute_job

    return execute_job(job_id, settings=get_settings(), worker_id=worker_id())


# --- structured logs: Celery sets its handlers up, then they get the JSON formatter and the job fields ---


@signals.after_setup_logger.connect
@signals.after_setup_task_logger.connect
def _structured_logs(logger=None, **_kwargs) -> None:
    from service.logs import structure

    structure(logger, get_settings().log_format)


# --- the reconciler in each worker's main process -------------------------------------------------------

_reconciler = None


@signals.worker_init.connect
def _refuse_unmigrated_database(**_kwargs) -> None:
    settings = get_settings()
    if not settings.is_sqlite:
        from service.db import check_migrated, make_engine

        engine = make_engine(settings.database_url)
        try:
            check_migrated(engine)
        finally:
            engine.dispose()


@signals.worker_ready.connect
def _start_reconciler(**_kwargs) -> None:
    global _reconciler
    from workers.reconciler import ReconcilerThread

    _reconciler = ReconcilerThread(get_settings())
    _reconciler.start()


@signals.worker_shutdown.connect
def _stop_reconciler(**_kwargs) -> None:
    if _reconciler is not None:
        _reconciler.stop()
