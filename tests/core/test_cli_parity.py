"""``flexdsa optimize`` answers as the API does (issue 35): a refused spec is the API's sentence in one line,
with "did you mean" and before any work; calibration samples without a precision that uses them are refused,
not ignored; other libraries' warnings go to a log (``-v`` shows them); calibration samples whose shapes the
model takes become the buckets when none are given, and the summary says so."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from flexdsa_core import cli
from flexdsa_core.optimizer import FlexDSAOptimizer
from tests.models import fixture
from tests.service.live import REPO


def _lines(result) -> list[str]:
    return [line for line in result.output.splitlines() if line.strip()]


def _optimize(tmp_path, model, *extra):
    return CliRunner().invoke(
        cli.app, ["optimize", str(model), "-o", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "kernels"),
                  "--no-measure", *map(str, extra)],
    )  # fmt: skip


@pytest.fixture
def no_work(monkeypatch):
    """The pipeline must not start: a refusal comes before any work."""

    def started(*args, **kwargs):
        raise AssertionError("the pipeline ran although the request was refused")

    monkeypatch.setattr(FlexDSAOptimizer, "optimize", started)


def _npz(path, **arrays):
    np.savez(path, **arrays)
    return path


def test_a_mistyped_spec_key_is_one_line_with_did_you_mean(tmp_path, no_work):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"shape_bucket": {"seq": [8]}}))
    result = _optimize(tmp_path, fixture("bert"), "--spec", spec)
    assert result.exit_code == 2
    [line] = _lines(result)
    assert "error (invalid_spec)" in line and "did you mean 'shape_buckets'?" in line, line
    assert "pydantic" not in result.output and "http" not in result.output


def test_calibration_without_precision_is_refused_not_ignored(tmp_path, no_work):
    samples = _npz(tmp_path / "s.npz", input_ids=np.zeros((2, 8), np.int64))
    result = _optimize(tmp_path, fixture("bert"), "--calibration", samples)
    assert result.exit_code == 2
    [line] = _lines(result)
    assert "error (invalid_calibration)" in line and "--precision int8" in line, line


def test_target_all_says_targets_exists(tmp_path, no_work):
    result = _optimize(tmp_path, fixture("bert"), "--target", "all")
    assert result.exit_code == 1
    [line] = _lines(result)
    assert "unknown_target" in line and "targets" in line and "--targets all" in line, line


def _unused_initializer_model(path):
    """A MatMul + Relu with three initializers no node uses (ONNX Runtime warns about each)."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    unused = [numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), f"unused_{i}") for i in range(3)]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "unused",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])], [weight, *unused],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return path


def _run_cli(tmp_path, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXDSA_")}
    return subprocess.run(
        [sys.executable, "-m", "flexdsa_core.cli", *map(str, args)],
        capture_output=True, text=True, cwd=REPO, env={**env, "COLUMNS": "200"}, timeout=300,
    )  # fmt: skip


def test_other_libraries_warnings_go_to_the_log_and_verbose_shows_them(tmp_path):
    """An int8 job: ONNX Runtime's quantiser asks for "pre-processing" once per model it quantises. By default
    that goes to the log, and stderr says where; -v shows it. The summary is printed either way."""
    model = _unused_initializer_model(tmp_path / "unused.onnx")
    common = ("optimize", model, "--precision", "int8", "--no-measure", "-o", tmp_path / "out",
              "--cache-dir", tmp_path / "cache" / "kernels")  # fmt: skip
    quiet = _run_cli(tmp_path, *common)
    assert quiet.returncode == 0, quiet.stderr
    assert "Please consider" not in quiet.stderr and "onnxruntime" not in quiet.stderr.lower(), quiet.stderr
    log = tmp_path / "cache" / "logs" / "optimize.log"
    assert "Please consider" in log.read_text()
    assert f"lines of library warnings in {log}; -v shows them here" in " ".join(quiet.stderr.split())
    assert "Target        cpu-ort" in quiet.stdout and "Precision     int8 requested" in quiet.stdout

    verbose = _run_cli(tmp_path, *common, "-v")
    assert verbose.returncode == 0, verbose.stderr
    assert "Please consider" in verbose.stderr


def test_native_output_goes_to_the_log(tmp_path):
    """What native code writes to fd 2 (ONNX Runtime's own logger) lands in the log, not on the terminal, and
    the command's own messages still reach the terminal."""
    code = (
        "import os, sys; from pathlib import Path; from flexdsa_core.cli_output import library_output\n"
        f"with library_output(Path({str(tmp_path / 'lib.log')!r})) as log:\n"
        "    os.write(2, b'[W:onnxruntime:, graph.cc:1] Removing initializer unused_0\\n')\n"
        "    print('our own line', file=sys.stderr)\n"
        "print(log.lines(), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["our own line", "1"]
    assert "Removing initializer" in (tmp_path / "lib.log").read_text()


def test_calibration_samples_at_their_own_shapes_become_the_buckets(tmp_path):
    """BERT on a static-shape accelerator defaults to seq 128; samples at seq 16 make a seq-16 bucket instead of
    being refused, and the summary says where the shapes came from."""
    ids = np.random.default_rng(2).integers(0, 200, size=(8, 16)).astype(np.int64)
    samples = _npz(tmp_path / "s.npz", input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=np.zeros_like(ids))
    result = _optimize(tmp_path, fixture("bert"), "-t", "huawei-ascend310b", "--precision", "int8",
                       "--calibration", samples)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "Buckets       batch1_seq16: seq 16 from the calibration samples' shapes" in result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["shapes"]["buckets"] == ["batch1_seq16"] and report["shapes"]["from_samples"] == {"seq": 16}
    assert report["precision"]["calibration"]["source"] == "uploaded"


def test_requirements_gate_a_local_run_as_they_gate_a_job(tmp_path):
    model = _unused_initializer_model(tmp_path / "unused.onnx")
    result = _optimize(tmp_path, model, "-q", "--require", "cpu_nodes==0", "--require", "bundle_mb<0.001")
    assert result.exit_code == 3
    [line] = _lines(result)
    assert line.startswith("requirement not met: bundle_mb<0.001: bundle_mb is "), line
    assert (tmp_path / "out" / "model.onnx").exists()  # the package is written either way
    refused = _optimize(tmp_path, model, "--require", "speed>=1")
    assert refused.exit_code == 2 and "Did you mean 'speedup'?" in _lines(refused)[0]
