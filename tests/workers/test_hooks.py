"""The pipeline process's test-only hooks live in the tests (``tests/workers/hooks.py``), not in the package:
the package's pipeline process runs the compiler it ships, whatever its environment says (an environment
variable used to make a worker import any ``module:Class``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from service.core.config import Settings
from tests.workers.conftest import create_job, load_job, tiny_model
from tests.workers.hooks import PipelineHooks, from_environment

ROOT = Path(__file__).resolve().parents[2]


def test_settings_carry_no_test_hooks():
    assert not [name for name in Settings.model_fields if name.startswith("test")]


def test_no_shipped_module_reads_a_test_hook():
    shipped = [p for package in ("workers", "service", "flexdsa_core", "flexdsa_runtime", "stack")
               for p in (ROOT / package).rglob("*.py")]  # fmt: skip
    assert shipped
    assert [str(p.relative_to(ROOT)) for p in shipped if "FLEXDSA_TEST_" in p.read_text()] == []


def test_a_production_pipeline_process_ignores_a_hook_in_its_environment(settings, monkeypatch, tmp_path):
    """The attack: FLEXDSA_TEST_OPTIMIZER naming a module of the attacker's choice. The package's own child runs
    the real compiler, the job succeeds, and the module is never imported."""
    from workers import pipeline_process
    from workers.execute import execute_job

    canary = tmp_path / "canary"
    monkeypatch.setattr(pipeline_process, "CHILD_MODULE", "workers.child")  # what ships, not the tests' child
    monkeypatch.setattr(pipeline_process, "CHILD_ENV_PREFIXES", (*pipeline_process.CHILD_ENV_PREFIXES, "FLEXDSA_"))
    monkeypatch.setenv("FLEXDSA_TEST_OPTIMIZER", "tests.workers.canary_optimizer:CanaryOptimizer")
    monkeypatch.setenv("FLEXDSA_CANARY_PATH", str(canary))
    job_id = create_job(settings, tiny_model(), spec={"target": "cpu-ort", "measure_latency": False})
    assert execute_job(job_id, settings=settings, worker_id="t1") == "succeeded", load_job(settings, job_id).error
    assert not canary.exists()
    assert "nodes_after" in load_job(settings, job_id).report_summary  # the real compiler's report, not a stand-in's


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
