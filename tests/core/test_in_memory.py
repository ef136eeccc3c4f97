"""ONNX Runtime sessions with the weights read from memory give the same outputs as from the protobuf, carry
no weight data in the protobuf, and leave the model as it was."""

from __future__ import annotations

import gc
import os

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from flexdsa_core import in_memory
from flexdsa_core.in_memory import InMemoryModel, arrays_scope
from flexdsa_core.ingest import ingest
from flexdsa_core.kernel_timing import single_node_session
from flexdsa_core.op_costs import TensorInfo
from flexdsa_core.ort_runs import session

MLP = """
<ir_version: 10, opset_import: ["" : 17]>
mlp (float[N,256] x) => (float[N,8] y) {
    h = MatMul(x, w1)
    r = Relu(h)
    z = MatMul(r, w2)
    y = Add(z, b)
}
"""


def _mlp_proto() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    proto = onnx.parser.parse_model(MLP)
    for name, shape in (("w1", (256, 512)), ("w2", (512, 8)), ("b", (8,))):
        proto.graph.initializer.append(
            onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
        )
    proto.doc_string = "kept as uploaded"
    return proto


def _outputs(source, feeds):
    sess = session(source)
    return sess.run(None, feeds)[0]


def test_a_model_from_ir_runs_as_its_bytes_do_without_its_weights_in_the_protobuf():
    proto = _mlp_proto()
    model = ir.serde.deserialize_model(proto)
    before = {name: value.const_value for name, value in model.graph.initializers.items()}
    feeds = {"x": np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)}
    loaded = InMemoryModel.from_ir(model)
    assert sorted(loaded.weights) == ["w1", "w2"]  # the 32-byte bias stays in the protobuf
    assert len(loaded.proto) < 2048 < proto.ByteSize()
    np.testing.assert_array_equal(_outputs(loaded, feeds), _outputs(proto.SerializeToString(), feeds))
    after = {name: value.const_value for name, value in model.graph.initializers.items()}
    assert all(after[name] is tensor for name, tensor in before.items())  # put back, not copies


def test_an_upload_from_its_parsed_proto_keeps_every_other_field():
    proto = _mlp_proto()
    ingested = ingest(proto.SerializeToString())
    assert ingested.proto is not None
    loaded = InMemoryModel.from_proto(ingested.proto, ingested.model)
    light = onnx.ModelProto.FromString(loaded.proto)
    assert light.doc_string == "kept as uploaded" and [n.op_type for n in light.graph.node] == [
        "MatMul", "Relu", "MatMul", "Add",
    ]  # fmt: skip
    assert [t.data_location for t in light.graph.initializer] == [onnx.TensorProto.EXTERNAL] * 2 + [0]
    feeds = {"x": np.ones((2, 256), np.float32)}
    np.testing.assert_array_equal(_outputs(loaded, feeds), _outputs(proto.SerializeToString(), feeds))


