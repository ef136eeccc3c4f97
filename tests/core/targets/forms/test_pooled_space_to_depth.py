"""``pooled_conv_space_to_depth``: a stride-1 Conv under a 2x2 max pool becomes a block move, one Conv over the
four output phases and a max over them, with the original's outputs (ONNX Runtime), for each activation between
(PRelu with per-channel slopes, Relu, none), with padding and an even kernel; the site keeps the pool's name;
what the identity does not cover is refused with its reason."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from flexdsa_core.fusions.walk import ReasonTracer, drive
from flexdsa_core.targets.forms import discover_forms
from tests.core.fusions.harness import run

FORM = discover_forms()["pooled_conv_space_to_depth"]


def _conv_pool(activation="PRelu", channels=3, height=20, width=24, kernel=3, pads=0, stride=1, pool=2,
               pool_stride=2, out=10) -> ir.Model:  # fmt: skip
    """Conv 'conv' (seeded weights and bias) → activation → MaxPool 'pool' (its output's shape left to inference)."""
    rng = np.random.default_rng(0)
    helper = onnx.helper
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", strides=[stride, stride], pads=[pads] * 4,
                              kernel_shape=[kernel, kernel])]  # fmt: skip
    constants = {"w": rng.standard_normal((out, channels, kernel, kernel)).astype(np.float32),
                 "b": rng.standard_normal(out).astype(np.float32)}  # fmt: skip
    last = "c"
    if activation == "PRelu":
        constants["slope"] = rng.uniform(0.05, 0.5, (out, 1, 1)).astype(np.float32)
        nodes.append(helper.make_node("PRelu", ["c", "slope"], ["a"], name="act"))
        last = "a"
    elif activation == "Relu":
        nodes.append(helper.make_node("Relu", ["c"], ["a"], name="act"))
        last = "a"
    nodes.append(helper.make_node("MaxPool", [last], ["y"], name="pool", kernel_shape=[pool, pool],
                                  strides=[pool_stride, pool_stride]))  # fmt: skip
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, channels, height, width])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(v, k) for k, v in constants.items()],
    )  # fmt: skip
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return ir.from_proto(onnx.shape_inference.infer_shapes(proto))


def _refusals(model: ir.Model) -> dict[str, int]:
    reasons: dict[str, int] = {}
    for rule in FORM.variants.values():
        tracer = ReasonTracer()
        drive(model.clone(), [rule], lambda _rule, _delta: type("Kept", (), {"taken": False})(), rule_name=FORM.name,
              tracer=tracer)  # fmt: skip
        reasons.update(tracer.reasons)
    return reasons


@pytest.mark.parametrize(
    ("activation", "kernel", "pads", "height", "width"),
    [("PRelu", 3, 0, 20, 24), ("Relu", 3, 1, 18, 22), (None, 2, 0, 17, 21), ("PRelu", 5, 2, 16, 16)],
)
def test_the_phases_give_the_pooled_outputs_of_the_original(activation, kernel, pads, height, width):
    before = _conv_pool(activation, kernel=kernel, pads=pads, height=height, width=width)
    variant = f"block2_{(activation or 'linear').lower()}"
    assert FORM.sites(before) == {"pool": [variant]}
    # What the vendor's layers for the site came from before: the Conv, its activation and the pool.
    assert FORM.replaced(before, "pool") == {"conv", "pool", *(["act"] if activation else [])}
    after = before.clone()
    assert FORM.apply(after, {"pool": variant}) == ["pool"]
    ops = [node.op_type for node in after.graph]
    # A block move, one Conv over the phases (4x the output channels), the activation, a Split and a Max.
    assert ops == ["Conv", "Conv", *([activation] if activation else []), "Split", "Max"], ops
    phases = [node for node in after.graph if node.op_type == "Conv"][1]
    assert phases.inputs[1].const_value.numpy().shape == (40, 12, kernel // 2 + 1, kernel // 2 + 1)
    assert [node.name for node in after.graph if node.op_type == "Max"] == ["pool"]
    x = np.random.default_rng(1).standard_normal((1, 3, height, width)).astype(np.float32)
    want = run(ir.to_proto(before), {"x": x})[0]
    got = run(ir.to_proto(after), {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"height": 21}, "not a positive multiple of 2"),
        ({"stride": 2, "height": 41, "width": 41}, "strided or dilated"),
        ({"pool": 3}, "not a plain 2x2 pool at stride 2"),
        ({"pool_stride": 1}, "not a plain 2x2 pool at stride 2"),
        ({"channels": 80}, "too many to move"),
    ],
)
def test_what_the_identity_does_not_cover_is_refused_with_its_reason(change, reason):
    model = _conv_pool("PRelu", **change)
    assert FORM.sites(model) == {}
    assert any(reason in text for text in _refusals(model)), _refusals(model)
