"""Cross-layer equalisation (``precision.equalise``): consecutive layers' channel ranges rescaled by powers of
two through positive-homogeneous ops, so the fp32 model computes bit-identical outputs; refused, with the
reason, where the rewrite would not be exact."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from flexdsa_core.precision.equalise import equalise


def _imbalanced_net(activation: str = "Relu") -> onnx.ModelProto:
    """Conv 3->8 whose channels span 1e-3..30 in range, ``activation``, MaxPool, grouped Conv 8->8 (4 groups),
    PRelu, depthwise Conv 8->8, Relu, Conv 1x1 8->4: three pairs to equalise (each ReLU, MaxPool, PRelu passes
    a channel's scale through unchanged)."""
    rng = np.random.default_rng(0)
    spread = np.geomspace(1e-3, 30, 8)[:, None, None, None]
    weights = {
        "w1": rng.normal(0, 1, (8, 3, 3, 3)) * spread, "b1": rng.normal(0, 1, 8) * spread.ravel(),
        "w2": rng.normal(0, 0.3, (8, 2, 3, 3)), "b2": rng.normal(0, 0.1, 8),
        "slope": np.full((8, 1, 1), 0.25),
        "w3": rng.normal(0, 0.4, (8, 1, 3, 3)) * spread[::-1], "b3": rng.normal(0, 0.1, 8),
        "w4": rng.normal(0, 0.3, (4, 8, 1, 1)), "b4": rng.normal(0, 0.1, 4),
    }  # fmt: skip
    first = (
        helper.make_node("Clip", ["c1", "zero", "six"], ["a1"], name="act1")
        if activation == "Clip"
        else helper.make_node(activation, ["c1"], ["a1"], name="act1")
    )
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        first,
        helper.make_node("MaxPool", ["a1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1], group=4),
        helper.make_node("PRelu", ["c2", "slope"], ["a2"], name="prelu2"),
        helper.make_node("Conv", ["a2", "w3", "b3"], ["c3"], name="dw3", pads=[1, 1, 1, 1], group=8),
        helper.make_node("Relu", ["c3"], ["a3"], name="relu3"),
        helper.make_node("Conv", ["a3", "w4", "b4"], ["y"], name="conv4"),
    ]
    initializers = [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()]
    initializers += [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in (("zero", 0.0), ("six", 6.0))]
    graph = helper.make_graph(
        nodes, "imbalanced", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4, 8, 8])], initializers,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    return model


def _outputs(model: onnx.ModelProto, feeds: list[dict], level) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [session.run(None, feed)[0] for feed in feeds]


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}


