"""Stage 1, Ingest: good models load with their facts; every bad upload gets a FlexDSAError saying why."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from flexdsa_core.errors import ExternalDataError, InvalidModelError, UnsupportedModelError
from flexdsa_core.ingest import Ingested, ingest, save_model
from flexdsa_core.wire import length_delimited_key, varint


def matmul_model(opset: int = 17, weight_shape=(64, 32)) -> onnx.ModelProto:
    weight = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal(weight_shape).astype(np.float32), "w"
    )
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Relu", ["m"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, weight_shape[0]])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, weight_shape[1]])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], producer_name="test")
    model.ir_version = 8
    return model


def save_external(model: onnx.ModelProto, folder, location="weights.bin") -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "model.onnx")
    onnx.save_model(model, path, save_as_external_data=True, location=location, size_threshold=0)
    return path


def relocate(path: str, location: str) -> None:
    """Point every external tensor of the model at ``path`` to ``location``."""
    proto = onnx.load(path, load_external_data=False)
    for tensor in proto.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = location
    onnx.save_model(proto, path)


def run_ir(model: ir.Model, feeds):
    """Run in ONNX Runtime, reading external tensors through the IR (as the compiler does)."""
    proto = ir.serde.serialize_model(model)
    for initializer in proto.graph.initializer:
        if initializer.data_location == onnx.TensorProto.EXTERNAL:
            array = model.graph.initializers[initializer.name].const_value.numpy()
            initializer.CopyFrom(numpy_helper.from_array(array, initializer.name))
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _len_field(number: int, payload: bytes) -> bytes:
    return length_delimited_key(number) + varint(len(payload)) + payload


def nested_if_model(depth: int) -> bytes:
    """If inside If, ``depth`` deep, written at the wire level (onnx's helpers stop near 30 levels)."""

    def graph(node: bytes, name: str, out: str) -> bytes:  # GraphProto: node=1, name=2, output=12
        return (
            _len_field(1, node) + _len_field(2, name.encode())
            + _len_field(12, helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, [1, 8]).SerializeToString())
        )  # fmt: skip

    inner = graph(helper.make_node("Identity", ["x"], ["o0"]).SerializeToString(), "b0", "o0")
    for d in range(1, depth + 1):
        other = graph(helper.make_node("Identity", ["x"], [f"e{d}"]).SerializeToString(), f"e{d}", f"e{d}")
        # AttributeProto: name=1, g=6, type=20 (GRAPH=5); NodeProto: input=1, output=2, op_type=4, attribute=5
        attributes = b"".join(
            _len_field(5, _len_field(1, name) + _len_field(6, branch) + varint(20 << 3) + varint(5))
            for name, branch in ((b"then_branch", inner), (b"else_branch", other))
        )
        node = _len_field(1, b"c") + _len_field(2, f"o{d}".encode()) + _len_field(4, b"If") + attributes
        inner = graph(node, f"b{d}", f"o{d}")
    inner += _len_field(
        11, helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 8]).SerializeToString()
    )
    inner += _len_field(5, helper.make_tensor("c", onnx.TensorProto.BOOL, [], [True]).SerializeToString())
    opset = helper.make_opsetid("", 17).SerializeToString()
    # ModelProto: ir_version=1, graph=7, opset_import=8
    return varint(1 << 3) + varint(9) + _len_field(7, inner) + _len_field(8, opset)


# --- good models ---------------------------------------------------------------------------------------


def test_bytes_model_loads_with_its_facts():
    proto = matmul_model()
    data = proto.SerializeToString()
    result = ingest(data)
    assert isinstance(result, Ingested)
    assert [node.op_type for node in result.model.graph] == ["MatMul", "Relu"]
    info = result.info
    assert info["opset_imports"] == {"ai.onnx": 17}
    assert info["ir_version"] == 8
    assert info["producer"]["name"] == "test"
    assert info["node_count"] == 2
    assert info["initializer_count"] == 1
    assert info["parameter_bytes"] == 64 * 32 * 4
    assert info["domains_used"] == ["ai.onnx"]
    assert info["unknown_domains"] == []
    assert info["external_data"] is False
    import hashlib

    assert info["sha256"] == hashlib.sha256(data).hexdigest()
    assert result.warnings == []


