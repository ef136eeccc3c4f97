"""A weight layer the QDQ quantiser left float stays float when ONNX Runtime loads the model
(``precision.float_layers``): its output equals the graph as written, at every optimisation level."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from flexdsa_core.precision.float_layers import keep_float_layers_float
from flexdsa_core.precision.formats import cpu_int8_features

CHANNELS = 16


def _model(tmp_path) -> tuple[str, np.ndarray]:
    """Conv 1x1 → Clip → depthwise Conv 3x3 → Clip → Conv 1x1, quantised static QDQ with the depthwise layer
    excluded. Its channels' weights span four orders of magnitude: one per-tensor int8 scale rounds the
    small ones to zero."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    rng = np.random.default_rng(0)
    spread = np.logspace(-3, 1, CHANNELS).astype(np.float32).reshape(CHANNELS, 1, 1, 1)
    weights = {
        "w1": rng.standard_normal((CHANNELS, 3, 1, 1)).astype(np.float32),
        "wd": (rng.standard_normal((CHANNELS, 1, 3, 3)).astype(np.float32) * spread),
        "w2": rng.standard_normal((4, CHANNELS, 1, 1)).astype(np.float32),
        "lo": np.array(0.0, np.float32),
        "hi": np.array(6.0, np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="expand"),
        helper.make_node("Clip", ["a", "lo", "hi"], ["b"], name="clip1"),
        helper.make_node("Conv", ["b", "wd"], ["c"], name="depthwise", group=CHANNELS, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c", "lo", "hi"], ["d"], name="clip2"),
        helper.make_node("Conv", ["d", "w2"], ["y"], name="project"),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )  # fmt: skip
    fp32, out = tmp_path / "fp32.onnx", tmp_path / "qdq.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), str(fp32))
    samples = [{"x": rng.random((1, 3, 8, 8), dtype=np.float32)} for _ in range(8)]
    reader = iter(samples)
    quantize_static(
        str(fp32), str(out), type("R", (), {"get_next": lambda self: next(reader, None)})(),
        quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
        per_channel=True, nodes_to_exclude=["depthwise"],
        # As the product quantises on this CPU: without an int8 dot-product instruction ONNX Runtime's fused
        # u8 x s8 kernels sum pairs of products in 16 bits, and full 8-bit weights saturate there.
        reduce_range=cpu_int8_features()["reduce_range"],
    )  # fmt: skip
    return str(out), rng.random((1, 3, 8, 8), dtype=np.float32)


def _run(model, x, level) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_the_layer_left_float_computes_in_float_at_every_level(tmp_path):
    path, x = _model(tmp_path)
    model = onnx.load(path)
    assert keep_float_layers_float(model) == 1
    onnx.checker.check_model(model)
    guarded = model.SerializeToString()
    as_written = _run(path, x, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    np.testing.assert_allclose(
        _run(guarded, x, ort.GraphOptimizationLevel.ORT_DISABLE_ALL), as_written, rtol=0, atol=0
    )
    for level in (ort.GraphOptimizationLevel.ORT_ENABLE_BASIC, ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
        np.testing.assert_allclose(_run(guarded, x, level), as_written, rtol=1e-4, atol=1e-3)
    # The depthwise layer now reads a per-axis DequantizeLinear of its own; nothing else changed.
    depthwise = next(n for n in model.graph.node if n.name == "depthwise")
    source = next(n for n in model.graph.node if depthwise.input[0] in n.output)
    assert source.op_type == "DequantizeLinear" and source.attribute[0].i == 1


def test_why_onnx_runtime_needs_it(tmp_path):
    """Without the guard ONNX Runtime quantises the float layer's weights per tensor at load; if a release
    stops doing so, this fails and the guard can go."""
    path, x = _model(tmp_path)
    as_written = _run(path, x, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    loaded = _run(path, x, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    assert np.abs(loaded - as_written).max() > 10 * np.abs(as_written).max() * 1e-3


@pytest.mark.parametrize("opset", [11, 12])
def test_models_below_opset_13_are_left_alone(opset):
    graph = helper.make_graph([], "g", [], [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    assert keep_float_layers_float(model) == 0
