"""Empirical bias correction (``precision.bias_correction``): each quantised Conv's bias absorbs the mean error
its output carries, so the int8 model's outputs lose their drift on samples it was not corrected on."""

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from flexdsa_core.precision import bias_correction
from flexdsa_core.precision.bias_correction import MIN_VALUES, correct_biases


def _depthwise_net(path) -> None:
    """Conv 3->16, Relu, depthwise 3x3 (few weights per filter: rounding moves each channel's mean), Relu,
    Conv 1x1 16->8, Gemm head (never corrected: one value per channel per sample)."""
    rng = np.random.default_rng(0)
    weights = {
        "w1": rng.normal(0, 0.3, (16, 3, 3, 3)), "b1": rng.normal(0, 0.1, 16),
        "w2": rng.normal(0.05, 0.4, (16, 1, 3, 3)), "b2": rng.normal(0, 0.1, 16),
        "w3": rng.normal(0, 0.3, (8, 16, 1, 1)), "b3": rng.normal(0, 0.1, 8),
        "w4": rng.normal(0, 0.3, (8, 4)), "b4": np.zeros(4),
    }  # fmt: skip
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=16),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"]),
        helper.make_node("GlobalAveragePool", ["c3"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "w4", "b4"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("c3", TensorProto.FLOAT, [1, 8, 16, 16])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)


class _Reader(CalibrationDataReader):
    def __init__(self, feeds):
        self.feeds = iter(feeds)

    def get_next(self):
        return next(self.feeds, None)


def _run(path, feeds, name):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run([name], f)[0] for f in feeds])


def test_each_conv_bias_absorbs_its_mean_error_and_the_drift_is_gone_on_unseen_samples(tmp_path):
    fp32, plain, corrected = tmp_path / "fp32.onnx", tmp_path / "int8.onnx", tmp_path / "corrected.onnx"
    _depthwise_net(fp32)
    rng = np.random.default_rng(1)
    samples = [{"x": rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(24)]
    calibration, unseen = samples[:12], samples[12:]
    quantize_static(str(fp32), str(plain), _Reader(calibration), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip

    found = correct_biases(plain, fp32, calibration, corrected)

    assert found["corrected"] == 3 and found["samples"] == 12  # the three Convs; the Gemm head is left alone
    assert 16 * 16 * 12 >= MIN_VALUES
    before_model, after_model = onnx.load(str(plain)), onnx.load(str(corrected))
    changed = [t.name for t, u in zip(before_model.graph.initializer, after_model.graph.initializer, strict=True)
               if not np.array_equal(numpy_helper.to_array(t), numpy_helper.to_array(u))]  # fmt: skip
    assert changed and all(t.data_type == TensorProto.INT32 for t in after_model.graph.initializer if t.name in changed)
    want = _run(fp32, unseen, "c3")
    drift_before = np.abs((want - _run(plain, unseen, "c3")).mean(axis=(0, 2, 3))).max()
    drift_after = np.abs((want - _run(corrected, unseen, "c3")).mean(axis=(0, 2, 3))).max()
    assert drift_after < 0.5 * drift_before, (drift_before, drift_after)
    error_before = np.abs(want - _run(plain, unseen, "c3")).mean()
    error_after = np.abs(want - _run(corrected, unseen, "c3")).mean()
    assert error_after < error_before



def test_layers_measured_on_the_part_of_the_graph_they_need_are_corrected_exactly_as_on_the_whole(tmp_path, monkeypatch):
    """Each layer's mean is measured on a session of only the nodes its segment's outputs need: the corrected
    model's bytes are those of one whole-graph session for every layer."""
    fp32, plain = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    _depthwise_net(fp32)
    rng = np.random.default_rng(2)
    samples = [{"x": rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(8)]
    quantize_static(str(fp32), str(plain), _Reader(samples), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
    sizes = []
    needed_for = bias_correction._needed_for
    monkeypatch.setattr(bias_correction, "_needed_for", lambda m, o: sizes.append(len(needed_for(m, o).graph.node)) or needed_for(m, o))
    correct_biases(plain, fp32, samples, tmp_path / "segments.onnx")
    monkeypatch.setattr(bias_correction, "SEGMENTS", 1)
    monkeypatch.setattr(bias_correction, "_needed_for", lambda model, outputs: model)
    correct_biases(plain, fp32, samples, tmp_path / "whole.onnx")
    assert (tmp_path / "segments.onnx").read_bytes() == (tmp_path / "whole.onnx").read_bytes()
    whole = len(onnx.load(str(plain)).graph.node)
    assert len(sizes) == 3 and sizes == sorted(sizes) and sizes[-1] < whole  # one session per layer here, each a prefix


def test_a_graph_with_control_flow_is_measured_whole():
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["z"])], "b", [],
                               [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])])  # fmt: skip
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )  # fmt: skip
    model = helper.make_model(graph)
    assert bias_correction._needed_for(model, ["r"]) is model
    layers = [{"read": str(i)} for i in range(20)]
    segments = bias_correction._segments(layers)
    assert len(segments) == 8 and {len(s) for s in segments} == {2, 3} and sum(segments, []) == layers
    assert [len(s) for s in bias_correction._segments([{}] * 3)] == [1, 1, 1]

def test_a_model_without_a_quantised_conv_is_written_unchanged(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )  # fmt: skip
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    found = correct_biases(path, path, [{"x": np.ones((1, 4), np.float32)}], tmp_path / "out.onnx")
    assert found["corrected"] == 0 and "no quantised Conv" in found["why"]
    assert onnx.load(str(tmp_path / "out.onnx")).graph.node[0].op_type == "Relu"


def test_a_vendor_driver_runs_the_correction_in_the_cores_own_interpreter(tmp_path):
    """The qualcomm driver, in onnxruntime-qnn's environment, corrects the QDQ model its quantiser wrote by
    running this module with the core's interpreter from the folder holding flexdsa_core (``-m``): the samples
    come as the driver has them, .npy paths per row in input order or by name, and the file is corrected in
    place, as ``correct_biases`` corrects it."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    fp32, qdq, expected = tmp_path / "fp32.onnx", tmp_path / "model.b.qdq.onnx", tmp_path / "expected.onnx"
    _depthwise_net(fp32)
    rng = np.random.default_rng(2)
    samples = [{"x": rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(8)]
    quantize_static(str(fp32), str(qdq), _Reader(samples), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # fmt: skip
    want = correct_biases(qdq, fp32, samples, expected)
    rows = []
    for index, sample in enumerate(samples):
        np.save(tmp_path / f"s{index}.npy", sample["x"])
        path = str(tmp_path / f"s{index}.npy")
        rows.append([path] if index % 2 else {"x": path})
    listing = tmp_path / "calibration.json"
    listing.write_text(json.dumps({"inputs": ["x"], "dataset": rows}))
    root = Path(__file__).resolve().parents[3]
    done = subprocess.run(
        [sys.executable, "-m", "flexdsa_core.precision.bias_correction", str(qdq), str(fp32), str(listing), str(qdq)],
        capture_output=True, text=True, cwd=root, check=True,
    )  # fmt: skip
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["corrected"] == want["corrected"] == 3 and found["samples"] == 8
    got, expected_model = onnx.load(str(qdq)), onnx.load(str(expected))
    for tensor, reference in zip(got.graph.initializer, expected_model.graph.initializer, strict=True):
        assert np.array_equal(numpy_helper.to_array(tensor), numpy_helper.to_array(reference)), tensor.name
