"""The Celery application's settings, shared by the worker (``workers.app``) and the publishers
(``workers.dispatch``) without either importing the other. Why each setting is what it is: ``workers.app``."""

from __future__ import annotations

import os
import socket

from celery import Celery

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
