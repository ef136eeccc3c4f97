"""``hoisted_channel_gathers``: channels of one tensor picked one by one and each given the same element-wise
steps with its own constants become the steps once over the whole tensor (constants stacked along the picked
axis) and the picks after them, with bit-identical outputs (ONNX Runtime); the site is the tensor's producer,
and ``replaced`` names the nodes the rewrite stands for; picks without common steps, repeated channels and steps
that end in a graph output are left alone."""

import numpy as np
import onnx
import onnx_ir as ir

from flexdsa_core.targets.forms import discover_forms
from tests.core.fusions.harness import run

FORM = discover_forms()["hoisted_channel_gathers"]
H, W = 5, 7


def _decode(channels=(0, 1, 2, 3), steps=("Mul", "Add"), output_after_first=False) -> ir.Model:
    """Conv 'head' (4 channels) → per picked channel c: Gather(c) → Mul(·, 12) → Add(grid_c, ·) → Unsqueeze →
    Concat → out (as P-Net's box decode)."""
    rng = np.random.default_rng(0)
    helper = onnx.helper
    constants = {"w": rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "axes": np.array([1])}
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="head")]
    outputs, picked = [], []
    for k, channel in enumerate(channels):
        constants[f"c{k}"] = np.array(channel)
        nodes.append(helper.make_node("Gather", ["y", f"c{k}"], [f"g{k}"], name=f"pick{k}", axis=1))
        last = f"g{k}"
        for step in steps:
            constant = f"{step}{k}"
            if step == "Mul":
                constants[constant] = np.array(12.0 + k, np.float32)
                nodes.append(helper.make_node("Mul", [last, constant], [f"{last}_m"], name=f"mul{k}"))
                last = f"{last}_m"
            else:
                constants[constant] = rng.uniform(0, 100, (1, H, W)).astype(np.float32)
                nodes.append(helper.make_node(step, [constant, last], [f"{last}_a"], name=f"{step.lower()}{k}"))
                last = f"{last}_a"
        if output_after_first and k == 0:
            outputs.append(helper.make_tensor_value_info(f"g{k}_m", onnx.TensorProto.FLOAT, None))
        nodes.append(helper.make_node("Unsqueeze", [last, "axes"], [f"u{k}"], name=f"unsqueeze{k}"))
        picked.append(f"u{k}")
    nodes.append(helper.make_node("Concat", picked, ["out"], name="pack", axis=1))
    outputs.insert(0, helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes, "decode", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, H, W])], outputs,
        [onnx.numpy_helper.from_array(v, k) for k, v in constants.items()],
    )  # fmt: skip
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return ir.from_proto(onnx.shape_inference.infer_shapes(proto))


def _outputs(model: ir.Model) -> list[np.ndarray]:
    x = np.random.default_rng(1).standard_normal((1, 3, H, W)).astype(np.float32)
    return run(ir.to_proto(model), {"x": x})


def test_the_steps_run_once_over_the_whole_tensor_and_the_outputs_are_the_same_bits():
    before = _decode()
    assert FORM.sites(before) == {"head": ["stacked"]}
    assert FORM.replaced(before, "head") == {"head", *(f"{op}{k}" for op in ("pick", "mul", "add") for k in range(4))}
    after = before.clone()
    assert FORM.apply(after, {"head": "stacked"}) == ["head"]
    ops = [node.op_type for node in after.graph]
    assert ops.count("Gather") == 4 and ops.count("Mul") == 1 and ops.count("Add") == 1, ops
    mul = next(node for node in after.graph if node.op_type == "Mul")
    assert mul.inputs[0].producer().name == "head" and mul.name.startswith("head/hoisted_gathers/")
    assert mul.inputs[1].const_value.numpy().shape == (1, 4, H, W)  # each channel its own constant
    for want, got in zip(_outputs(before), _outputs(after), strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_subset_of_channels_and_a_single_step_hold_too():
    before = _decode(channels=(3, 1), steps=("Mul",))
    after = before.clone()
    assert FORM.apply(after, {"head": "stacked"}) == ["head"]
    for want, got in zip(_outputs(before), _outputs(after), strict=True):
        np.testing.assert_array_equal(got, want)


def test_what_it_does_not_cover_is_left_alone():
    assert FORM.sites(_decode(steps=())) == {}  # picks with no step after them
    assert FORM.sites(_decode(channels=(1, 1))) == {}  # the same channel twice
    # The first step's output is also a graph output: that chain has no common step past the pick.
    mixed = _decode(steps=("Mul",), output_after_first=True)
    assert FORM.sites(mixed) == {}