def test_equalised_model_computes_bit_identical_fp32_outputs_with_balanced_channel_ranges():
    model = _imbalanced_net()
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.normal(0, 1, (2, 3, 16, 16)).astype(np.float32)} for _ in range(4)]

    equalised, found = equalise(model)

    onnx.checker.check_model(equalised)
    assert found["pairs"] == 3 and found["layers_rescaled"] == 3
    assert found["refused"] == {"'y' is a graph output": 1}  # the last layer: nothing reads its channels
    assert [n.op_type for n in equalised.graph.node] == [n.op_type for n in model.graph.node]  # weights only
    for level in (ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        for want, got in zip(_outputs(model, feeds, level), _outputs(equalised, feeds, level), strict=True):
            np.testing.assert_array_equal(got, want)  # powers of two: exact, not close
    before, after = _weights(model), _weights(equalised)
    spread = lambda w: np.abs(w).reshape(w.shape[0], -1).max(axis=1)  # noqa: E731 - per output channel
    assert spread(after["w1"]).max() / spread(after["w1"]).min() < 0.01 * (
        spread(before["w1"]).max() / spread(before["w1"]).min()
    )
    ratios = after["w1"] / before["w1"]
    assert np.all(np.log2(ratios) == np.round(np.log2(ratios)))  # every scale a power of two


def test_a_clip_between_the_layers_is_refused_with_its_reason_and_left_unchanged():
    model = _imbalanced_net("Clip")

    equalised, found = equalise(model)

    assert found["pairs"] == 2  # conv2 -> dw3 and dw3 -> conv4 still equalise
    assert any("Clip" in reason for reason in found["refused"]), found["refused"]
    np.testing.assert_array_equal(_weights(equalised)["w1"], _weights(model)["w1"])


def test_a_residual_add_or_a_graph_output_between_the_layers_is_refused():
    model = _imbalanced_net()
    model.graph.output.append(helper.make_tensor_value_info("p1", TensorProto.FLOAT, None))

    _, found = equalise(model)

    assert found["pairs"] == 2 and any("graph output" in reason for reason in found["refused"])


# ------------------------------------------------------------------------ as a candidate of the int8 stage
def _wide_then_reader() -> bytes:
    """Conv 3->16 whose output channels span 1e-3..30 (one per-tensor int8 scale rounds the small ones to 0),
    Relu, Conv 1x1 16->8 that weighs every channel alike (columns scaled by the inverse spread): MinMax,
    Percentile and Entropy all miss a cosine of 0.99; equalised, the channels share one range."""
    rng = np.random.default_rng(0)
    spread = np.geomspace(1e-3, 30, 16)
    weights = {
        "w1": rng.normal(0, 1, (16, 3, 3, 3)) * spread[:, None, None, None],
        "b1": np.abs(rng.normal(0, 1, 16)) * spread,
        "w2": rng.normal(0, 1, (8, 16, 1, 1)) / spread[None, :, None, None],
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="wide", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu"),
        helper.make_node("Conv", ["r1", "w2"], ["y"], name="reader"),
    ]
    graph = helper.make_graph(
        nodes, "wide_then_reader", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


def _compile(min_cosine: float):
    import io

    from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
    from flexdsa_core.options import AccuracyTarget

    buffer = io.BytesIO()
    np.savez(buffer, x=np.random.default_rng(3).uniform(0, 1, (32, 3, 16, 16)).astype(np.float32))
    options = OptimizeOptions(
        precision="int8", measure_latency=False, precision_fallback="fp32",
        accuracy=AccuracyTarget(min_cosine=min_cosine, top1_outputs=[]),
    )  # fmt: skip
    result = FlexDSAOptimizer("cpu-ort").optimize(_wide_then_reader(), options, calibration=buffer.getvalue())
    return result, result.report["precision"]


def test_equalised_int8_ships_where_it_alone_meets_the_target_on_held_out_samples_and_the_claim_names_it():
    result, precision = _compile(0.99)

    by_name = {c["name"]: c for c in precision["candidates"]}
    assert not by_name["static_qdq"]["meets_target"]
    assert not any(c["meets_target"] for name, c in by_name.items() if "cle" not in name)
    equalised = [c for name, c in by_name.items() if "_cle" in name]
    assert equalised and all(c["meets_target"] for c in equalised)
    assert "measured_on" in equalised[0]["accuracy"] and "held-out" in equalised[0]["accuracy"]["measured_on"]
    assert precision["shipped"] == equalised[0]["name"]
    assert precision["equalisation"]["fp32_max_relative_difference"] == 0.0
    assert precision["claim"]["method"]["candidate"] == precision["shipped"]
    assert "cross-layer equalisation" in precision["claim"]["method"]["how"]
    assert any(n.op_type == "QuantizeLinear" for n in onnx.load_from_string(result.model_bytes()).graph.node)


def test_equalised_int8_that_misses_the_target_on_held_out_samples_does_not_ship():
    _, precision = _compile(0.99999999)  # a cosine no int8 model reaches

    equalised = [c for c in precision["candidates"] if "_cle" in c["name"]]
    assert equalised and not any(c["meets_target"] for c in equalised)
    assert precision["shipped"] == "fp32"
    assert "claim" not in precision or "cle" not in str(precision["claim"].get("method"))
