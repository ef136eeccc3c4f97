"""The job queue's contract: the task name, the queue, the priorities and the Celery application's settings,
shared by the API that publishes jobs (``service.jobs.dispatch``) and the workers that consume them
(``workers.app``), so that the service never imports the workers. Why each setting is what it is:
``workers.app``."""

from __future__ import annotations

from celery import Celery

TASK_NAME = "flexdsa.run_job"
QUEUE = "flexdsa"
# Priorities on the Redis broker: kombu keeps one list per step and a worker pops the lowest step first (0
# is the highest, the reverse of RabbitMQ). New jobs go in at NEW_JOB_PRIORITY; a job published again (its
# worker was lost and its lease lapsed, or its pipeline crashed and it has attempts left) goes in at
# REQUEUED_JOB_PRIORITY, ahead of everything queued: it was accepted before them and has waited once
# already, so a dead worker costs it the lease, not the whole backlog (measured: 182 s behind 47 jobs).
PRIORITY_STEPS = [0, 3, 6, 9]
REQUEUED_JOB_PRIORITY = 0
NEW_JOB_PRIORITY = 6
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
            "visibility_timeout": max(settings.broker_visibility_timeout_s, hard_s + 2 * CELERY_LIMIT_MARGIN_S),
            "priority_steps": PRIORITY_STEPS,
        },
        task_default_priority=NEW_JOB_PRIORITY,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        worker_send_task_events=False,
    )
    return app
