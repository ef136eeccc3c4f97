"""``outlier_channel_split``: a feed-forward block whose hidden and output channels hold outliers is split into a
bulk and an outlier path with the original's outputs (ONNX Runtime, fp32 up to the order of a sum), the outlier
path's nodes named as float16, the bulk's range no longer spanned by the outliers; it refuses, with its reason,
an activation used outside the block, and splits nothing where no channel stands out."""

import numpy as np
import onnx
import onnx_ir as ir

from flexdsa_core.targets.forms import discover_forms, observe
from tests.core.fusions.harness import run

FORM = discover_forms()["outlier_channel_split"]
HIDDEN, WIDTH, ROWS = 64, 16, 8


def _ffn(outliers: bool = True, hidden_out: bool = False) -> ir.Model:
    """x → MatMul(Wu) + bu → erf GELU → MatMul(Wd) + bd → + x; with ``outliers`` hidden channel 5 is driven 40x
    and output channel 3 60x harder than the rest."""
    rng = np.random.default_rng(0)
    wu = rng.standard_normal((WIDTH, HIDDEN)).astype(np.float32) * 0.3
    wd = rng.standard_normal((HIDDEN, WIDTH)).astype(np.float32) * 0.3
    if outliers:
        wu[:, 5] *= 40
        wd[:, 3] *= 60
    helper = onnx.helper
    nodes = [
        helper.make_node("MatMul", ["x", "wu"], ["u0"], name="up/MatMul"),
        helper.make_node("Add", ["bu", "u0"], ["u"], name="up/Add"),
        helper.make_node("Div", ["u", "sqrt2"], ["t"], name="act/Div"),
        helper.make_node("Erf", ["t"], ["e"], name="act/Erf"),
        helper.make_node("Add", ["e", "one"], ["p"], name="act/Add"),
        helper.make_node("Mul", ["u", "p"], ["q"], name="act/Mul"),
        helper.make_node("Mul", ["q", "half"], ["h"], name="act/Mul_1"),
        helper.make_node("MatMul", ["h", "wd"], ["y0"], name="down/MatMul"),
        helper.make_node("Add", ["bd", "y0"], ["y"], name="down/Add"),
        helper.make_node("Add", ["x", "y"], ["out"], name="residual"),
    ]
    outputs = [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [1, ROWS, WIDTH])]
    if hidden_out:
        outputs.append(helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT, [1, ROWS, HIDDEN]))
    constants = {"wu": wu, "wd": wd, "bu": rng.standard_normal(HIDDEN).astype(np.float32) * 0.1,
                 "bd": rng.standard_normal(WIDTH).astype(np.float32) * 0.1, "sqrt2": np.float32(np.sqrt(2)),
                 "one": np.float32(1), "half": np.float32(0.5)}  # fmt: skip
    graph = helper.make_graph(
        nodes, "ffn", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, ROWS, WIDTH])], outputs,
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in constants.items()],
    )  # fmt: skip
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(proto)
    return ir.from_proto(onnx.shape_inference.infer_shapes(proto))


def _samples(count=8, seed=0):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, ROWS, WIDTH)).astype(np.float32)} for _ in range(count)]


def test_outlier_channels_take_a_path_of_their_own_and_the_outputs_hold():
    before = _ffn()
    model = before.clone()
    applied = FORM.apply(model, _samples())
    assert list(applied.sites) == ["down/Add"], applied.refused
    assert applied.measured["channels"]["down/Add"] == {"hidden": [5], "output": [3]}
    ops = sorted(n.op_type for n in model.graph)
    # bulk and outlier up projections, two activations, bulk and outlier-output down projections, the placing
    # MatMul, the Concat, the merge and the residual Add.
    assert ops.count("MatMul") == 5 and ops.count("Erf") == 2 and ops.count("Concat") == 1
    assert "down/Add" in applied.float16 and any(name.endswith("float16_place") for name in applied.float16)
    assert all(name == "down/Add" or "/outlier_split/float16_" in name for name in applied.float16)
    onnx.checker.check_model(ir.to_proto(model))
    for sample in _samples(seed=1):
        want, got = run(ir.to_proto(before), sample)[0], run(ir.to_proto(model), sample)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # The bulk's tensors no longer span the outliers: a per-tensor scale fits the other channels.
    bulk = [n.outputs[0].name for n in model.graph if n.name.endswith("/bulk_down_bias")]
    found = observe(model, bulk, _samples())
    peak = max(float(np.abs(o[bulk[0]]).max()) for o in found)
    original = observe(before, ["y"], _samples())
    assert peak * 10 < max(float(np.abs(o["y"]).max()) for o in original)


def test_an_activation_used_elsewhere_is_left_alone():
    model = _ffn(hidden_out=True)
    applied = FORM.apply(model, _samples())
    assert not applied.sites
    assert any("also used outside the activation" in reason for reason in applied.refused), applied.refused
    assert [n.op_type for n in model.graph].count("MatMul") == 2


def test_without_outliers_nothing_is_split():
    model = _ffn(outliers=False)
    applied = FORM.apply(model, _samples())
    assert not applied.sites
    assert applied.measured["channels"]["down/Add"] == {"hidden": [], "output": []}
