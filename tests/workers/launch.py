"""``python -m tests.workers.launch MODULE ARGS...``: run ``python -m MODULE ARGS...`` (a Celery worker, uvicorn,
``flexdsa_core.cli serve``) with the tests' pipeline hooks installed (``tests/workers/hooks.py``), so its jobs'
pipeline processes honour the FLEXDSA_TEST_* variables. What the tests and benchmarks start instead of the
plain command whenever they set one of those variables."""

from __future__ import annotations

import runpy
import sys

from tests.workers.hooks import install

if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m tests.workers.launch MODULE [ARGS...]")
    install()
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
