"""Learned rounding (``precision.adaround``): each quantised weight goes up or down so that its layer's output on
the calibration samples moves least; every weight stays on its floor or ceiling, inside the quantiser's range."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from flexdsa_core.precision import adaround as learned
from flexdsa_core.precision.adaround import _columns, adaround
from flexdsa_core.precision.cache import _Tensors


def _net(path, rng) -> None:
    """Conv 3->16 (strided, padded), Relu, grouped dilated Conv 16->16 (4 groups), Relu, pooled, MatMul 16->8 (a
    [K, N] weight, per-channel along its columns: one row of 16 inputs a sample)."""
    weights = {
        "w1": rng.normal(0, 0.3, (16, 3, 3, 3)), "b1": rng.normal(0, 0.1, 16),
        "w2": rng.normal(0, 0.3, (16, 4, 3, 3)), "b2": rng.normal(0, 0.1, 16),
        "w3": rng.normal(0, 0.3, (16, 8)),
    }  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[2, 2, 2, 2], dilations=[2, 2], group=4),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("GlobalAveragePool", ["r2"], ["p"], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "w3"], ["y"], name="head"),
    ]
    graph = helper.make_graph(
        nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)


def _samples(rng, count):
    return [{"x": rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(count)]


class _Reader(CalibrationDataReader):
    def __init__(self, samples):
        self.samples = iter(samples)

    def get_next(self):
        return next(self.samples, None)


@pytest.fixture
def quantised(tmp_path):
    rng = np.random.default_rng(0)
    fp32, qdq = tmp_path / "fp32.onnx", tmp_path / "qdq.onnx"
    _net(fp32, rng)
    samples = _samples(rng, 24)
    quantize_static(str(fp32), str(qdq), _Reader(samples), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
    return fp32, qdq, samples


def _int_weights(path) -> dict[str, np.ndarray]:
    model = onnx.load(str(path))
    tensors = _Tensors(model)
    found = {}
    for node in model.graph.node:
        if node.op_type in ("Conv", "MatMul"):
            dq = tensors.producer[node.input[1]]
            found[node.name] = numpy_helper.to_array(tensors.initializers[dq.input[0]])
    return found


def test_columns_times_the_weight_rows_is_the_convolution():
    """im2col's layout (groups, pads, strides, dilations) is the weight's: rows x columns computes the Conv."""
    rng = np.random.default_rng(1)
    x = rng.normal(0, 1, (2, 8, 9, 11)).astype(np.float32)
    w = rng.normal(0, 1, (6, 4, 3, 2)).astype(np.float32)
    attrs = {"group": 2, "pads": [1, 0, 2, 1], "strides": [2, 1], "dilations": [1, 2]}
    conv = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph(
        [conv], "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [numpy_helper.from_array(w, "w")],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    cols = _columns(x.astype(np.float64), {"op": "Conv", "attrs": attrs, "weight": w})
    rows = w.reshape(2, 3, -1).astype(np.float64)
    got = rows @ cols  # [groups, rows, N * out]
    n, _, height, width = want.shape
    got = got.reshape(6, n, height, width).transpose(1, 0, 2, 3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_learned_rounding_lowers_every_layers_output_error_and_stays_a_step_from_the_weight(quantised, tmp_path):
    fp32, qdq, samples = quantised
    out = tmp_path / "adaround.onnx"
    found = adaround(qdq, fp32, samples, out)
    assert found["rounded"] == 3 and not found["left"], found
    assert found["output_error_vs_nearest"]["worst"] < 1.0
    before, after = _int_weights(qdq), _int_weights(out)
    changed = 0
    for name, nearest in before.items():
        assert after[name].dtype == nearest.dtype and after[name].shape == nearest.shape
        step = np.abs(after[name].astype(int) - nearest.astype(int))
        assert step.max() <= 1, name  # its floor or its ceiling: at most one step from nearest
        assert after[name].min() >= nearest.min() and after[name].max() <= nearest.max()  # the quantiser's range
        changed += int(step.sum())
    assert changed > 0
    # The model's output moves less from the fp32 one on the samples its rounding was learned on.
    session = lambda path: ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])  # noqa: E731
    reference, nearest, rounded = (session(p) for p in (fp32, qdq, out))
    error = lambda s: sum(float(np.sum((s.run(None, x)[0] - reference.run(None, x)[0]) ** 2)) for x in samples)  # noqa: E731
    assert error(rounded) < error(nearest)


def test_a_layer_with_fewer_input_columns_than_inputs_keeps_nearest_rounding(quantised, tmp_path, monkeypatch):
    """The head reads one row of 16 values a sample: its 24 rows are enough at one column per input, not at two."""
    fp32, qdq, samples = quantised
    monkeypatch.setattr(learned, "MIN_COLUMNS_PER_INPUT", 2)
    found = adaround(qdq, fp32, samples, tmp_path / "strict.onnx")
    assert found["left"]["head"].startswith("24 input columns over the samples for 16 inputs")
    assert "conv1" not in found["left"]  # 24 x 64 positions for 27 inputs
    np.testing.assert_array_equal(_int_weights(tmp_path / "strict.onnx")["head"], _int_weights(qdq)["head"])


def test_without_samples_nothing_is_rounded(quantised, tmp_path):
    fp32, qdq, _ = quantised
    found = adaround(qdq, fp32, [], tmp_path / "same.onnx")
    assert found["rounded"] == 0 and "no quantised" in found["why"]


@pytest.mark.parametrize(("target", "rounds"), [("cpu-ort", True), ("nvidia-orin-nano", True), ("qualcomm-sm8650", False)])
def test_the_int8_stage_learns_the_rounding_where_its_qdq_model_ships(target, rounds, tmp_path):
    """A target that builds from our QDQ model (cpu-ort; TensorRT on Jetson) gets a learned-rounding candidate
    where the all-int8 model misses the target; one whose vendor quantises for itself (QNN) does not."""
    import io

    from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
    from flexdsa_core.options import AccuracyTarget

    _net(tmp_path / "net.onnx", np.random.default_rng(0))
    buffer = io.BytesIO()
    np.savez(buffer, x=np.random.default_rng(3).normal(0, 1, (32, 3, 16, 16)).astype(np.float32))
    options = OptimizeOptions(
        precision="int8", measure_latency=False, precision_fallback="fp32",
        accuracy=AccuracyTarget(min_cosine=0.99999999, top1_outputs=[]),  # no int8 model reaches it
    )  # fmt: skip
    result = FlexDSAOptimizer(target).optimize(tmp_path / "net.onnx", options, calibration=buffer.getvalue())
    precision = result.report["precision"]
    if rounds:
        names = [c["name"] for c in precision["candidates"]]
        assert precision["adaround"]["rounded"] > 0 and precision["adaround"]["candidate"] in names
        assert precision["adaround"]["bias_correction"]["samples"] > 0
    else:  # the bundle carries the fp32 model and the samples; the vendor's quantiser makes the int8
        assert precision["vendor_quantiser"] and "adaround" not in precision and "candidates" not in precision


def test_a_conv_padded_by_auto_pad_keeps_nearest_rounding_with_the_reason(tmp_path):
    rng = np.random.default_rng(2)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], name="same", auto_pad="SAME_UPPER")
    graph = helper.make_graph(
        [conv], "same", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(rng.normal(0, 1, (4, 3, 3, 3)).astype(np.float32), "w")],
    )  # fmt: skip
    fp32, qdq = tmp_path / "fp32.onnx", tmp_path / "qdq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), fp32)
    samples = [{"x": rng.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)} for _ in range(4)]
    quantize_static(str(fp32), str(qdq), _Reader(samples), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
    found = adaround(qdq, fp32, samples, tmp_path / "out.onnx")
    assert found["rounded"] == 0 and "auto_pad" in found["left"]["same"]


def test_the_steps_stay_within_the_work_budget_fewer_for_every_layer_then_none_for_the_last(monkeypatch):
    layers = [{"rows": np.zeros((1, 100, 100))} for _ in range(4)]  # 1e6 multiply-adds a step each
    monkeypatch.setattr(learned, "MAX_TOTAL_WORK", 4 * 1e6 * learned.ITERATIONS)
    assert learned._steps(layers) == [learned.ITERATIONS] * 4  # within it: every step
    monkeypatch.setattr(learned, "MAX_TOTAL_WORK", 2 * 1e6 * learned.ITERATIONS)
    assert learned._steps(layers) == [learned.ITERATIONS // 2] * 4  # past it: half the steps each
    monkeypatch.setattr(learned, "MAX_TOTAL_WORK", 2.5 * 1e6 * learned.MIN_ITERATIONS)
    assert learned._steps(layers) == [learned.MIN_ITERATIONS] * 2 + [0, 0]  # the floor, then the last ones left