def test_a_weight_becomes_an_array_once_per_scope_on_a_64_byte_boundary():
    model = ir.serde.deserialize_model(_mlp_proto())
    with arrays_scope():
        first = session(InMemoryModel.from_ir(model), level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        second = session(InMemoryModel.from_ir(model), level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    arrays = first.flexdsa_weights[0]
    assert [a is b for a, b in zip(arrays, second.flexdsa_weights[0], strict=True)] == [True, True]
    assert all(a.ctypes.data % in_memory.ALIGNMENT == 0 for a in arrays)
    outside = session(InMemoryModel.from_ir(model))  # no scope: made afresh
    assert outside.flexdsa_weights[0][0] is not arrays[0]


def test_a_kernel_with_a_large_constant_is_timed_from_memory():
    weight = np.random.default_rng(2).standard_normal((512, 256)).astype(np.float32)
    node = onnx.helper.make_node("MatMul", ["a", "b"], ["y"])
    inputs = [("a", TensorInfo((4, 512), "float32"), None), ("b", TensorInfo((512, 256), "float32"), weight)]
    sess = single_node_session(node, inputs, ["y"], {"": 17}, ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    a = np.ones((4, 512), np.float32)
    np.testing.assert_allclose(sess.run(None, {"a": a})[0], a @ weight, rtol=1e-5, atol=1e-4)
    assert sess.flexdsa_weights[0][0].ctypes.data % in_memory.ALIGNMENT == 0


def _constant_weights_proto() -> onnx.ModelProto:
    """The MLP with its weights as Constant nodes, as paddle2onnx writes every weight."""
    proto = _mlp_proto()
    constants = [
        onnx.helper.make_node("Constant", [], [tensor.name], value=tensor) for tensor in proto.graph.initializer
    ]
    del proto.graph.initializer[:]
    nodes = [*constants, *proto.graph.node]
    del proto.graph.node[:]
    proto.graph.node.extend(nodes)
    return proto


def test_weights_written_as_constant_nodes_go_to_onnx_runtime_from_memory_with_the_same_outputs():
    """A Constant holding a weight reaches ONNX Runtime as an in-memory initializer (it makes every Constant
    an initializer on load: the same graph), from an onnx_ir model and from a parsed upload alike; the model
    is left as it was, and small constants stay nodes."""
    proto = _constant_weights_proto()
    feeds = {"x": np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)}
    want = _outputs(proto.SerializeToString(), feeds)
    model = ir.serde.deserialize_model(proto)
    before = {node.outputs[0].name: node.attributes["value"].value for node in model.graph if node.op_type == "Constant"}
    for loaded in (InMemoryModel.from_ir(model, finished=False), InMemoryModel.from_proto(proto, model)):
        assert sorted(loaded.weights) == ["w1", "w2"]  # the 32-byte bias stays a Constant in the protobuf
        assert len(loaded.proto) < 2048 < proto.ByteSize()
        np.testing.assert_array_equal(_outputs(loaded, feeds), want)
    after = {node.outputs[0].name: node.attributes["value"].value for node in model.graph if node.op_type == "Constant"}
    assert after.keys() == {"w1", "w2", "b"} and all(after[name] is before[name] for name in after)


def test_owned_arrays_keep_the_bytes_and_sessions_read_them_in_place():
    """A model parsed from a file (the cpu-ort adapter's ONNX Runtime layout) gets arrays of its own, so the
    parsed protobuf is not kept beside them: same serialised bytes, same outputs, no second copy per session."""
    proto = _mlp_proto()
    model = ir.serde.deserialize_model(proto)
    want = ir.to_proto(model).SerializeToString()
    feeds = {"x": np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)}
    in_memory.owned_arrays(model)
    tensors = {name: value.const_value for name, value in model.graph.initializers.items()}
    assert all(isinstance(t, ir.Tensor) and t.raw.ctypes.data % in_memory.ALIGNMENT == 0 for t in tensors.values())
    assert ir.to_proto(model).SerializeToString() == want
    loaded = InMemoryModel.from_ir(model)
    with arrays_scope():
        sess = session(loaded)
        arrays, _ = sess.flexdsa_weights
        assert all(any(array is tensors[name].raw for array in arrays) for name in ("w1", "w2"))  # not copied
        np.testing.assert_array_equal(sess.run(None, feeds)[0], _outputs(proto.SerializeToString(), feeds))


def test_owned_arrays_share_the_weights_the_model_was_made_from_where_every_bit_is_the_same():
    """ONNX Runtime's offline layout (cpu-ort) writes a model whose weights other than convolution filters are
    the input's as they were: those take the input's arrays, and a weight that differs in a single bit (-0.0
    against 0.0, which compare equal as floats) gets a copy of its own."""

    def with_first_w2(value: float) -> onnx.ModelProto:
        proto = _mlp_proto()
        w2 = next(init for init in proto.graph.initializer if init.name == "w2")
        array = onnx.numpy_helper.to_array(w2).copy()
        array[0, 0] = value
        w2.CopyFrom(onnx.numpy_helper.from_array(array, "w2"))
        return proto

    source = ir.serde.deserialize_model(with_first_w2(0.0))
    in_memory.detach_from_proto(source)  # aligned arrays, as a job's models hold
    made = ir.serde.deserialize_model(with_first_w2(-0.0))
    want = ir.to_proto(made).SerializeToString()
    in_memory.owned_arrays(made, share_with=source)
    own = {name: value.const_value.raw for name, value in made.graph.initializers.items()}
    assert own["w1"] is source.graph.initializers["w1"].const_value.raw
    assert own["w2"] is not source.graph.initializers["w2"].const_value.raw
    assert all(isinstance(array, np.ndarray) and array.ctypes.data % in_memory.ALIGNMENT == 0 for array in own.values())
    assert ir.to_proto(made).SerializeToString() == want  # the same bytes either way


def test_share_weights_takes_an_earlier_models_tensor_only_where_everything_serialised_is_the_same():
    earlier = ir.serde.deserialize_model(_mlp_proto())
    in_memory.detach_from_proto(earlier)
    model = ir.serde.deserialize_model(_mlp_proto())
    in_memory.detach_from_proto(model)
    model.graph.initializers["w2"].const_value.doc_string = "made by another pass"
    want = ir.to_proto(model).SerializeToString()
    saved = in_memory.share_weights(model, [earlier])
    tensors = {name: value.const_value for name, value in model.graph.initializers.items()}
    assert tensors["w1"] is earlier.graph.initializers["w1"].const_value
    assert tensors["w2"] is not earlier.graph.initializers["w2"].const_value  # its doc string differs
    assert saved == tensors["w1"].nbytes  # the 32-byte bias stays in its TensorProto form, not shared
    assert ir.to_proto(model).SerializeToString() == want


def test_the_cpu_ort_layout_shares_the_weights_it_leaves_as_they_were():
    from flexdsa_core.targets.cpu_ort.adapter import ort_layout

    source = ir.serde.deserialize_model(_mlp_proto())
    in_memory.detach_from_proto(source)
    layout = ort_layout(source)
    shared = [
        name for name, value in layout.graph.initializers.items()
        if name in source.graph.initializers and value.const_value.raw is source.graph.initializers[name].const_value.raw
    ]  # fmt: skip
    assert {"w1", "w2"} <= set(shared), sorted(layout.graph.initializers)
    feeds = {"x": np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)}
    np.testing.assert_allclose(
        _outputs(InMemoryModel.from_ir(layout), feeds), _outputs(_mlp_proto().SerializeToString(), feeds), rtol=1e-5
    )


