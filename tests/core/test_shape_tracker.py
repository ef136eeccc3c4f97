"""The Shape Tracker on a small attention-style block with dims ``batch`` and ``seq``:

x[batch, seq, 64] -> MatMul(w) -> Reshape to [batch, seq, 4, 16] (target shape computed from
Shape -> Gather -> Concat) -> Transpose -> Relu -> Transpose -> Reshape back -> y
"""

from __future__ import annotations

import gc
import json

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from flexdsa_core.errors import InvalidOptionsError
from flexdsa_core.shape_tracker import Bucket, ShapeReport, ShapeTracker, apply_input_shapes
from flexdsa_core.targets import TargetSpec, load_target

CPU = load_target("cpu-ort")
STATIC_TARGET = TargetSpec(name="static-npu", vendor="test", adapter="cpu_ort", static_shapes=True)


def block_model(batch="batch", seq="seq") -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    initializers = [
        numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w"),
        numpy_helper.from_array(np.array([0], np.int64), "i0"),
        numpy_helper.from_array(np.array([1], np.int64), "i1"),
        numpy_helper.from_array(np.array([4, 16], np.int64), "heads"),
        numpy_helper.from_array(np.array([64], np.int64), "hidden"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["mm"]),
        helper.make_node("Shape", ["mm"], ["mm_shape"]),
        helper.make_node("Gather", ["mm_shape", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["mm_shape", "i1"], ["s"], axis=0),
        helper.make_node("Concat", ["b", "s", "heads"], ["split_shape"], axis=0),
        helper.make_node("Reshape", ["mm", "split_shape"], ["split"]),
        helper.make_node("Transpose", ["split"], ["heads_first"], perm=[0, 2, 1, 3]),
        helper.make_node("Relu", ["heads_first"], ["act"]),
        helper.make_node("Transpose", ["act"], ["seq_first"], perm=[0, 2, 1, 3]),
        helper.make_node("Concat", ["b", "s", "hidden"], ["merge_shape"], axis=0),
        helper.make_node("Reshape", ["seq_first", "merge_shape"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, None, None])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    onnx.checker.check_model(model)
    return model


def tracker(**kwargs) -> ShapeTracker:
    return ShapeTracker(ir.from_proto(block_model()), **kwargs)


def run(model: ir.Model | onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    proto = ir.to_proto(model) if isinstance(model, ir.Model) else model
    onnx.checker.check_model(proto)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def op_types(model: ir.Model) -> list[str]:
    return [node.op_type for node in model.graph]


def random_x(*shape: int) -> np.ndarray:
    return np.random.default_rng(1).standard_normal(shape).astype(np.float32)


# ---- inference -----------------------------------------------------------------------------------
def test_named_dims_flow_through_the_graph():
    t = tracker()
    report = t.infer()
    assert isinstance(report, ShapeReport)
    assert report.inputs == {"x": ["batch", "seq", 64]}
    assert report.dims == {"batch": [("x", 0)], "seq": [("x", 1)]}
    values = {v.name: v for n in t.model.graph for v in n.outputs}
    assert list(values["heads_first"].shape.dims) == ["batch", 4, "seq", 16]
    assert list(values["mm"].shape.dims) == ["batch", "seq", 64]
    assert report.outputs["y"] == ["batch", "seq", 64]
    assert report.unknown == []
    assert report.counts["unknown"] == 0
    assert report.counts["tensors"] == 11
    assert json.loads(json.dumps(report.as_dict()))["dims"]["seq"] == [{"input": "x", "axis": 1}]


def test_unnamed_input_dims_get_fresh_names():
    t = ShapeTracker(ir.from_proto(block_model(batch=None, seq="seq")))
    report = t.infer()
    assert report.inputs["x"] == ["x_dim0", "seq", 64]
    assert report.named_dims == {"x[0]": "x_dim0"}
    assert "x_dim0" in report.dims


def test_unknown_shapes_are_listed_with_their_producer():
    text = """
    <ir_version: 10, opset_import: ["" : 21, "com.example" : 1]>
    g (float[batch, 8] x) => (int64[2, N] nz, float[M] z) {
        r = Relu(x)
        nz = NonZero(r)
        z = com.example.Mystery(r)
    }
    """
    report = ShapeTracker(ir.from_proto(onnx.parser.parse_model(text))).infer()
    reasons = {u.tensor: (u.op_type, u.reason) for u in report.unknown}
    assert reasons["nz"][0] == "NonZero"
    assert "not derived from the input dims" in reasons["nz"][1]
    assert reasons["z"][0] == "Mystery"
    assert report.counts["unknown"] == 2
    assert report.counts["symbolic"] == 1  # r: [batch, 8]


POSITION_SLICE = """
<ir_version: 10, opset_import: ["" : 21]>
g (int64[batch, seq] ids) => (float[batch, seq, 8] y) {
    table_shape = Constant<value = int64[2] {64, 8}>()
    table = ConstantOfShape<value = float[1] {0.5}>(table_shape)
    one = Constant<value = int64[1] {1}>()
    zero = Constant<value = int64[1] {0}>()
    two = Constant<value = int64[1] {2}>()
    ids_shape = Shape(ids)
    seq_len = Gather<axis = 0>(ids_shape, one)
    positions = Slice(table, zero, seq_len, zero)
    as_float = Cast<to = 1>(ids)
    column = Unsqueeze(as_float, two)
    y = Add(column, positions)
}
"""


def test_symbolic_inference_recovers_what_onnx_data_propagation_loses():
    # ONNX infers Slice(table, 0, seq) as [unk__0, 8]; onnxruntime's symbolic inference keeps 'seq'.
    t = ShapeTracker(ir.from_proto(onnx.parser.parse_model(POSITION_SLICE)))
    report = t.infer()
    assert report.refined == ["positions"]
    assert report.unknown == []
    values = {v.name: v for n in t.model.graph for v in n.outputs}
    assert list(values["positions"].shape.dims) == ["seq", 8]
    static = t.specialize(t.buckets({"seq": [16]}, CPU)[0])
    positions = next(v for n in static.graph for v in n.outputs if v.name == "positions")
    assert list(positions.shape.dims) == [16, 8]


def test_the_symbolic_probe_is_freed_before_inference_returns():
    """The copy the symbolic inference is asked about is cycles of nodes and values: left to the collector's
    rare full passes, PP-OCRv4 det's held 3 MiB of its job's peak. None is left unreachable after ``infer``."""
    t = ShapeTracker(ir.from_proto(onnx.parser.parse_model(POSITION_SLICE)))
    gc.collect()
    gc.disable()  # only the collection the inference makes itself frees anything until the check below
    try:
        assert t.infer().refined == ["positions"]  # the symbolic inference ran
        gc.set_debug(gc.DEBUG_SAVEALL)  # what is unreachable now is kept in gc.garbage, to be seen
        gc.collect()
        left = [o for o in gc.garbage if isinstance(o, ir.Graph)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert left == []


def test_the_caller_model_is_left_alone():
    model = ir.from_proto(block_model())
    t = ShapeTracker(model)
    t.specialize(t.buckets({"batch": [1], "seq": [16]}, CPU)[0])
    assert list(model.graph.inputs[0].shape.dims) == ["batch", "seq", 64]
    assert "Shape" in op_types(model)


# ---- buckets -------------------------------------------------------------------------------------
def test_buckets_from_options():
    t = tracker()
    buckets = t.buckets({"batch": [1], "seq": [32, 16]}, CPU)
    assert [b.name for b in buckets] == ["batch1_seq16", "batch1_seq32"]
    assert buckets[1].dims == {"batch": 1, "seq": 32}
    assert buckets[1].input_shapes(t.model) == {"x": [1, 32, 64]}


def test_cpu_keeps_dims_dynamic_without_buckets():
    t = tracker()
    [bucket] = t.buckets(None, CPU)
    assert bucket.name == "dynamic" and bucket.dims == {}
    assert bucket.input_shapes(t.model) == {"x": ["batch", "seq", 64]}


def test_a_dim_without_bucket_stays_symbolic_on_a_dynamic_target():
    [bucket] = tracker().buckets({"seq": [128]}, CPU)
    assert bucket == Bucket("seq128", {"seq": 128})
    assert bucket.input_shapes(tracker().model) == {"x": ["batch", 128, 64]}


def test_target_defaults_fill_the_dims_the_request_leaves_out():
    target = STATIC_TARGET.model_copy(update={"default_shape_buckets": {"seq": [128, 512], "unused": [3]}})
    buckets = tracker().buckets({"batch": [4]}, target)
    assert [b.name for b in buckets] == ["batch4_seq128", "batch4_seq512"]


def test_static_target_defaults_batch_to_one_and_plans_the_other_dims():
    # No default for seq on this target: the Shape Tracker's plan gives it the representative size, and says so.
    t = tracker()
    [bucket] = t.buckets(None, STATIC_TARGET)
    assert bucket.name == "batch1_seq128"
    plan = t.infer().plan
    assert plan["dims"]["seq"]["kind"] == "sequence" and plan["dims"]["seq"]["value"] == 128
    assert plan["memory_budget_bytes"] >= 64 << 20
    [bucket] = tracker().buckets({"seq": [64]}, STATIC_TARGET)
    assert bucket.name == "batch1_seq64"


def test_bad_bucket_options_are_refused():
    with pytest.raises(InvalidOptionsError, match="'sequence'.*Dynamic dims: 'batch', 'seq'"):
        tracker().buckets({"sequence": [128]}, CPU)
    with pytest.raises(InvalidOptionsError, match="int >= 1"):
        tracker().buckets({"seq": [0]}, CPU)
    with pytest.raises(InvalidOptionsError, match="combinations"):
        tracker().buckets({"batch": list(range(1, 10)), "seq": list(range(1, 10))}, CPU)


# ---- specialisation ------------------------------------------------------------------------------
def test_specialize_folds_the_shape_chain_and_matches_the_dynamic_model():
    t = tracker()
    bucket = t.buckets({"batch": [2], "seq": [16]}, CPU)[0]
    static = t.specialize(bucket)

    assert op_types(static) == ["MatMul", "Reshape", "Transpose", "Relu", "Transpose", "Reshape"]
    for reshape in (n for n in static.graph if n.op_type == "Reshape"):
        assert reshape.inputs[1].const_value is not None
    assert list(reshape.inputs[1].const_value.numpy()) == [2, 16, 64]
    assert all(v.shape.is_static() for n in static.graph for v in n.outputs)
    assert list(static.graph.outputs[0].shape.dims) == [2, 16, 64]
    assert t.specialization_info(bucket.name)["still_dynamic_tensors"] == []

    x = random_x(2, 16, 64)
    np.testing.assert_allclose(run(static, x), run(block_model(), x), rtol=1e-6, atol=1e-6)
    # Specialised once, but each call hands out its own copy: the pipeline rewrites what it gets.
    static.graph.remove(list(static.graph)[-1], safe=False)
    again = t.specialize(bucket)
    assert again is not static and len(list(again.graph)) == 6


def test_specialize_dynamic_bucket_keeps_dims_symbolic_and_runs():
    t = tracker()
    [bucket] = t.buckets(None, CPU)
    model = t.specialize(bucket)
    assert list(model.graph.inputs[0].shape.dims) == ["batch", "seq", 64]
    x = random_x(3, 5, 64)
    np.testing.assert_allclose(run(model, x), run(block_model(), x), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dims", [None, {"batch": [2], "seq": [16]}])
def test_specialised_shapes_are_what_onnx_infers_for_the_bound_model(dims):
    # ``specialize`` does not run ONNX's inference again where the binding leaves nothing to add (no dim
    # bound, or every value static once bound): what it keeps must be what that inference would say.
    t = tracker()
    [bucket] = t.buckets(dims, CPU)
    model = t.specialize(bucket)
    proto = ir.to_proto(model)
    del proto.graph.value_info[:]
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=True, data_prop=True)
    fresh = {
        info.name: [d.dim_value if d.HasField("dim_value") else d.dim_param for d in info.type.tensor_type.shape.dim]
        for info in [*inferred.graph.value_info, *inferred.graph.output]
    }
    kept = {v.name: [d if isinstance(d, int) else d.value for d in v.shape.dims] for n in model.graph for v in n.outputs}
    assert kept == {name: fresh[name] for name in kept}


# ---- run time ------------------------------------------------------------------------------------
def test_update_picks_the_smallest_bucket_that_fits_and_padding_keeps_numerics():
    t = tracker()
    t.buckets({"batch": [1, 2], "seq": [16, 32]}, CPU)

    selection = t.update({"x": [1, 10, 64]})
    assert selection.bucket.name == "batch1_seq16"
    assert selection.padding == {"x": [0, 6, 0]} and selection.needs_padding
    assert not selection.new_bucket

    assert t.update({"x": [2, 17, 64]}).bucket.name == "batch2_seq32"
    assert t.update({"x": [1, 32, 64]}).padding == {"x": [0, 0, 0]}

    # This block is position-wise, so padding the sequence and slicing the result back is exact.
    x = random_x(1, 10, 64)
    padded = np.pad(x, [(0, p) for p in selection.padding["x"]])
    out = run(selection.model, padded)[:, :10]
    np.testing.assert_allclose(out, run(block_model(), x), rtol=1e-6, atol=1e-6)


def test_update_respecialises_for_an_unseen_bigger_shape():
    t = tracker()
    t.buckets({"batch": [1], "seq": [16, 32]}, CPU)
    selection = t.update({"x": [1, 48, 64]})
    assert selection.new_bucket
    assert selection.bucket.name == "batch1_seq48" and selection.bucket.from_runtime
    assert selection.padding == {"x": [0, 0, 0]}
    assert list(selection.model.graph.inputs[0].shape.dims) == [1, 48, 64]
    assert "Shape" not in op_types(selection.model)
    assert selection.memory_plan is not None and selection.memory_plan.violations() == []
    x = random_x(1, 48, 64)
    np.testing.assert_allclose(run(selection.model, x), run(block_model(), x), rtol=1e-6, atol=1e-6)

    again = t.update({"x": [1, 40, 64]})
    assert again.bucket.name == "batch1_seq48" and not again.new_bucket
    assert "batch1_seq48" in [b["name"] for b in t.manifest()["buckets"]]


def test_update_without_planned_buckets_specialises_exactly():
    selection = tracker().update({"x": [1, 8, 64]})
    assert selection.new_bucket and selection.bucket.dims == {"batch": 1, "seq": 8}


def test_update_explains_bad_runtime_shapes():
    t = tracker()
    t.buckets({"batch": [1], "seq": [16]}, CPU)
    with pytest.raises(InvalidOptionsError, match="rank 3"):
        t.update({"x": [1, 16]})
    with pytest.raises(InvalidOptionsError, match="unknown input.*'mask'"):
        t.update({"x": [1, 16, 64], "mask": [1, 16]})
    with pytest.raises(InvalidOptionsError, match="missing input.*'x'"):
        t.update({})
    with pytest.raises(InvalidOptionsError, match="axis 2 is fixed to 64"):
        t.update({"x": [1, 16, 32]})


def test_inputs_sharing_a_dim_must_agree():
    text = """
    <ir_version: 10, opset_import: ["" : 21]>
    g (float[batch, seq] a, float[batch, seq] b) => (float[batch, seq] c) {
        c = Add(a, b)
    }
    """
    t = ShapeTracker(ir.from_proto(onnx.parser.parse_model(text)))
    with pytest.raises(InvalidOptionsError, match="'seq' is 4 on input 'a' but 5 on input 'b'"):
        t.update({"a": [1, 4], "b": [1, 5]})
    assert t.update({"a": [1, 4], "b": [1, 4]}).dims == {"batch": 1, "seq": 4}


def test_manifest_maps_runtime_shapes_to_buckets():
    t = tracker()
    t.buckets({"batch": [1], "seq": [128, 512]}, CPU)
    manifest = json.loads(json.dumps(t.manifest()))
    assert manifest["dims"] == {"batch": [{"input": "x", "axis": 0}], "seq": [{"input": "x", "axis": 1}]}
    assert manifest["dim_values"] == {"batch": [1], "seq": [128, 512]}
    entry = manifest["buckets"][1]
    assert entry["name"] == "batch1_seq512"
    assert entry["accepts"] == {"batch": [1, 1], "seq": [1, 512]}
    assert entry["input_shapes"] == {"x": [1, 512, 64]}


# ---- input_shapes overrides ----------------------------------------------------------------------
def test_input_shapes_fix_and_rename_dims():
    model = apply_input_shapes(ir.from_proto(block_model()), {"x": ["n", 16, 64]})
    t = ShapeTracker(model)
    report = t.infer()
    assert report.inputs == {"x": ["n", 16, 64]}
    assert list(report.dims) == ["n"]
    assert report.outputs["y"] == ["n", 16, 64]
    # The tracker takes the same overrides, at construction or later (which starts inference over).
    assert ShapeTracker(ir.from_proto(block_model()), input_shapes={"x": [1, "seq", 64]}).infer().inputs == {
        "x": [1, "seq", 64]
    }
    t = tracker()
    t.infer()
    t.apply_input_shapes({"x": [2, 8, 64]})
    assert t.infer().dims == {}
    assert [b.name for b in t.buckets(None, CPU)] == ["static"]


def test_bad_input_shapes_are_refused():
    model = ir.from_proto(block_model())
    with pytest.raises(InvalidOptionsError, match="'y'.*Model inputs: 'x'"):
        apply_input_shapes(model, {"y": [1, 2, 3]})
    with pytest.raises(InvalidOptionsError, match="rank 2"):
        apply_input_shapes(model, {"x": [1, 2]})
    with pytest.raises(InvalidOptionsError, match="fixes that axis to 64"):
        apply_input_shapes(model, {"x": [1, 2, 32]})


# ---- real architectures --------------------------------------------------------------------------
def _feeds(model: ir.Model, shapes: dict[str, list[int]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.inputs:
        shape = shapes[value.name]
        if value.dtype == ir.DataType.INT64:
            high = 2 if ("mask" in value.name or "type" in value.name) else 50
            feeds[value.name] = rng.integers(0, high, size=shape).astype(np.int64)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def _run_all(model: ir.Model | onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    proto = ir.to_proto(model) if isinstance(model, ir.Model) else model
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(proto.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.models
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "vit", "resnet", "mobilenetv2"])
def test_real_models_resolve_every_shape_and_specialise_exactly(name):
    from tests.models import fixture

    original = onnx.load(fixture(name))
    t = ShapeTracker(ir.from_proto(original))
    report = t.infer()
    assert report.unknown == [], report.unknown[:3]
    assert "batch" in report.dims

    buckets = t.buckets({d: [2] if d == "batch" else [16] for d in report.dims}, CPU)
    [bucket] = buckets
    static = t.specialize(bucket)
    assert t.specialization_info(bucket.name)["still_dynamic_tensors"] == []
    assert "Shape" not in op_types(static)
    feeds = _feeds(static, bucket.input_shapes(static))
    for got, want in zip(_run_all(static, feeds), _run_all(original, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

    # The dynamic model keeps running at any size, with the refined symbolic shapes in it.
    [dynamic] = t.buckets(None, CPU)
    model = t.specialize(dynamic)
    other = {
        v.name: [d if isinstance(d, int) else 3 if d.value == "batch" else 7 for d in v.shape.dims]
        for v in model.graph.inputs
    }
    feeds = _feeds(model, other)
    for got, want in zip(_run_all(model, feeds), _run_all(original, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_dims_free_symbols_are_parsed_once_per_text():
    """The free symbols of a dim depend on its text alone: dims of the same text in other values or other
    copies of the graph are answered without parsing it again; a text sympy cannot parse is one name."""
    from flexdsa_core import shape_tracker

    shape_tracker._free_symbols_of.cache_clear()
    dims = [ir.SymbolicDim("2*floor(h/2) + floor(w/4)") for _ in range(3)]
    assert {frozenset(shape_tracker._free_symbols(d)) for d in dims} == {frozenset({"h", "w"})}
    info = shape_tracker._free_symbols_of.cache_info()
    assert (info.misses, info.hits) == (1, 2)
    assert shape_tracker._free_symbols(ir.SymbolicDim("batch")) == {"batch"}
    assert shape_tracker._free_symbols(ir.SymbolicDim("unk__12 )(")) == {"unk__12 )("}
    assert shape_tracker._free_symbols(ir.SymbolicDim(None)) == frozenset()
