"""The pipeline process's test-only hooks. None of this ships: the package's pipeline process
(``workers.child``) runs the compiler it ships and reads no variable that chooses another.

A test (or a worker, server or benchmark a test starts through ``python -m tests.workers.launch``) calls
``install()``; its pipeline processes then run ``tests.workers.hooked_child`` instead of ``workers.child``, and
keep the ``FLEXDSA_TEST_*`` variables of the environment the worker had when it started the job:

* ``FLEXDSA_TEST_OPTIMIZER=module:Class`` swaps the optimizer (the workers' stand-in, ``tests.workers.standin``);
* ``FLEXDSA_TEST_STAGE_DELAY_S``: sleep at every stage change, so that a job is deterministically slow;
* ``FLEXDSA_TEST_CHILD_ABORT``: ``os.abort()`` in the pipeline process before optimising (a native crash).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

PREFIX = "FLEXDSA_TEST_"
HOOKED_CHILD = "tests.workers.hooked_child"


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


def install() -> None:
    """From now on this process's pipeline processes run the hooked child and keep FLEXDSA_TEST_*."""
    from workers import pipeline_process

    pipeline_process.CHILD_MODULE = HOOKED_CHILD
    if PREFIX not in pipeline_process.CHILD_ENV_PREFIXES:
        pipeline_process.CHILD_ENV_PREFIXES = (*pipeline_process.CHILD_ENV_PREFIXES, PREFIX)
