"""The pipeline process's test-only hooks live in ``workers.testing``, not in the service's ``Settings``: the
worker reads the ``FLEXDSA_TEST_*`` variables per job and hands them over with the request."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from service.config import Settings
from workers.testing import PipelineHooks, from_environment


def test_settings_carry_no_test_hooks():
    assert not [name for name in Settings.model_fields if name.startswith("test")]


def test_hooks_come_from_their_variables_only():
    environ = {"FLEXDSA_TEST_OPTIMIZER": "tests.workers.standin:StandInOptimizer", "FLEXDSA_TEST_STAGE_DELAY_S": "0.5",
               "FLEXDSA_TEST_CHILD_ABORT": "1", "FLEXDSA_TEST_REDIS_URL": "redis://elsewhere/1"}  # fmt: skip
    hooks = from_environment(environ)
    assert hooks == PipelineHooks(optimizer="tests.workers.standin:StandInOptimizer", stage_delay_s=0.5, child_abort=True)
    assert hooks.active
    assert not from_environment({"FLEXDSA_TEST_REDIS_URL": "redis://elsewhere/1", "FLEXDSA_TEST_OPTIMIZER": ""}).active


def test_a_malformed_hook_is_refused():
    with pytest.raises(ValidationError):
        from_environment({"FLEXDSA_TEST_OPTIMIZER": "not a class path"})
    with pytest.raises(ValidationError):
        from_environment({"FLEXDSA_TEST_STAGE_DELAY_S": "-1"})
