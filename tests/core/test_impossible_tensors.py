"""A tensor no host can hold (ConstantOfShape / Expand to 10^12 elements) is the model's problem: refused
with ``unsupported_model`` naming the node, before anything allocates, never an internal error."""

import pytest
from onnx import TensorProto, helper

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.errors import UnsupportedModelError


def tensor_of_shape_model(op: str, dims: list[int]) -> bytes:
    if op == "ConstantOfShape":
        nodes = [
            helper.make_node("ConstantOfShape", ["shape"], ["big"], value=helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])),
            helper.make_node("ReduceSum", ["big"], ["s"], keepdims=0),
            helper.make_node("Add", ["x", "s"], ["y"]),
        ]
    else:
        nodes = [helper.make_node("Expand", ["x", "shape"], ["big"]), helper.make_node("ReduceSum", ["big"], ["y"], keepdims=0)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1] if op == "ConstantOfShape" else [])],
        [helper.make_tensor("shape", TensorProto.INT64, [len(dims)], dims)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


@pytest.mark.parametrize("op", ["ConstantOfShape", "Expand"])
def test_a_trillion_elements_are_refused_naming_the_node(op):
    with pytest.raises(UnsupportedModelError) as caught:
        FlexDSAOptimizer("cpu-ort").optimize(tensor_of_shape_model(op, [10**6, 10**6]), OptimizeOptions(measure_latency=False))
    assert caught.value.code == "unsupported_model"
    assert f"{op} output 'big'" in caught.value.message and "GiB" in caught.value.message


@pytest.mark.parametrize("op", ["ConstantOfShape", "Expand"])
def test_a_modest_shape_still_optimises(op):
    result = FlexDSAOptimizer("cpu-ort").optimize(tensor_of_shape_model(op, [4, 8]), OptimizeOptions(measure_latency=False))
    assert result.report["validation"]["ok"] is True
