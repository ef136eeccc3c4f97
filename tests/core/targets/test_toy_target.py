"""A target added from outside ``flexdsa_core/targets/``: a toy vendor package under tests/ (``toy/``), registered
with ``targets.register_vendor`` and run by the optimizer with the pipeline its adapter lists (the default
plus a stage and a verifier of its own), with no other folder touched."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.cache import LRUCache
from flexdsa_core.targets import list_targets, load_target, register_vendor, unregister_vendor


@pytest.fixture
def toy():
    name = register_vendor("tests.core.targets.toy")
    yield name
    unregister_vendor(name)


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["mm"]),
            helper.make_node("Add", ["mm", "b"], ["sum"]),
            helper.make_node("Identity", ["sum"], ["id"]),
            helper.make_node("Relu", ["id"], ["y"]),
        ],
        "toy",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        [weight, bias],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def test_a_registered_package_is_listed_and_loaded(toy):
    assert toy == "toy"
    spec = load_target("toy-npu")
    assert spec.adapter == "toy" and "toy-npu" in {t.name for t in list_targets()}


def test_the_optimizer_runs_the_toy_pipeline(toy):
    optimizer = FlexDSAOptimizer("toy-npu")
    assert [s.run.__name__ for s in optimizer.stages] == [
        "specialize", "estimate_before", "generic_passes", "choose_fusions", "legalize", "toy_census",
        "plan_memory", "record",
    ]  # fmt: skip
    result = optimizer.optimize(_model(), OptimizeOptions(measure_latency=False), cache=LRUCache())
    report = result.report
    assert list(report["verdicts"]) == ["validation", "padding", "toy_op_table"]
    assert report["verdicts"]["toy_op_table"] == {"ok": True, "failure": None}
    assert report["validation"]["ok"]
    assert "model.onnx" in result.artifacts and "manifest.json" in result.artifacts
    # The toy's own stage ran on every bucket, between legalisation and the memory plan.
    notes = [note for bucket_notes in report["legalization"].values() for note in bucket_notes]
    assert any(note.startswith("toy census") for note in notes)
    # The fusion the toy's table allows (MatMul + Add -> Gemm) was taken, and the dead Identity went.
    assert {node.op_type for node in result.buckets[0].model.graph} <= {"Gemm", "Relu", "MatMul", "Add"}


def test_unregistered_it_is_gone(toy):
    unregister_vendor(toy)
    assert "toy-npu" not in {t.name for t in list_targets()}
    register_vendor("tests.core.targets.toy")  # for the fixture's own unregister


def test_a_name_a_builtin_folder_has_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_vendor("flexdsa_core.targets.rockchip")
