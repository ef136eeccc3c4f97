"""The workers' stand-in optimizer keeps the real one's contract: what ``workers/child.py`` calls (the
constructor and ``optimize`` with the same parameters) and what it reads back (``artifacts`` by name, a
JSON ``report_summary()``, progress stages the real pipeline also reports). Run both on one fixture, so a
change to the real optimizer that the stand-in does not follow fails here, not silently in the worker tests
that use the stand-in."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions, load_target
from flexdsa_core.cache import LRUCache
from tests.workers.standin import StandInOptimizer

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny_bert.onnx"


def _parameters(function) -> dict[str, inspect._ParameterKind]:
    return {
        name: p.kind for name, p in inspect.signature(function).parameters.items() if name != "self"
    }


def test_the_stand_in_takes_every_parameter_the_real_optimizer_takes():
    real = _parameters(FlexDSAOptimizer.optimize)
    stand_in = _parameters(StandInOptimizer.optimize)
    assert stand_in == real, f"optimize: the stand-in takes {stand_in}, the real optimizer {real}"
    # The constructor as workers/child.py calls it (the real one also takes test-only rules and clock).
    real, stand_in = _parameters(FlexDSAOptimizer.__init__), _parameters(StandInOptimizer.__init__)
    for name in ("target", "toolchain_root"):
        assert stand_in.get(name) == real[name], f"__init__: {name} is {stand_in.get(name)}, not {real[name]}"


def _run(optimizer_class, tmp_path: Path) -> tuple[object, list[str]]:
    """As workers/child.py calls it."""
    stages: list[str] = []
    optimizer = optimizer_class(load_target("cpu-ort"), toolchain_root=None)
    result = optimizer.optimize(
        EXAMPLE, OptimizeOptions(measure_latency=False), cache=LRUCache(),
        progress=lambda stage, fraction, message="": stages.append(stage), workdir=tmp_path, calibration=None,
    )  # fmt: skip
    return result, list(dict.fromkeys(stages))


def test_the_stand_in_answers_like_the_real_optimizer(tmp_path):
    real, real_stages = _run(FlexDSAOptimizer, tmp_path / "real")
    stand_in, stand_in_stages = _run(StandInOptimizer, tmp_path / "stand_in")

    # What the worker stores: every artifact name the stand-in writes, the real optimizer writes too.
    assert set(stand_in.artifacts) <= set(real.artifacts), (sorted(stand_in.artifacts), sorted(real.artifacts))
    for result in (real, stand_in):
        assert all(isinstance(content, (bytes, Path)) for content in result.artifacts.values())
        json.dumps(result.report_summary())  # stored as JSON on the job row
    # What the dashboard shows as progress: stages the real pipeline has, in the real pipeline's order.
    assert set(stand_in_stages) <= set(real_stages), (stand_in_stages, real_stages)
    assert stand_in_stages == [s for s in real_stages if s in stand_in_stages]
