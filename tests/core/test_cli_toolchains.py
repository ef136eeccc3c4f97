"""``flexdsa toolchains`` (and ``toolchains status``) list each toolchain's state and versions, ``flexdsa
targets`` each target's toolchain readiness, read from a toolchain root the way jobs read it (``ready.json``
written last by an install, beside the environment's python); ``--precision``'s help says what the README says."""

from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from flexdsa_core import cli
from flexdsa_core.toolchains import get_toolchain


def _mark_ready(root, name: str, versions: dict[str, str]) -> None:
    toolchain = get_toolchain(name)
    python = toolchain.python(root)
    python.parent.mkdir(parents=True, exist_ok=True)
    python.write_text("#!/bin/sh\n")
    (toolchain.home(root) / "ready.json").write_text(
        json.dumps({"requirements": [list(g) for g in toolchain.requirements], "versions": versions})
    )


def _invoke(*args: str) -> str:
    result = CliRunner().invoke(cli.app, list(args), env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    return result.output


def test_toolchains_and_targets_show_state_and_versions(tmp_path):
    _mark_ready(tmp_path, "rockchip", {"rknn-toolkit2": "2.3.2"})
    for args in (["toolchains", "--root", str(tmp_path)], ["toolchains", "status", "--root", str(tmp_path)]):
        lines = {line.split()[0]: line for line in _invoke(*args).splitlines() if line.strip()}
        assert "ready (rknn-toolkit2 2.3.2)" in lines["rockchip"] and "rockchip-rk3588" in lines["rockchip"]
        assert "not installed: run `flexdsa toolchains install qualcomm`" in lines["qualcomm"]
    targets = _invoke("targets", "--toolchains-dir", str(tmp_path))
    assert re.search(r"toolchain: rockchip: ready \(rknn-toolkit2 2\.3\.2\)", targets)
    assert "toolchain: qualcomm: not installed" in targets
    assert "toolchain: none installable" in targets  # huawei-ascend310b, cpu-ort


def test_precision_help_matches_the_readme():
    text = " ".join(_invoke("optimize", "--help").split())
    assert "int8 or mixed (every target, each in its own format)" in text
    assert "cpu-ort)" not in text.split("--precision", 1)[1][:200]