def test_path_model_with_external_data_stays_lazy_and_computes(tmp_path):
    proto = matmul_model()
    path = save_external(proto, tmp_path / "upload")
    result = ingest(path)
    weight = result.model.graph.initializers["w"].const_value
    assert isinstance(weight, ir.ExternalTensor)  # memory-mapped on demand, not copied at load
    assert result.info["external_data"] is True
    assert result.info["external_data_files"] == ["weights.bin"]
    assert result.info["parameter_bytes"] == 64 * 32 * 4
    assert result.info["total_bytes"] == os.path.getsize(path) + os.path.getsize(
        tmp_path / "upload/weights.bin"
    )
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    want = np.maximum(x @ numpy_helper.to_array(matmul_model().graph.initializer[0]), 0)
    np.testing.assert_allclose(run_ir(result.model, {"x": x})[0], want, rtol=1e-5, atol=1e-5)


def test_unsorted_graph_is_sorted_with_a_warning():
    graph = helper.make_graph(
        [helper.make_node("Relu", ["a"], ["y"]), helper.make_node("Neg", ["x"], ["a"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    result = ingest(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    assert [node.op_type for node in result.model.graph] == ["Neg", "Relu"]
    assert any("sorted" in warning for warning in result.warnings)


def test_com_microsoft_and_local_function_domains_are_accepted():
    function = helper.make_function(
        "my.local", "Double", ["a"], ["b"], [helper.make_node("Add", ["a", "a"], ["b"])],
        [helper.make_opsetid("", 17)],
    )  # fmt: skip
    graph = helper.make_graph(
        [
            helper.make_node("Double", ["x"], ["d"], domain="my.local"),
            helper.make_node("Gelu", ["d"], ["y"], domain="com.microsoft"),
        ],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(
        graph,
        functions=[function],
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.local", 1),
                       helper.make_opsetid("com.microsoft", 1)],
    )  # fmt: skip
    result = ingest(model.SerializeToString())
    assert result.info["function_domains"] == ["my.local"]
    assert set(result.info["domains_used"]) == {"ai.onnx", "com.microsoft", "my.local"}


def test_save_model_inline_and_external(tmp_path):
    model = ingest(matmul_model().SerializeToString()).model
    files = save_model(model, tmp_path / "small.onnx")
    assert files == [tmp_path / "small.onnx"]
    assert ingest(tmp_path / "small.onnx").info["external_data"] is False

    files = save_model(model, tmp_path / "big.onnx", external_data_threshold=1000)
    assert files == [tmp_path / "big.onnx", tmp_path / "big.onnx.data"]
    reloaded = ingest(tmp_path / "big.onnx")
    assert reloaded.info["external_data_files"] == ["big.onnx.data"]
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(run_ir(reloaded.model, {"x": x})[0], run_ir(model, {"x": x})[0])


def test_save_model_moves_external_data_to_the_new_folder(tmp_path):
    source = ingest(save_external(matmul_model(), tmp_path / "in")).model
    out = tmp_path / "out"
    out.mkdir()
    files = save_model(source, out / "model.onnx")  # small, but its tensors were external: keep them so
    assert files == [out / "model.onnx", out / "model.onnx.data"]
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(
        run_ir(ingest(out / "model.onnx").model, {"x": x})[0], run_ir(source, {"x": x})[0]
    )


def test_save_model_over_its_own_folder_does_not_clobber_its_data(tmp_path):
    path = save_external(matmul_model(), tmp_path, location="model.onnx.data")
    model = ingest(path).model
    x = np.ones((2, 64), np.float32)
    want = run_ir(model, {"x": x})[0]
    files = save_model(model, path)
    assert files[1].name != "model.onnx.data"
    np.testing.assert_allclose(run_ir(ingest(path).model, {"x": x})[0], want)


# --- bad uploads ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        os.urandom(1),
        np.random.default_rng(7).bytes(4096),
        b"ir_version: 8\ngraph { node { op_type: 'Relu' } }\n",  # a text file
        b"\x00" * 64,
        b"\xff" * 64,
    ],
    ids=["empty", "one-byte", "random", "text", "zeros", "ones"],
)
def test_garbage_is_refused_as_invalid(data):
    with pytest.raises(InvalidModelError) as caught:
        ingest(data)
    assert "ONNX" in str(caught.value) or "empty" in str(caught.value)


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9, 0.99])
def test_truncated_model_is_refused_as_invalid(fraction):
    data = matmul_model().SerializeToString()
    with pytest.raises(InvalidModelError):
        ingest(data[: int(len(data) * fraction)])


def test_random_mutations_never_escape_as_raw_exceptions():
    data = bytearray(matmul_model().SerializeToString())
    rng = np.random.default_rng(3)
    for _ in range(200):
        mutated = bytearray(data)
        for index in rng.integers(0, len(data), size=4):
            mutated[index] = int(rng.integers(0, 256))
        try:
            ingest(bytes(mutated))
        except (InvalidModelError, UnsupportedModelError):
            pass


def test_missing_and_directory_paths(tmp_path):
    with pytest.raises(InvalidModelError, match="No model file"):
        ingest(tmp_path / "nope.onnx")
    with pytest.raises(InvalidModelError, match="not a file"):
        ingest(tmp_path)
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(InvalidModelError, match="empty"):
        ingest(tmp_path / "empty.onnx")
    (tmp_path / "notes.onnx").write_text("this is not a model\n")
    with pytest.raises(InvalidModelError, match="not an ONNX model"):
        ingest(tmp_path / "notes.onnx")


def test_size_limit(tmp_path):
    data = matmul_model().SerializeToString()
    with pytest.raises(UnsupportedModelError, match="limit"):
        ingest(data, max_bytes=100)
    path = save_external(matmul_model(), tmp_path)
    # The .onnx alone fits, with its external data it does not.
    with pytest.raises(UnsupportedModelError, match="external data"):
        ingest(path, max_bytes=os.path.getsize(path) + 10)


@pytest.mark.parametrize("given", ["bytes", "path"])
def test_checker_failure_is_invalid_with_the_checkers_message(given, tmp_path):
    # From a path, the checker reads the file's bytes beside the parse: its verdict is still the one raised.
    model = matmul_model()
    model.graph.node[1].op_type = "NoSuchOp"
    source = model.SerializeToString()
    if given == "path":
        source = tmp_path / "model.onnx"
        source.write_bytes(model.SerializeToString())
    with pytest.raises(InvalidModelError, match="checker.*NoSuchOp"):
        ingest(source)


@pytest.mark.parametrize("opset", [5, 6])
def test_opset_too_old(opset):
    with pytest.raises(UnsupportedModelError, match=f"opset {opset}.*oldest supported is 7"):
        ingest(matmul_model(opset=opset).SerializeToString())


def test_opset_too_new():
    newest = onnx.defs.onnx_opset_version()
    with pytest.raises(UnsupportedModelError, match=f"opset {newest + 1}"):
        ingest(matmul_model(opset=newest + 1).SerializeToString())


def test_unknown_domain_names_domain_and_ops():
    graph = helper.make_graph(
        [helper.make_node("FancyConv", ["x"], ["y"], domain="vendor.secret")],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("vendor.secret", 1)]
    )
    with pytest.raises(UnsupportedModelError, match="vendor.secret.*FancyConv") as caught:
        ingest(model.SerializeToString())
    assert caught.value.details["unknown_domains"] == {"vendor.secret": ["FancyConv"]}


