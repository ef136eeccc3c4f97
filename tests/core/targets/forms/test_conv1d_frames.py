"""``strided_conv1d_frames``: a strided 1-D Conv (an STFT as a convolution with its basis) computed on the signal
framed by its stride, with the original's outputs (ONNX Runtime), over one channel and several, with a tail the
convolution never reads and a kernel that is not a multiple of the stride; the site keeps its name; what the
identity does not cover is refused with its reason."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from flexdsa_core.fusions.walk import ReasonTracer, drive
from flexdsa_core.targets.forms import discover_forms
from tests.core.fusions.harness import run

FORM = discover_forms()["strided_conv1d_frames"]


def _stft(channels=1, length=832, kernel=256, stride=128, out=258, pads=0, bias=True) -> ir.Model:
    rng = np.random.default_rng(0)
    inputs = ["x", "w", "b"] if bias else ["x", "w"]
    node = onnx.helper.make_node("Conv", inputs, ["y"], name="stft", strides=[stride], kernel_shape=[kernel],
                                 pads=[pads, pads])  # fmt: skip
    constants = [onnx.numpy_helper.from_array(rng.standard_normal((out, channels, kernel)).astype(np.float32), "w")]
    if bias:
        constants.append(onnx.numpy_helper.from_array(rng.standard_normal(out).astype(np.float32), "b"))
    graph = onnx.helper.make_graph(
        [node], "g", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, channels, length])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], constants,
    )  # fmt: skip
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=9)
    return ir.from_proto(onnx.shape_inference.infer_shapes(proto))


@pytest.mark.parametrize(
    ("channels", "length", "kernel", "stride", "bias"),
    [(1, 832, 256, 128, True), (1, 900, 256, 128, False), (3, 64, 12, 4, True), (2, 61, 5, 3, True)],
)
def test_the_framed_conv_gives_the_outputs_of_the_original(channels, length, kernel, stride, bias):
    before = _stft(channels, length, kernel, stride, out=16, bias=bias)
    assert FORM.sites(before) == {"stft": ["frames"]}
    after = before.clone()
    assert FORM.apply(after, {"stft": "frames"}) == ["stft"]
    convs = [node for node in after.graph if node.op_type == "Conv"]
    assert [node.name for node in convs] == ["stft"]  # one Conv, at stride 1, over the framed signal
    assert list(convs[0].attributes["strides"].as_ints()) == [1]
    assert convs[0].inputs[1].const_value.numpy().shape == (16, channels * stride, -(-kernel // stride))
    x = np.random.default_rng(1).standard_normal((4, channels, length)).astype(np.float32)
    want, got = run(ir.to_proto(before), {"x": x})[0], run(ir.to_proto(after), {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"stride": 1}, "not strided"),
        ({"pads": 2}, "padded or dilated"),
        ({"channels": 3}, "over 256"),  # 3 x 128 channels once framed
        ({"length": 380, "kernel": 250}, "past the signal"),
    ],
)
def test_what_the_identity_does_not_cover_is_refused_with_its_reason(change, reason):
    model = _stft(**change)
    assert FORM.sites(model) == {}
    tracer = ReasonTracer()
    drive(model, [FORM.variants["frames"]], lambda _r, _d: type("Kept", (), {"taken": False})(), rule_name=FORM.name,
          tracer=tracer)  # fmt: skip
    assert any(reason in text for text in tracer.reasons), dict(tracer.reasons)
