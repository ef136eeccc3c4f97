"""``workers.child`` with the tests' hooks (``tests/workers/hooks.py``), read from this process's environment:
the worker that started it passed the FLEXDSA_TEST_* variables it had at the job's start."""

from __future__ import annotations

import importlib
import os
import sys
import time

from tests.workers.hooks import PipelineHooks, from_environment


def _class(path: str):
    module_name, _, class_name = path.partition(":")
    return getattr(importlib.import_module(module_name), class_name)


def _aborting(optimizer):
    class Aborting(optimizer):
        def optimize(self, *args, **kwargs):  # a native crash before optimising
            os.abort()

    return Aborting


def _slowed(reporter, delay_s: float):
    def slowed(channel):
        report, last_stage = reporter(channel), [None]

        def progress(stage: str, fraction: float, message: str = "") -> None:
            report(stage, fraction, message)
            if stage != last_stage[0]:
                last_stage[0] = stage
                time.sleep(delay_s)

        return progress

    return slowed


def apply(hooks: PipelineHooks) -> None:
    from workers import child

    optimizer = _class(hooks.optimizer) if hooks.optimizer else child.optimizer_class()
    if hooks.child_abort:
        optimizer = _aborting(optimizer)
    child.optimizer_class = lambda: optimizer
    if hooks.stage_delay_s:
        child.progress_reporter = _slowed(child.progress_reporter, hooks.stage_delay_s)


if __name__ == "__main__":
    apply(from_environment())
    from workers import child

    sys.exit(child.main())