def test_graph_without_outputs_is_invalid():
    model = matmul_model()
    del model.graph.output[:]
    with pytest.raises(InvalidModelError, match="no outputs"):
        ingest(model.SerializeToString())


def test_dangling_input_is_invalid():
    model = matmul_model()
    model.graph.node[1].input[0] = "ghost"
    with pytest.raises(InvalidModelError, match="ghost.*dangling"):
        ingest(model.SerializeToString())


def test_cycle_is_invalid():
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Relu", ["a"], ["b"])],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("a", onnx.TensorProto.FLOAT, [2])],
    )
    with pytest.raises(InvalidModelError, match="cycle"):
        ingest(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())


# --- external data that must not resolve ---------------------------------------------------------------


def test_bytes_with_external_data_is_refused(tmp_path):
    path = save_external(matmul_model(), tmp_path)
    with pytest.raises(ExternalDataError, match="external data.*by path"):
        ingest(open(path, "rb").read())


def test_escape_with_dotdot_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\x00" * 64 * 32 * 4)
    path = save_external(matmul_model(), tmp_path / "upload")
    relocate(path, "../secret.bin")
    with pytest.raises(ExternalDataError, match="outside the model's folder"):
        ingest(path)


def test_escape_with_absolute_path_is_refused(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\x00" * 64 * 32 * 4)
    path = save_external(matmul_model(), tmp_path / "upload")
    relocate(path, str(secret))
    with pytest.raises(ExternalDataError, match="absolute path"):
        ingest(path)


def test_escape_through_a_symlink_is_refused(tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\x00" * 64 * 32 * 4)
    path = save_external(matmul_model(), tmp_path / "upload")
    os.symlink(secret, tmp_path / "upload" / "link.bin")
    relocate(path, "link.bin")
    with pytest.raises(ExternalDataError, match="resolves outside"):
        ingest(path)


def test_missing_external_file_is_refused(tmp_path):
    path = save_external(matmul_model(), tmp_path)
    os.remove(tmp_path / "weights.bin")
    with pytest.raises(ExternalDataError, match="missing"):
        ingest(path)


def test_truncated_external_file_is_refused(tmp_path):
    path = save_external(matmul_model(), tmp_path)
    with open(tmp_path / "weights.bin", "r+b") as stream:
        stream.truncate(100)
    with pytest.raises(ExternalDataError, match="truncated"):
        ingest(path)


def test_hard_linked_external_file_is_refused(tmp_path):
    path = save_external(matmul_model(), tmp_path / "upload")
    os.link(tmp_path / "upload" / "weights.bin", tmp_path / "elsewhere.bin")
    with pytest.raises(ExternalDataError, match="hard links"):
        ingest(path)


def test_ir_version_newer_than_onnxruntime_is_lowered_and_the_model_still_optimises():
    from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
    from flexdsa_core.ingest import runtime_max_ir_version

    newest = runtime_max_ir_version()
    text = f"""
    <ir_version: {newest + 1}, opset_import: ["" : 17]>
    g (float[2, 4] x) => (float[2, 4] y) {{
        a = Identity(x)
        y = Relu(a)
    }}
    """
    data = onnx.parser.parse_model(text).SerializeToString()
    ingested = ingest(data)
    assert ingested.model.ir_version == newest
    assert ingested.info["ir_version_lowered_from"] == newest + 1
    assert any("IR version" in w for w in ingested.warnings)
    result = FlexDSAOptimizer("cpu-ort").optimize(data, OptimizeOptions(measure_latency=False))
    assert result.report["validation"]["ok"]


@pytest.mark.parametrize("field", ["offset", "length"])
@pytest.mark.parametrize("value", [2**63, 2**64, 2**64 + 5, 10**40])
def test_external_offset_or_length_beyond_int64_is_refused_with_the_field(tmp_path, field, value):
    path = save_external(matmul_model(), tmp_path)
    proto = onnx.load(path, load_external_data=False)
    for tensor in proto.graph.initializer:
        entries = {entry.key: entry for entry in tensor.external_data}
        entry = entries.get(field) or tensor.external_data.add()
        entry.key, entry.value = field, str(value)
    onnx.save_model(proto, path)
    with pytest.raises(ExternalDataError, match=f"{field} {value} is outside 0..2\\^63-1") as raised:
        ingest(path)
    assert raised.value.details[field] == str(value)


def test_onnx_runtime_memory_marker_is_refused_by_name(tmp_path):
    path = save_external(matmul_model(), tmp_path)
    relocate(path, "*/_ORT_MEM_ADDR_/*")
    with pytest.raises(ExternalDataError, match="in-memory marker"):
        ingest(path)


def test_nesting_past_the_parser_depth_is_told_apart_from_garbage():
    assert [n.op_type for n in ingest(nested_if_model(8)).model.graph] == ["If"]  # nesting itself is fine
    with pytest.raises(UnsupportedModelError, match="nests messages deeper") as caught:
        ingest(nested_if_model(300))
    assert caught.value.details == {"reason": "nesting_too_deep"}