def _rss() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_a_parsed_upload_is_freed_once_its_tensors_are_detached_with_the_same_bytes_and_outputs():
    """An onnx_ir model parsed from a protobuf reads its tensors from it, which keeps the whole message alive
    beside the copies sessions make. Detached, the model holds its tensors itself: large raw ones as aligned
    arrays sessions read in place, the rest (a tensor written as ``float_data``) in their exact form; the
    model serialises to the same bytes and runs to the same outputs, and the parsed message goes."""
    proto = _constant_weights_proto()
    extra = onnx.helper.make_tensor("scale", onnx.TensorProto.FLOAT, [8], [0.5] * 8)  # float_data, not raw
    proto.graph.initializer.append(extra)
    proto.graph.node.append(onnx.helper.make_node("Mul", ["y", "scale"], ["scaled"]))
    proto.graph.output.append(onnx.helper.make_tensor_value_info("scaled", onnx.TensorProto.FLOAT, ["N", 8]))
    data = proto.SerializeToString()
    feeds = {"x": np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)}
    want = _outputs(data, feeds)

    model = ir.serde.deserialize_model(onnx.ModelProto.FromString(data))
    serialised = ir.to_proto(model).SerializeToString()  # onnx_ir's own form, which detaching must not change
    in_memory.detach_from_proto(model)
    assert ir.to_proto(model).SerializeToString() == serialised
    weights = {n.outputs[0].name: n.attributes["value"].value for n in model.graph if n.op_type == "Constant"}
    assert all(isinstance(weights[name], ir.Tensor) for name in ("w1", "w2"))
    assert weights["w1"].raw.ctypes.data % in_memory.ALIGNMENT == 0
    assert isinstance(model.graph.initializers["scale"].const_value, ir.serde.TensorProtoTensor)
    with arrays_scope():
        sess = session(InMemoryModel.from_ir(model))
        arrays, _ = sess.flexdsa_weights
        assert any(array is weights["w1"].raw for array in arrays)  # read in place, not copied
        got = sess.run(None, feeds)
    reference = session(data).run(None, feeds)
    np.testing.assert_array_equal(got[0], want)
    for a, b in zip(got, reference, strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_detached_model_holds_its_weights_once_not_beside_the_parsed_message():
    """64 MiB of weight in a Constant node: parsed and detached, the process holds it once (the model's own
    array); were any tensor still reading the parsed message, the message would stay too (twice the size)."""
    size = 64 * 2**20
    weight = np.random.default_rng(0).standard_normal(size // 4, dtype=np.float32).reshape(4096, -1)
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("Constant", [], ["w"], value=onnx.numpy_helper.from_array(weight, "w")),
            onnx.helper.make_node("MatMul", ["x", "w"], ["y"]),
        ],
        "big",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4096])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, weight.shape[1]])],
    )
    data = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]).SerializeToString()
    del weight, graph
    gc.collect()
    before = _rss()
    model = ir.serde.deserialize_model(onnx.ModelProto.FromString(data))
    in_memory.detach_from_proto(model)
    gc.collect()
    grown = _rss() - before
    assert 0.9 * size < grown < 1.4 * size, grown / size
