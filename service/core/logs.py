"""Structured logs: one JSON object per line, with the job id, tenant and incident id of the record's job.

``configure_logging(settings)`` is called once per process (``flexdsa serve``, a Celery worker); with
``FLEXDSA_LOG_FORMAT=text`` the lines are plain text for a person at a terminal. ``job_context(job_id,
tenant_id)`` marks every record logged inside it (the worker wraps each job in it), so an operator can
follow one job, or one tenant, through every process's log with a single filter (``jq 'select(.job_id==...)'``).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator

_job: contextvars.ContextVar[dict | None] = contextvars.ContextVar("flexdsa_job", default=None)
CONTEXT_FIELDS = ("job_id", "tenant_id", "incident")


@contextlib.contextmanager
def job_context(job_id: str, tenant_id: int | None = None) -> Iterator[None]:
    token = _job.set({"job_id": job_id, "tenant_id": tenant_id})
    try:
        yield
    finally:
        _job.reset(token)


class _JobFields(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in (_job.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in CONTEXT_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                entry[key] = value
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def _formatter(log_format: str) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter()
    return logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")


def structure(logger: logging.Logger | None, log_format: str = "json") -> None:
    """Give the handlers another framework set up (Celery's) our formatter and the job fields."""
    for existing in (logger or logging.getLogger()).handlers:
        existing.addFilter(_JobFields())
        existing.setFormatter(_formatter(log_format))


def handler(log_format: str = "json", stream=None) -> logging.Handler:
    out = logging.StreamHandler(stream or sys.stderr)
    out.addFilter(_JobFields())
    out.setFormatter(_formatter(log_format))
    return out


def configure_logging(log_format: str = "json", level: str = "info") -> None:
    """Route the root logger (and uvicorn's, Celery's) through one handler in ``log_format``."""
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler(log_format))
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "celery"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
