"""``optimizer.preload``: what a job would import on its way is imported before it, by the entry points that
run a job in a fresh process (the worker's spare, the CLI), so the job's stages no longer pay it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.core.test_libraries import RESIZE

ROOT = Path(__file__).resolve().parents[2]
# A fresh interpreter, as the worker's spare starts: the optimizer imported, ``preload`` called or not, then a
# job on a model whose dims only ONNX Runtime's symbolic shape inference follows: a Resize at a scale that is
# not whole, which sympy's ``simplify`` decides.
JOB = """
import json, sys
import onnx
from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.optimizer import preload
if sys.argv[1] == "preload":
    preload()
model = onnx.parser.parse_model(sys.argv[2]).SerializeToString()
before = set(sys.modules)
result = FlexDSAOptimizer("cpu-ort").optimize(
    model, OptimizeOptions(measure_latency=False, calibrate=False, shape_buckets={"H": [32], "W": [32]})
)
print(json.dumps({"refined": result.report["shapes"]["counts"]["refined_symbolically"], "imported": sorted(set(sys.modules) - before)}))
"""


def _job(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", JOB, mode, RESIZE.format(scale="1.5")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["preload", "none"])
def test_a_job_after_preload_imports_no_fusion_rule_and_nothing_of_sympy(mode):
    job = _job(mode)
    assert job["refined"] >= 1  # the symbolic inference ran in the job
    lazy = [m for m in job["imported"] if m.startswith(("sympy", "flexdsa_core.fusions"))]
    if mode == "preload":
        assert lazy == []
    else:  # what preload saves the job: without it, the job imports both on its way
        assert any(m.startswith("sympy.physics") for m in lazy), lazy
        assert any(m.startswith("flexdsa_core.fusions.") for m in lazy), lazy
