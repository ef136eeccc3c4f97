"""Test-only hooks of the pipeline process (``workers.child``), never set in production.

The tests, and the servers and Celery workers they start, set ``FLEXDSA_TEST_*`` variables; the worker reads them
when it starts a job (``from_environment``) and hands them to the pipeline process with the job's request
(``"test_hooks"``, only when one is set), so they stay out of the service's ``Settings``:

* ``FLEXDSA_TEST_OPTIMIZER=module:Class`` swaps the optimizer (the workers' stand-in, ``tests.workers.standin``);
* ``FLEXDSA_TEST_STAGE_DELAY_S``: sleep at every stage change, so that a job is deterministically slow;
* ``FLEXDSA_TEST_CHILD_ABORT``: ``os.abort()`` in the pipeline process before optimising (a native crash).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

PREFIX = "FLEXDSA_TEST_"


class PipelineHooks(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    optimizer: str | None = Field(None, pattern=r"^[\w.]+:\w+$")
    stage_delay_s: float = Field(0.0, ge=0)
    child_abort: bool = False

    @property
    def active(self) -> bool:
        return self != PipelineHooks()


def from_environment(environ: Mapping[str, str] | None = None) -> PipelineHooks:
    """The hooks the ``FLEXDSA_TEST_*`` variables set (none set: every hook off)."""
    environ = os.environ if environ is None else environ
    values = {
        name: environ[PREFIX + name.upper()]
        for name in PipelineHooks.model_fields
        if PREFIX + name.upper() in environ
    }
    return PipelineHooks.model_validate({k: v for k, v in values.items() if v != ""})
