"""``flexdsa optimize`` ends a failure with one plain line: an internal error names an incident whose file
holds the traceback, a run past its memory limit says which limit, and the limit is really applied."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from flexdsa_core import cli
from flexdsa_core.optimizer import FlexDSAOptimizer
from tests.models import fixture


def _run(tmp_path, *extra):
    runner = CliRunner()
    return runner.invoke(
        cli.app,
        ["optimize", str(fixture("resnet")), "-o", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "kernels"),
         "--no-measure", "-q", *extra],
    )  # fmt: skip


def _one_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


def test_an_internal_error_is_one_line_with_an_incident_file(tmp_path, monkeypatch):
    def broken(self, *args, **kwargs):
        raise KeyError("a bug deep inside the pipeline")

    monkeypatch.setattr(FlexDSAOptimizer, "optimize", broken)
    result = _run(tmp_path, "--memory-limit-mb", "0")
    assert result.exit_code == 1
    line = _one_line(result)
    assert "Traceback" not in result.output
    found = re.search(r"incident ([0-9a-f]{12}), details in (\S+)", line)
    assert found and "internal_error" in line and "KeyError" in line, line
    incident_file = tmp_path / "incidents" / f"{found.group(1)}.txt"
    assert str(incident_file) == found.group(2)
    assert "a bug deep inside the pipeline" in incident_file.read_text()
    assert "Traceback" in incident_file.read_text()


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("std::bad_alloc while allocating a tensor")])
def test_running_out_of_memory_says_which_limit(tmp_path, monkeypatch, error):
    """The line names the limit the run was really under: the address-space cap in force while the pipeline
    ran (read inside it), which the real ``_limit_memory`` set from --memory-limit-mb, and gave back after."""
    import resource

    before = resource.getrlimit(resource.RLIMIT_AS)
    tighter = [limit >> 20 for limit in before if limit != resource.RLIM_INFINITY and limit < 12000 << 20]
    if tighter:
        pytest.skip(f"this test process already runs under a tighter address-space limit ({min(tighter)} MiB)")
    applied_mb = []

    def hungry(self, *args, **kwargs):
        applied_mb.append(resource.getrlimit(resource.RLIMIT_AS)[0] >> 20)
        raise error

    monkeypatch.setattr(FlexDSAOptimizer, "optimize", hungry)
    result = _run(tmp_path, "--memory-limit-mb", "12000")  # the size test_an_in_process_run_... runs under
    assert result.exit_code == 1
    assert applied_mb == [12000]  # the cap was in force while the pipeline ran
    line = _one_line(result)
    assert "memory_limit_exceeded" in line and f"--memory-limit-mb {applied_mb[0]} allows" in line, line
    assert resource.getrlimit(resource.RLIMIT_AS) == before


def test_the_memory_limit_is_applied_to_the_process():
    code = (
        "import resource; from flexdsa_core.cli import _limit_memory; "
        "print(_limit_memory(3000)[0], resource.getrlimit(resource.RLIMIT_AS)[0] >> 20)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["3000", "3000"]
    default = "from flexdsa_core.cli import _limit_memory; print(_limit_memory(None)[0])"
    out = subprocess.run([sys.executable, "-c", default], capture_output=True, text=True, check=True).stdout
    assert 0 < int(out) <= 16384


def test_an_in_process_run_gives_the_process_its_own_limit_back(tmp_path):
    """A caller running the CLI in its own process (a test, a notebook) keeps its address space afterwards: a
    browser or a vendor compiler it starts later would otherwise inherit the run's cap."""
    import resource

    before = resource.getrlimit(resource.RLIMIT_AS)
    result = _run(tmp_path, "--memory-limit-mb", "12000")
    assert result.exit_code == 0, result.output
    assert resource.getrlimit(resource.RLIMIT_AS) == before


def test_an_int8_only_target_without_samples_is_refused_in_one_line_naming_both_fixes(tmp_path):
    result = _run(tmp_path, "--target", "xilinx-kv260", "--memory-limit-mb", "0")
    assert result.exit_code != 0
    line = _one_line(result)
    assert "invalid_options" in line and "int8 only" in line, line
    assert "--calibration" in line and "--allow-synthetic-calibration" in line, line
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_allow_synthetic_calibration_on_the_command_line_ships_with_the_warning(tmp_path):
    result = _run(tmp_path, "--target", "xilinx-kv260", "--memory-limit-mb", "0", "--allow-synthetic-calibration")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert any("seeded random inputs" in warning for warning in report["warnings"]), report["warnings"]
