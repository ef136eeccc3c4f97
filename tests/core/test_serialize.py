"""``serialized.serialize``: the bytes ``ir.to_proto(model).SerializeToString()`` makes, without the second copy
of the weights, for every kind of tensor an initializer can hold."""

from __future__ import annotations

import gc
import os

import ml_dtypes
import numpy as np
import onnx
import onnx_ir as ir
import pytest

from flexdsa_core.in_memory import aligned, detach_from_proto
from flexdsa_core.serialized import STREAM_MIN_BYTES, serialize, write

LARGE = STREAM_MIN_BYTES // 4 + 7  # float32 elements: streamed


def _model() -> ir.Model:
    """Initializers of every kind, large and small, in a graph with a subgraph, a function, doc strings and
    metadata on the model, the graph and a tensor."""
    rng = np.random.default_rng(0)
    tensors = [
        onnx.numpy_helper.from_array(rng.standard_normal(LARGE).astype(np.float32), "f32"),
        onnx.numpy_helper.from_array(rng.standard_normal(LARGE).astype(np.float16), "f16"),
        onnx.numpy_helper.from_array(rng.integers(-128, 127, LARGE, dtype=np.int8), "i8"),
        onnx.numpy_helper.from_array(rng.integers(0, 2, LARGE).astype(bool), "flags"),
        onnx.numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "small"),
        onnx.helper.make_tensor("listed", onnx.TensorProto.FLOAT, [LARGE], rng.standard_normal(LARGE).tolist()),
        onnx.helper.make_tensor("words", onnx.TensorProto.STRING, [2], [b"a", b"b"]),
    ]
    tensors[0].doc_string = "a documented weight"
    entry = tensors[1].metadata_props.add()
    entry.key, entry.value = "source", "test"
    branch = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["small"], ["out"])], "branch", [],
        [onnx.helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [8])],
    )  # fmt: skip
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("If", ["cond"], ["picked"], then_branch=branch, else_branch=branch),
            onnx.helper.make_node("Double", ["picked"], ["y"], domain="local"),
        ],
        "kinds",
        [onnx.helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, [])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [8])],
        initializer=tensors,
        doc_string="graph doc",
    )
    function = onnx.helper.make_function(
        "local", "Double", ["x"], ["z"], [onnx.helper.make_node("Add", ["x", "x"], ["z"])],
        [onnx.helper.make_opsetid("", 17)],
    )  # fmt: skip
    proto = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("local", 1)],
        functions=[function], producer_name="test", doc_string="model doc",
    )  # fmt: skip
    onnx.helper.set_model_props(proto, {"author": "test"})
    return ir.serde.deserialize_model(proto)


def _add(model: ir.Model, name: str, tensor: ir.TensorProtocol) -> None:
    value = ir.Value(name=name, shape=tensor.shape, type=ir.TensorType(tensor.dtype), const_value=tensor)
    model.graph.register_initializer(value)


def test_the_same_bytes_for_tensors_as_parsed():
    model = _model()
    assert serialize(model) == ir.to_proto(model).SerializeToString()


def test_written_to_a_file_the_same_bytes(tmp_path):
    model = _model()
    detach_from_proto(model)
    write(model, tmp_path / "model.onnx")
    assert (tmp_path / "model.onnx").read_bytes() == ir.to_proto(model).SerializeToString()


def test_the_same_bytes_for_tensors_of_their_own_and_made_by_passes():
    model = _model()
    detach_from_proto(model)  # aligned arrays for the large raw ones
    rng = np.random.default_rng(1)
    _add(model, "bf16", ir.Tensor(rng.standard_normal(LARGE).astype(ml_dtypes.bfloat16), dtype=ir.DataType.BFLOAT16))
    _add(model, "int4", ir.Tensor(rng.integers(-8, 7, 2 * LARGE).astype(ml_dtypes.int4), dtype=ir.DataType.INT4))
    _add(model, "strided", ir.Tensor(rng.standard_normal((LARGE, 2)).astype(np.float32)[:, 0]))  # not contiguous
    _add(model, "renamed", ir.Tensor(aligned(rng.standard_normal(LARGE).astype(np.float32)), name="old name"))
    want = ir.to_proto(model).SerializeToString()
    assert serialize(model) == want
    assert onnx.ModelProto.FromString(want).graph.initializer[-1].name == "renamed"


def test_a_model_with_no_large_initializer_is_serialised_as_a_whole():
    model = ir.serde.deserialize_model(onnx.parser.parse_model(
        '<ir_version: 9, opset_import: ["" : 17]> g (float[2] x) => (float[2] y) { y = Relu(x) }'
    ))  # fmt: skip
    assert serialize(model) == ir.to_proto(model).SerializeToString()


@pytest.mark.parametrize("count", [1, 3])
def test_the_weights_are_put_back_after_serialising(count):
    model = _model()
    before = {name: value.const_value for name, value in model.graph.initializers.items()}
    for _ in range(count):
        serialize(model)
    assert {name: value.const_value for name, value in model.graph.initializers.items()} == before
    assert all(model.graph.initializers[name].const_value is tensor for name, tensor in before.items())


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _weight_model(size: int) -> ir.Model:
    weight = aligned(np.random.default_rng(0).standard_normal(size // 4, dtype=np.float32).reshape(4096, -1))
    return ir.Model(
        ir.Graph([], [], nodes=[], initializers=[ir.Value(name="w", const_value=ir.Tensor(weight, name="w"))], name="g"),
        ir_version=9,
    )


def _fresh_peak() -> int:
    """Resets the peak (VmHWM) to the current RSS, and returns that RSS."""
    gc.collect()
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    return _rss()


def test_the_weights_are_copied_once_into_the_bytes_not_twice():
    """64 MiB of weight: the bytes take 64 MiB more, not the protobuf message's 64 as well (measured as the
    process's peak, which a transient message would raise: ``ru_maxrss`` over a fresh high-water mark)."""
    size = 64 * 2**20
    model = _weight_model(size)
    before = _fresh_peak()
    data = serialize(model)
    peak = _hwm()
    assert len(data) > size
    assert peak - before < 1.4 * size, (peak - before) / size
    del data


def test_written_to_a_file_the_weights_are_not_copied_in_memory(tmp_path):
    """``write``: the weight goes from its array to the file; the peak stays far below one more copy of it (the
    bundle's packaging held the whole serialisation: BERT-base +415 MiB)."""
    size = 64 * 2**20
    model = _weight_model(size)
    before = _fresh_peak()
    write(model, tmp_path / "model.onnx")
    peak = _hwm()
    assert (tmp_path / "model.onnx").stat().st_size > size
    assert peak - before < 0.25 * size, (peak - before) / size


def _hwm() -> int:
    with open("/proc/self/status") as handle:
        line = next(line for line in handle if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024
