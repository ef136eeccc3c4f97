"""``packed_output_float16``: an output that packs quantities of unlike range (boxes in pixels beside scores in
0..1) keeps its packing Concat and the shape-only ops after it float16, found from the peaks measured on the
samples; a pack of alike quantities is refused with its reason; a model without a packed output says so. The
model itself is not changed."""

import numpy as np
import onnx
import onnx_ir as ir

from flexdsa_core.targets.forms import discover_forms

FORM = discover_forms()["packed_output_float16"]
CELLS = 12


def _detector(box_scale: float = 160.0) -> ir.Model:
    """x [1, 5, cells] → boxes = x[:4] · box_scale, score = Sigmoid(x[4]) → Concat (channels) → Transpose →
    Reshape → detections [1, cells, 5]."""
    helper = onnx.helper
    nodes = [
        helper.make_node("Slice", ["x", "s0", "s4", "axis"], ["raw_boxes"], name="boxes/Slice"),
        helper.make_node("Mul", ["raw_boxes", "scale"], ["boxes"], name="boxes/Mul"),
        helper.make_node("Slice", ["x", "s4", "s5", "axis"], ["raw_score"], name="score/Slice"),
        helper.make_node("Sigmoid", ["raw_score"], ["score"], name="score/Sigmoid"),
        helper.make_node("Concat", ["boxes", "score"], ["packed"], name="pack", axis=1),
        helper.make_node("Transpose", ["packed"], ["cells"], name="to_cells", perm=[0, 2, 1]),
        helper.make_node("Reshape", ["cells", "shape"], ["detections"], name="flat"),
    ]
    constants = {"s0": np.array([0]), "s4": np.array([4]), "s5": np.array([5]), "axis": np.array([1]),
                 "scale": np.array(box_scale, np.float32), "shape": np.array([1, CELLS, 5])}  # fmt: skip
    graph = helper.make_graph(
        nodes, "detector", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 5, CELLS])],
        [helper.make_tensor_value_info("detections", onnx.TensorProto.FLOAT, [1, CELLS, 5])],
        [onnx.numpy_helper.from_array(v, k) for k, v in constants.items()],
    )  # fmt: skip
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(proto)
    return ir.from_proto(onnx.shape_inference.infer_shapes(proto))


def _samples(count=6):
    rng = np.random.default_rng(0)
    return [{"x": rng.uniform(0, 1, (1, 5, CELLS)).astype(np.float32)} for _ in range(count)]


def test_a_pack_of_pixels_and_scores_stays_float16_with_its_shape_ops():
    model = _detector()
    before = ir.to_proto(model).SerializeToString()
    applied = FORM.apply(model, _samples())
    assert list(applied.sites) == ["pack"], applied.refused
    assert applied.float16 == ["pack", "to_cells", "flat"]
    measured = applied.measured["pack"]
    # The boxes peak near 160 pixels, the score within 1: a per-tensor int8 scale over both leaves the score
    # a couple of levels.
    assert measured["input_peaks"][0] > 100 and measured["input_peaks"][1] <= 1.0
    assert measured["ratio"] > 100
    assert ir.to_proto(model).SerializeToString() == before  # nothing rewritten


def test_a_pack_of_alike_quantities_is_refused_with_its_reason():
    applied = FORM.apply(_detector(box_scale=2.0), _samples())
    assert applied.sites == {} and applied.float16 == []
    assert any("within 8x of each other" in reason for reason in applied.refused), applied.refused


def test_a_model_without_a_packed_output_says_so():
    helper = onnx.helper
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "plain",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
    )  # fmt: skip
    model = ir.from_proto(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9))
    applied = FORM.apply(model, [{"x": np.ones((1, 4), np.float32)}])
    assert applied.sites == {} and "no graph output packed" in applied.measured["detail"]
