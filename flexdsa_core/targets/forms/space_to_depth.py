"""``Conv(x, W, stride s) → Conv(Conv(x, E, stride b), W', stride s/b)``: a strided convolution with few input
channels computed on a space-to-depth image.

An NPU computes a convolution as output pixels × kernel positions × channel groups, the input channels of one
position in parallel lanes (RK3588: 16 float16 lanes). A stem convolution over 3 colour channels fills 3 of
them and pays for every one of its K×K kernel positions; a patch embedding (ViT: 16×16 kernel, stride 16) is
also past the stride the NPU takes (rknn-toolkit2 computes it at stride 4 and then keeps every fourth
output). Moving a b×b block of pixels into the channel axis first makes the same convolution one over b²·C
channels with a ⌈K/b⌉×⌈K/b⌉ kernel at stride s/b:

    x2[c·b² + r·b + q, i, j] = xp[c, b·i + r, b·j + q]          (xp: x zero-padded by the conv's pads)
    W'[o, c·b² + r·b + q, a, e] = W[o, c, b·a + r, b·e + q]     (0 where b·a + r ≥ K or b·e + q ≥ K)
    Conv(xp, W, stride s)[o, i, j] = Conv(x2, W', stride s/b)[o, i, j]

The block move is itself a convolution (``E``: one-hot [C·b², C, b, b], stride b, carrying the original pads
plus enough zeros below and to the right to make the padded size a multiple of b), so the rewritten graph is
two Conv nodes the NPU runs, with no Reshape/Transpose the toolkit might leave on its CPU. The one-hot
convolution is exact in any float precision (one product by 1.0 per output), the second reorders the sums.

Whether it pays depends on the part's lanes, its stride limit and its compiler: the vendor's own estimate
decides, per site and per block size (``vendor_runs.explore``), never this module.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from flexdsa_core._libraries import get_numpy_value
from flexdsa_core.fusions._naming import fresh_name
from flexdsa_core.targets.forms import VendorForm

# Channels after the block move above which the rewrite is not offered: W' grows b²-fold with it.
MAX_MOVED_CHANNELS = 256
BLOCKS = (2, 4)


def attr_ints(node: ir.Node, name: str, default: list[int]) -> list[int]:
    attr = node.attributes.get(name)
    return list(attr.as_ints()) if attr is not None else list(default)


class _SpaceToDepthConv(RewriteRuleClassBase):
    """One block size per variant (``block``); ``check`` refuses, with its reason, every Conv the identity above
    does not cover."""

    block: ClassVar[int] = 2

    def pattern(self, op, x, w):
        return op.Conv(x, w, _allow_other_inputs=True, _outputs=["conv_out"])

    def check(self, context, x, w, conv_out, **_) -> MatchResult:
        result = MatchResult()
        conv = conv_out.producer()
        b = self.block
        weight = get_numpy_value(w)
        if weight is None or weight.ndim != 4:
            return result.fail(f"Conv '{conv.name}' has no constant 2-D weight.")
        if x.shape is None or not x.shape.is_static() or x.shape.rank() != 4:
            return result.fail(f"Conv '{conv.name}' input '{x.name}' has no static 4-D shape.")
        if conv.attributes.get_int("group", 1) != 1:
            return result.fail(f"Conv '{conv.name}' is grouped.")
        if conv.attributes.get_string("auto_pad", "NOTSET") != "NOTSET":
            return result.fail(f"Conv '{conv.name}' uses auto_pad.")
        if any(d != 1 for d in attr_ints(conv, "dilations", [1, 1])):
            return result.fail(f"Conv '{conv.name}' is dilated.")
        strides = attr_ints(conv, "strides", [1, 1])
        if strides[0] != strides[1] or strides[0] % b:
            return result.fail(f"Conv '{conv.name}' strides {strides} are not a multiple of block {b} on both axes.")
        channels = weight.shape[1]
        if channels * b * b > MAX_MOVED_CHANNELS:
            return result.fail(
                f"Conv '{conv.name}' has {channels} input channels: {channels * b * b} after a {b}x{b} block move."
            )
        layout = _layout(conv, x, weight, b)
        if isinstance(layout, str):
            return result.fail(layout)
        graph = context.graph_or_function
        self._names = (fresh_name(graph, f"{w.name}_s2d{b}_select"), fresh_name(graph, f"{w.name}_s2d{b}"))
        return result

    def rewrite(self, op, x, w, conv_out, **_):
        conv = conv_out.producer()
        b = self.block
        weight = get_numpy_value(w)
        layout = _layout(conv, x, weight, b)
        select_name, weight_name = self._names
        select = op.initializer(ir.tensor(one_hot(weight.shape[1], b, weight.dtype), name=select_name))
        moved = op.Conv(x, select, strides=[b, b], kernel_shape=[b, b], pads=layout["pads"])
        inputs = [moved, op.initializer(ir.tensor(blocked_weight(weight, b), name=weight_name))]
        if len(conv.inputs) > 2 and conv.inputs[2] is not None:
            inputs.append(conv.inputs[2])
        stride = layout["stride"]
        return op.Conv(*inputs, strides=[stride, stride], kernel_shape=layout["kernel"], pads=[0, 0, 0, 0])


def _layout(conv: ir.Node, x: ir.Value, weight: np.ndarray, b: int) -> dict | str:
    """The block move's pads and the second Conv's kernel and stride; a sentence where the output size would
    differ from the original's."""
    _, _, kh, kw = weight.shape
    pads = attr_ints(conv, "pads", [0, 0, 0, 0])
    stride = attr_ints(conv, "strides", [1, 1])[0]
    height, width = int(x.shape[2]), int(x.shape[3])
    padded = (height + pads[0] + pads[2], width + pads[1] + pads[3])
    extra = [(-size) % b for size in padded]
    kernel = [math.ceil(kh / b), math.ceil(kw / b)]
    inner = stride // b
    for axis, (size, k) in enumerate(zip(padded, (kh, kw), strict=True)):
        want = (size - k) // stride + 1
        got = ((size + extra[axis]) // b - kernel[axis]) // inner + 1
        if got != want:
            return f"Conv '{conv.name}': a {b}x{b} block move gives {got} outputs on axis {axis + 2}, not {want}."
    return {
        "pads": [pads[0], pads[1], pads[2] + extra[0], pads[3] + extra[1]],
        "kernel": kernel,
        "stride": inner,
    }


def one_hot(channels: int, b: int, dtype) -> np.ndarray:
    """E[c·b² + r·b + q, c, r, q] = 1: a stride-b convolution that moves each b×b block into channels."""
    select = np.zeros((channels * b * b, channels, b, b), dtype=dtype)
    for c in range(channels):
        for r in range(b):
            for q in range(b):
                select[c * b * b + r * b + q, c, r, q] = 1
    return select


def blocked_weight(weight: np.ndarray, b: int) -> np.ndarray:
    """W'[o, c·b² + r·b + q, a, e] = W[o, c, b·a + r, b·e + q], zero past the kernel's edge."""
    out_channels, channels, kh, kw = weight.shape
    padded = np.zeros((out_channels, channels, math.ceil(kh / b) * b, math.ceil(kw / b) * b), weight.dtype)
    padded[:, :, :kh, :kw] = weight
    # [o, c, a, r, e, q] -> [o, c, r, q, a, e] -> [o, c·b² + r·b + q, a, e]
    blocks = padded.reshape(out_channels, channels, padded.shape[2] // b, b, padded.shape[3] // b, b)
    blocks = blocks.transpose(0, 1, 3, 5, 2, 4)
    return np.ascontiguousarray(blocks.reshape(out_channels, channels * b * b, padded.shape[2] // b, -1))


def _variant(block: int) -> type[_SpaceToDepthConv]:
    return type(f"SpaceToDepthConv{block}", (_SpaceToDepthConv,), {"block": block})


FORM = VendorForm(
    name="strided_conv_space_to_depth",
    summary="Strided Conv with few input channels → block-moving Conv + stride-reduced Conv (space-to-depth)",
    variants={f"block{b}": _variant(b).rule() for b in BLOCKS},
    site_suffix="/space_to_depth",
)
