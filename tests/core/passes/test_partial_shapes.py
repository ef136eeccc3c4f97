"""partial_shape_folding: shape arithmetic over the static dims of a tensor folds while the batch stays
symbolic; Reshape/Expand targets become constants (0 = copy, -1 = the rest, 1 = broadcast keeps);
partly symbolic shapes are rebuilt from Shape slices; numerics hold at other batch sizes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir

from flexdsa_core.options import OptimizeOptions
from flexdsa_core.passes import generic_passes, run_passes
from tests.core.passes.helpers import (
    apply_pass,
    assert_rewrites,
    assert_same_outputs,
    assert_unchanged,
    op_types,
    parse,
    random_inputs,
)
from tests.core.passes.windowed_attention import windowed_attention_model

HEAD = '<ir_version: 8, opset_import: ["" : 17]>\n'
NAME = "partial_shape_folding"


def _initializer(model: onnx.ModelProto, consumer_op: str, index: int = 1) -> list[int]:
    node = next(n for n in model.graph.node if n.op_type == consumer_op)
    init = {i.name: i for i in model.graph.initializer}[node.input[index]]
    return onnx.numpy_helper.to_array(init).tolist()


def test_slice_of_the_static_dims_is_a_constant():
    # Shape(x)[2:4] of x:[batch, 3, 8, 8] is [8, 8] whatever the batch.
    text = (
        HEAD
        + """g (float[batch,3,8,8] x, float[64] flat) => (float[8,8] y) {
        s = Shape(x)
        starts = Constant<value = int64[1] {2}>()
        ends = Constant<value = int64[1] {4}>()
        hw = Slice(s, starts, ends)
        y = Reshape(flat, hw)
    }"""
    )
    optimized = assert_rewrites(NAME, text, ["Reshape"])
    assert _initializer(optimized, "Reshape") == [8, 8]


def test_scalar_gather_of_a_static_dim_is_a_constant():
    text = (
        HEAD
        + """g (float[batch,3,8] x) => (float[batch,24] y) {
        s = Shape(x)
        i1 = Constant<value = int64 {1}>()
        i2 = Constant<value = int64 {2}>()
        c = Gather<axis = 0>(s, i1)
        w = Gather<axis = 0>(s, i2)
        cw = Mul(c, w)
        axes = Constant<value = int64[1] {0}>()
        cw1 = Unsqueeze(cw, axes)
        minus = Constant<value = int64[1] {-1}>()
        shape = Concat<axis = 0>(minus, cw1)
        y = Reshape(x, shape)
    }"""
    )
    optimized = assert_rewrites(NAME, text, ["Reshape"])
    assert _initializer(optimized, "Reshape") == [-1, 24]


RESHAPE_KEEPING_BATCH = (
    HEAD
    + """g (float[batch,3,4,4] x) => (float[batch,3,16] y) {
    s = Shape(x)
    i0 = Constant<value = int64 {0}>()
    b = Gather<axis = 0>(s, i0)
    axes = Constant<value = int64[1] {0}>()
    b1 = Unsqueeze(b, axes)
    rest = Constant<value = int64[2] {3, -1}>()
    shape = Concat<axis = 0>(b1, rest)
    y = Reshape(x, shape)
}"""
)


def test_reshape_target_keeps_only_the_batch_dynamic():
    # Concat([Unsqueeze(Gather(Shape(x), 0)), [3, -1]]) -> [0, 3, -1]: 0 copies the batch from x.
    optimized = assert_rewrites(NAME, RESHAPE_KEEPING_BATCH, ["Reshape"])
    assert _initializer(optimized, "Reshape") == [0, 3, -1]
    assert_same_outputs(
        parse(RESHAPE_KEEPING_BATCH), optimized, feeds={"x": np.ones((5, 3, 4, 4), np.float32)}
    )


def test_allowzero_reshape_rebuilds_the_shape_instead_of_copying():
    # With allowzero=1 a 0 means an empty dim: the batch cannot be copied, the shape is rebuilt from a slice.
    text = RESHAPE_KEEPING_BATCH.replace("y = Reshape(x, shape)", "y = Reshape<allowzero = 1>(x, shape)")
    optimized = assert_rewrites(NAME, text, ["Shape", "Concat", "Reshape"])
    shape_node = optimized.graph.node[0]
    assert {a.name: a.i for a in shape_node.attribute} == {"start": 0, "end": 1}


def test_multiple_of_the_batch_becomes_minus_one():
    # Windows of a batch: [batch * 16, 8] with x:[batch, 4, 4, 8] -> [-1, 8].
    text = (
        HEAD
        + """g (float[batch,4,4,8] x) => (float[N,8] y) {
        s = Shape(x)
        i0 = Constant<value = int64 {0}>()
        b = Gather<axis = 0>(s, i0)
        sixteen = Constant<value = int64 {16}>()
        rows = Mul(b, sixteen)
        axes = Constant<value = int64[1] {0}>()
        rows1 = Unsqueeze(rows, axes)
        eight = Constant<value = int64[1] {8}>()
        shape = Concat<axis = 0>(rows1, eight)
        y = Reshape(x, shape)
    }"""
    )
    optimized = assert_rewrites(NAME, text, ["Reshape"])
    assert _initializer(optimized, "Reshape") == [-1, 8]


def test_expand_target_keeps_the_batch_by_broadcasting():
    text = (
        HEAD
        + """g (float[batch,1,4] x) => (float[batch,3,4] y) {
        s = Shape(x)
        i0 = Constant<value = int64 {0}>()
        b = Gather<axis = 0>(s, i0)
        axes = Constant<value = int64[1] {0}>()
        b1 = Unsqueeze(b, axes)
        rest = Constant<value = int64[2] {3, 4}>()
        shape = Concat<axis = 0>(b1, rest)
        y = Expand(x, shape)
    }"""
    )
    optimized = assert_rewrites(NAME, text, ["Expand"])
    assert _initializer(optimized, "Expand") == [1, 3, 4]


def test_symbolic_shape_for_another_op_is_rebuilt_from_a_slice():
    # ConstantOfShape needs the real batch: Concat(Shape(x, 0, 1), [3, 4]) instead of Shape/Gather/Unsqueeze.
    text = (
        HEAD
        + """g (float[batch,2] x) => (float[batch,3,4] y) {
        s = Shape(x)
        i0 = Constant<value = int64 {0}>()
        b = Gather<axis = 0>(s, i0)
        axes = Constant<value = int64[1] {0}>()
        b1 = Unsqueeze(b, axes)
        rest = Constant<value = int64[2] {3, 4}>()
        shape = Concat<axis = 0>(b1, rest)
        y = ConstantOfShape<value = float[1] {1}>(shape)
    }"""
    )
    optimized = assert_rewrites(NAME, text, ["Shape", "Concat", "ConstantOfShape"])
    assert_same_outputs(parse(text), optimized, feeds={"x": np.ones((7, 2), np.float32)})


def test_an_int32_shape_rebuilt_from_slices_stays_int32():
    # tf2onnx computes shapes in int32 (Shape -> Cast(int32) -> Concat ... -> Cast(int64) -> Expand): the
    # rebuilt Concat is int64 (Shape slices are) and is cast back, so the int32 consumers still load.
    text = (
        HEAD
        + """g (float[batch,2] x) => (float[batch,3,4] y) {
        s64 = Shape(x)
        s = Cast<to = 6>(s64)
        i0 = Constant<value = int32 {0}>()
        b = Gather<axis = 0>(s, i0)
        axes = Constant<value = int64[1] {0}>()
        b1 = Unsqueeze(b, axes)
        rest = Constant<value = int32[2] {3, 4}>()
        shape = Concat<axis = 0>(b1, rest)
        one = Constant<value = int32[3] {1, 1, 1}>()
        shape2 = Max(shape, one)
        target = Cast<to = 7>(shape2)
        y = ConstantOfShape<value = float[1] {1}>(target)
    }"""
    )
    optimized = assert_rewrites(NAME, text, ["Shape", "Concat", "Cast", "Constant", "Max", "Cast", "ConstantOfShape"])
    concat, cast = (n for n in optimized.graph.node if n.op_type in ("Concat", "Cast") and n.input[0] != "shape2")
    assert onnx.helper.get_attribute_value(cast.attribute[0]) == onnx.TensorProto.INT32
    assert cast.input[0] == concat.output[0]
    assert_same_outputs(parse(text), optimized, feeds={"x": np.ones((7, 2), np.float32)})


def test_two_symbolic_dims_in_other_places_are_not_folded():
    # [seq, batch, 8] from x:[batch, seq, 8]: neither dim is x's at that axis; the target stays computed.
    text = (
        HEAD
        + """g (float[batch,seq,8] x) => (float[seq,batch,8] y) {
        s = Shape(x)
        i0 = Constant<value = int64 {0}>()
        i1 = Constant<value = int64 {1}>()
        b = Gather<axis = 0>(s, i0)
        t = Gather<axis = 0>(s, i1)
        axes = Constant<value = int64[1] {0}>()
        b1 = Unsqueeze(b, axes)
        t1 = Unsqueeze(t, axes)
        eight = Constant<value = int64[1] {8}>()
        shape = Concat<axis = 0>(t1, b1, eight)
        y = Reshape(x, shape)
    }"""
    )
    optimized, modified = apply_pass(NAME, parse(text))
    assert modified  # rebuilt from two slices, not folded
    assert Counter(op_types(optimized)) == Counter({"Shape": 2, "Concat": 1, "Reshape": 1})
    onnx.checker.check_model(optimized, full_check=True)
    assert_same_outputs(parse(text), optimized, feeds={"x": np.ones((2, 5, 8), np.float32)})


def test_a_shape_read_from_data_is_left_alone():
    assert_unchanged(
        NAME,
        HEAD
        + """g (float[batch,12] x, int64[2] target) => (float[A,B] y) {
            one = Constant<value = int64[1] {1}>()
            t = Add(target, one)
            y = Reshape(x, t)
        }""",
    )


def _generic(model: onnx.ModelProto, *, disabled=()) -> onnx.ModelProto:
    ir_model = ir.serde.deserialize_model(model)
    run_passes(ir_model, generic_passes(OptimizeOptions(disabled_rules=list(disabled))))
    return ir.serde.serialize_model(ir_model)


def test_windowed_attention_with_a_dynamic_batch_loses_its_shape_arithmetic():
    original = windowed_attention_model()
    inferred = onnx.shape_inference.infer_shapes(original, data_prop=True)
    optimized = _generic(inferred)
    without = _generic(inferred, disabled=[NAME])
    ops = Counter(op_types(optimized))
    # onnxslim 0.1.98 leaves 42 nodes on this model, onnxsim 0.8.1 fuses it to 16 (with Attention),
    # onnxoptimizer 0.4.2 fails on it; our generic passes alone end at onnxslim's count.
    assert not {"Shape", "Gather", "Unsqueeze", "Concat", "Div"} & set(ops), ops
    assert len(optimized.graph.node) <= 42 < len(without.graph.node) < len(original.graph.node)
    onnx.checker.check_model(optimized, full_check=True)
    for batch in (1, 3):
        feeds = {"x": np.random.default_rng(batch).standard_normal((batch, 16, 16, 16)).astype(np.float32)}
        assert_same_outputs(original, optimized, atol=1e-5, rtol=1e-5, feeds=feeds)


def test_the_pass_reaches_a_fixed_point_in_one_sweep():
    inferred = onnx.shape_inference.infer_shapes(windowed_attention_model(), data_prop=True)
    model = ir.serde.deserialize_model(inferred)
    from flexdsa_core.passes.partial_shapes import PartialShapeFoldingPass

    assert PartialShapeFoldingPass()(model).modified
    assert not PartialShapeFoldingPass()(model).modified


def test_random_inputs_helper_is_batch_three():
    # The ONNX-text cases above rely on it: a symbolic dim is fed as 3 (not the 1 that hides broadcasting bugs).
    assert random_inputs(parse(RESHAPE_KEEPING_BATCH))["x"].shape[0] == 3
