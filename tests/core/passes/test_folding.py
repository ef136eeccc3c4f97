"""constant_folding and shape_folding: constant sub-graphs become initializers, within the size cap; shape
arithmetic on static shapes disappears; a >2 GB external weight is never loaded."""

from __future__ import annotations

import os
import resource

import numpy as np
import onnx
import onnx_ir as ir
from onnx import helper

from flexdsa_core.ingest import ingest
from flexdsa_core.options import OptimizeOptions
from flexdsa_core.passes import generic_passes, run_passes
from tests.core.passes.helpers import apply_pass, assert_rewrites, assert_unchanged, op_types, parse

HEAD = '<ir_version: 8, opset_import: ["" : 17]>\n'

SHAPE_CHAIN = (
    HEAD
    + """g (float[2,3,4] x) => (float[2,12] y) {
    s = Shape(x)
    i0 = Constant<value = int64 {0}>()
    d0 = Gather<axis = 0>(s, i0)
    u0 = Unsqueeze(d0, i0)
    m1 = Constant<value = int64[1] {-1}>()
    shape = Concat<axis = 0>(u0, m1)
    y = Reshape(x, shape)
}"""
)


def test_shape_chain_folds_to_a_constant_reshape():
    optimized = assert_rewrites("shape_folding", SHAPE_CHAIN, ["Reshape"])
    shape = onnx.numpy_helper.to_array(optimized.graph.initializer[0])
    assert shape.tolist() == [2, -1]


def test_shape_chain_on_a_dynamic_dim_is_kept():
    text = SHAPE_CHAIN.replace("float[2,3,4] x", "float[N,3,4] x").replace("float[2,12] y", "float[N,12] y")
    assert_unchanged("shape_folding", text)


def test_shape_folding_leaves_float_maths_alone():
    assert_unchanged(
        "shape_folding",
        HEAD + "g (float[2] x) => (float[2] y) { a = Constant<value = float[2] {1, 2}>()\n"
        "b = Constant<value = float[2] {3, 4}>()\n c = Add(a, b)\n y = Mul(x, c) }",
    )


def test_constant_subgraph_folds():
    optimized = assert_rewrites(
        "constant_folding",
        HEAD + "g (float[2] x) => (float[2] y) { a = Constant<value = float[2] {1, 2}>()\n"
        "b = Constant<value = float[2] {3, 4}>()\n c = Add(a, b)\n e = Exp(c)\n y = Mul(x, e) }",
        ["Mul"],
        rtol=1e-6,
    )
    folded = onnx.numpy_helper.to_array(optimized.graph.initializer[0])
    np.testing.assert_allclose(folded, np.exp(np.array([4, 6], np.float32)), rtol=1e-6)


def test_constant_folding_respects_the_size_cap():
    text = (
        HEAD + "g (float[64,64] x) => (float[64,64] y) { s = Constant<value = int64[2] {64, 64}>()\n"
        "one = Constant<value = float[1] {1}>()\n big = Expand(one, s)\n e = Exp(big)\n y = Mul(x, e) }"
    )
    # 64*64 floats = 16 KiB: folded under the default cap, refused under a 1 KiB cap.
    assert_rewrites("constant_folding", text, ["Mul"], rtol=1e-6)
    optimized, _ = apply_pass("constant_folding", parse(text), max_fold_bytes=1024)
    assert "Expand" in op_types(optimized) and "Exp" in op_types(optimized)
    onnx.checker.check_model(optimized)


def test_constant_folding_keeps_graph_input_initializers():
    # An initializer that is also a graph input may be overridden at run time: not a constant.
    model = parse(
        HEAD
        + "g (float[2] x, float[2] w) => (float[2] y) < float[2] w = {1, 2} > { e = Exp(w)\n y = Mul(x, e) }"
    )
    optimized, modified = apply_pass("constant_folding", model)
    assert not modified and op_types(optimized) == ["Exp", "Mul"]


def _huge_external_model(folder) -> str:
    """A model whose weight is a 2.5 GiB external tensor, stored as a sparse file (no real disk use)."""
    rows = 640 * 1024
    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
            helper.make_node("Add", ["w", "one"], ["w1"]),
            helper.make_node("ReduceSum", ["wt", "axes"], ["s"], keepdims=0),
            helper.make_node("ReduceSum", ["w1", "axes"], ["s1"], keepdims=0),
            helper.make_node("Add", ["s", "s1"], ["t"]),
            helper.make_node("Mul", ["x", "t"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
        [
            helper.make_tensor("one", onnx.TensorProto.FLOAT, [1], [1.0]),
            helper.make_tensor("axes", onnx.TensorProto.INT64, [2], [0, 1]),
        ],
    )
    weight = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[rows, 1024])
    weight.data_location = onnx.TensorProto.EXTERNAL
    for key, value in {"location": "w.bin", "offset": "0", "length": str(rows * 1024 * 4)}.items():
        weight.external_data.add(key=key, value=value)
    graph.initializer.append(weight)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path = os.path.join(folder, "huge.onnx")
    onnx.save_model(model, path)
    with open(os.path.join(folder, "w.bin"), "wb") as stream:
        stream.truncate(rows * 1024 * 4)
    return path


def test_generic_passes_never_load_a_huge_external_weight(tmp_path):
    ingested = ingest(_huge_external_model(tmp_path))
    assert ingested.info["parameter_bytes"] > 2**31
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    model = ingested.model
    run_passes(model, generic_passes(OptimizeOptions()))
    rss_grew_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before
    assert rss_grew_kib < 512 * 1024, f"passes touched the weight: max RSS grew {rss_grew_kib} KiB"
    weight = model.graph.initializers["w"].const_value
    assert isinstance(weight, ir.ExternalTensor)
    assert {"Transpose", "ReduceSum"} <= {node.op_type for node in model.graph}
