"""Every ONNX Runtime run of the pipeline has a time budget: a model whose run cannot be bounded (a Loop of
10^9 iterations) fails with ``run_budget_exceeded`` and what to change, within its budget, instead of
holding the worker for as long as it likes."""

import time

import numpy as np
import pytest
from onnx import TensorProto, helper

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.errors import RunBudgetExceededError
from flexdsa_core.ort_runs import run, run_budget


def endless_loop_model(trip_count: int = 10**9) -> bytes:
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trip", "cond", "x"], ["y"], body=body)],
        "endless",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        [helper.make_tensor("trip", TensorProto.INT64, [], [trip_count]), helper.make_tensor("cond", TensorProto.BOOL, [], [True])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


def test_guarded_run_stops_a_loop_at_its_budget():
    started = time.monotonic()
    with run_budget(1.0), pytest.raises(RunBudgetExceededError) as caught:
        run(endless_loop_model(), {"x": np.zeros(1, np.float32)})
    # A hang guard, not a speed goal: unbudgeted, the 10^9 iterations run for many minutes. How soon after its
    # budget a run is stopped is measured by ``python -m bench.mechanics`` (run budget).
    assert time.monotonic() - started < 10
    assert "validation ran past its 1 s budget" in caught.value.message
    assert caught.value.code == "run_budget_exceeded"


def test_a_bounded_loop_runs_to_its_end_under_the_budget():
    with run_budget(30.0):
        out = run(endless_loop_model(trip_count=1000), {"x": np.zeros(1, np.float32)})
    assert out["y"].tolist() == [1000.0]


def test_the_pipeline_fails_a_billion_iteration_loop_within_its_budget():
    started = time.monotonic()
    with pytest.raises(RunBudgetExceededError) as caught:
        FlexDSAOptimizer("cpu-ort").optimize(endless_loop_model(), OptimizeOptions(run_budget_s=2, measure_latency=False))
    assert time.monotonic() - started < 60  # a hang guard, as above
    assert "run_budget_s" in caught.value.message
