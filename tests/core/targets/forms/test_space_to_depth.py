"""``strided_conv_space_to_depth``: where it matches, each variant's graph is two Conv nodes with the outputs of
the original (ONNX Runtime), the site keeps its name, and it refuses, with its reason, what the identity does
not cover."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from flexdsa_core.targets.forms import discover_forms
from tests.core.fusions.harness import run

FORM = discover_forms()["strided_conv_space_to_depth"]


def _conv(channels=3, size=32, kernel=7, stride=2, pads=3, dilations=1, out=8, group=1) -> ir.Model:
    """One Conv named 'stem' with seeded weights and bias."""
    rng = np.random.default_rng(0)
    out_size = (size + 2 * pads - dilations * (kernel - 1) - 1) // stride + 1
    node = onnx.helper.make_node(
        "Conv", ["x", "w", "b"], ["y"], name="stem", strides=[stride, stride], pads=[pads] * 4,
        dilations=[dilations, dilations], group=group,
    )  # fmt: skip
    graph = onnx.helper.make_graph(
        [node], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, channels, size, size])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, out, out_size, out_size])],
        [onnx.numpy_helper.from_array(rng.standard_normal((out, channels // group, kernel, kernel)).astype(np.float32), "w"),
         onnx.numpy_helper.from_array(rng.standard_normal(out).astype(np.float32), "b")],
    )  # fmt: skip
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(proto)
    return ir.from_proto(onnx.shape_inference.infer_shapes(proto))


def _applied(model: ir.Model, variant: str) -> tuple[ir.Model, list[str]]:
    clone = model.clone()
    taken = FORM.apply(clone, {"stem": variant})
    return clone, taken


def _same_outputs(before: ir.Model, after: ir.Model, atol=1e-4):
    x = np.random.default_rng(1).standard_normal([int(d) for d in before.graph.inputs[0].shape]).astype(np.float32)
    want = run(ir.to_proto(before), {"x": x})[0]
    got = run(ir.to_proto(after), {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=atol, rtol=1e-4)


@pytest.mark.parametrize(
    "case, variant",
    [
        (dict(kernel=7, stride=2, pads=3), "block2"),  # a ResNet stem
        (dict(kernel=3, stride=2, pads=1), "block2"),  # a MobileNet stem
        (dict(kernel=16, stride=16, pads=0), "block4"),  # a ViT patch embedding (main stride 4)
        (dict(kernel=16, stride=16, pads=0), "block2"),
        (dict(kernel=4, stride=4, pads=0), "block4"),  # a ConvNeXt stem: a 1x1 convolution after the move
        (dict(kernel=5, stride=2, pads=2, size=31), "block2"),  # odd size: zeros added below and right
    ],
)
def test_rewrites_into_two_convs_with_the_same_outputs(case, variant):
    model = _conv(**case)
    assert variant in FORM.sites(model)["stem"]
    rewritten, taken = _applied(model, variant)
    assert taken == ["stem"]
    assert [n.op_type for n in rewritten.graph] == ["Conv", "Conv"]
    # The site keeps its name (the vendor's layer table is read back by it), the block move is named after it.
    assert [n.name for n in rewritten.graph] == ["stem/space_to_depth", "stem"]
    block = int(variant.removeprefix("block"))
    move, main = list(rewritten.graph)
    assert list(move.attributes["strides"].as_ints()) == [block, block]
    assert list(main.attributes["strides"].as_ints()) == [case["stride"] // block] * 2
    onnx.checker.check_model(ir.to_proto(rewritten))
    _same_outputs(model, rewritten)


def test_sites_leave_the_model_unchanged():
    model = _conv(kernel=16, stride=16, pads=0)
    before = onnx.printer.to_text(ir.to_proto(model))
    assert FORM.sites(model) == {"stem": ["block2", "block4"]}
    assert onnx.printer.to_text(ir.to_proto(model)) == before


@pytest.mark.parametrize(
    "case, reason",
    [
        (dict(stride=1, kernel=3, pads=1), "not a multiple of block"),
        (dict(channels=80, kernel=3, stride=2, pads=1), "80 input channels: 320 after a 2x2 block move"),
        (dict(kernel=3, stride=2, pads=2, dilations=2), "is dilated"),
        (dict(channels=4, out=4, group=4, kernel=2, stride=2, pads=0), "is grouped"),
    ],
)
def test_refuses_with_its_reason(case, reason):
    from flexdsa_core.fusions.walk import ReasonTracer, drive

    model = _conv(**case)
    tracer = ReasonTracer()
    found = []
    for rule in FORM.variants.values():
        drive(model, [rule], lambda _r, d: found.append(d) or _No(), rule_name=FORM.name, tracer=tracer)
    assert not found
    assert any(reason in text for text in tracer.reasons), tracer.reasons


class _No:
    taken = False


def test_grouped_conv_is_refused():
    model = _conv(channels=4, out=4, group=4, kernel=2, stride=2, pads=0)
    assert FORM.sites(model) == {}
