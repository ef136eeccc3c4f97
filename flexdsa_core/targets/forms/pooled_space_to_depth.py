"""``MaxPool₂ₓ₂(act(Conv(x, W))) → max over phases of act(Conv(x2, W''))``: a stride-1 convolution with few input
channels whose output a 2×2, stride-2 max pool halves, computed on a space-to-depth image with its four output
phases as channels.

The strided form (``space_to_depth.py``) needs a stride to absorb the block; a stride-1 convolution has none,
but when a 2×2 max pool follows, each pooled pixel is the max over the four output phases ``(r, q)`` of a 2×2
block, and each phase is itself a convolution over the block-moved image ``x2`` (the same one-hot block move)::

    x2[c·4 + r'·2 + q', i, j] = xp[c, 2i + r', 2j + q']
    W''[p·O + o, c·4 + r'·2 + q', a, e] = W[o, c, 2a + r' − r, 2e + q' − q]     (p = r·2 + q; 0 off the kernel)
    Conv(xp, W)[o, 2i + r, 2j + q] = Conv(x2, W'')[p·O + o, i, j]

so ``MaxPool(act(Conv(x, W)))[o] = max_p act(Conv(x2, W''))[p·O + o]``: the activation (ReLU, or PReLU with its
slopes repeated per phase) is per channel, and the max runs over four channel slices (a Split). The kernel becomes
``⌊K/2⌋ + 1`` square over 4·C channels, with 4·O outputs at a quarter of the pixels: the NPU fills 12 of its
lanes where it filled 3 and pays for 4 kernel positions where it paid for 9 (a 3×3 kernel). Exact up to the
order of each sum (the one-hot move is a product by 1.0; the max is the same max).

Offered where the convolution's output is even on both axes (every pooled pixel then has its four phases) and
the pool has no padding or dilation. MTCNN's P-Net (3×3 over 3 channels at 120×160, then a 2×2 pool) spends
half of rknn-toolkit2's cycles in that first convolution. Whether it pays is the vendor's estimate to say
(``vendor_runs.explore``).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from flexdsa_core._libraries import get_numpy_value
from flexdsa_core.fusions._naming import fresh_name
from flexdsa_core.targets.forms import VendorForm
from flexdsa_core.targets.forms.space_to_depth import MAX_MOVED_CHANNELS, attr_ints, blocked_weight, one_hot

BLOCK = 2


class _PooledSpaceToDepth(RewriteRuleClassBase):
    """One activation between the Conv and the pool per variant (``activation``: PRelu, Relu or none)."""

    activation: ClassVar[str | None] = None

    def pattern(self, op, x, w, slope):
        conv = op.Conv(x, w, _allow_other_inputs=True, _outputs=["conv_out"])
        if self.activation == "PRelu":
            conv = op.PRelu(conv, slope)
        elif self.activation == "Relu":
            conv = op.Relu(conv)
        return op.MaxPool(conv, _outputs=["pooled"])

    def check(self, context, x, w, conv_out, pooled, slope=None, **_) -> MatchResult:
        result = MatchResult()
        conv, pool = conv_out.producer(), pooled.producer()
        weight = get_numpy_value(w)
        if weight is None or weight.ndim != 4:
            return result.fail(f"Conv '{conv.name}' has no constant 2-D weight.")
        if len(conv_out.uses()) != 1 or (self.activation and len(pool.inputs[0].uses()) != 1):
            return result.fail(f"Conv '{conv.name}' feeds more than its pool.")
        if x.shape is None or not x.shape.is_static() or x.shape.rank() != 4:
            return result.fail(f"Conv '{conv.name}' input '{x.name}' has no static 4-D shape.")
        if conv.attributes.get_int("group", 1) != 1 or conv.attributes.get_string("auto_pad", "NOTSET") != "NOTSET":
            return result.fail(f"Conv '{conv.name}' is grouped or uses auto_pad.")
        if any(v != 1 for v in attr_ints(conv, "dilations", [1, 1]) + attr_ints(conv, "strides", [1, 1])):
            return result.fail(f"Conv '{conv.name}' is strided or dilated.")
        if (
            attr_ints(pool, "kernel_shape", []) != [BLOCK, BLOCK]
            or attr_ints(pool, "strides", [1, 1]) != [BLOCK, BLOCK]
            or any(attr_ints(pool, "pads", [0, 0, 0, 0]))
            or any(d != 1 for d in attr_ints(pool, "dilations", [1, 1]))
            or pool.attributes.get_string("auto_pad", "NOTSET") != "NOTSET"
            or len(pool.outputs) != 1
        ):
            return result.fail(f"MaxPool '{pool.name}' is not a plain 2x2 pool at stride 2.")
        channels = weight.shape[1]
        if channels * BLOCK * BLOCK > MAX_MOVED_CHANNELS:
            return result.fail(f"Conv '{conv.name}' has {channels} input channels: too many to move.")
        if len(conv.inputs) > 2 and conv.inputs[2] is not None and get_numpy_value(conv.inputs[2]) is None:
            return result.fail(f"Conv '{conv.name}' has a bias that is not a constant.")
        if self.activation == "PRelu" and _slopes(get_numpy_value(slope), weight.shape[0]) is None:
            return result.fail(f"PRelu after '{conv.name}' has no constant per-channel slope.")
        layout = _layout(conv, x, weight)
        if isinstance(layout, str):
            return result.fail(layout)
        graph = context.graph_or_function
        self._names = [fresh_name(graph, f"{w.name}_pooled_s2d_{part}") for part in ("select", "weight", "bias", "slope")]
        self._names.append(fresh_name(graph, f"{pool.name}_phase_sizes"))
        return result

    def rewrite(self, op, x, w, conv_out, pooled, slope=None, **_):
        conv = conv_out.producer()
        weight = get_numpy_value(w)
        outputs = weight.shape[0]
        layout = _layout(conv, x, weight)
        select_name, weight_name, bias_name, slope_name, sizes_name = self._names
        select = op.initializer(ir.tensor(one_hot(weight.shape[1], BLOCK, weight.dtype), name=select_name))
        moved = op.Conv(x, select, strides=[BLOCK, BLOCK], kernel_shape=[BLOCK, BLOCK], pads=layout["pads"])
        inputs = [moved, op.initializer(ir.tensor(phase_weight(weight), name=weight_name))]
        bias = get_numpy_value(conv.inputs[2]) if len(conv.inputs) > 2 and conv.inputs[2] is not None else None  # checked
        if bias is not None:
            inputs.append(op.initializer(ir.tensor(np.tile(bias, BLOCK * BLOCK), name=bias_name)))
        phases = op.Conv(*inputs, kernel_shape=layout["kernel"], pads=[0, 0, 0, 0])
        if self.activation == "PRelu":
            slopes = _slopes(get_numpy_value(slope), outputs)
            phases = op.PRelu(phases, op.initializer(ir.tensor(np.tile(slopes, (BLOCK * BLOCK, 1, 1)), name=slope_name)))
        elif self.activation == "Relu":
            phases = op.Relu(phases)
        sizes = op.initializer(ir.tensor(np.full(BLOCK * BLOCK, outputs, np.int64), name=sizes_name))
        pieces = op.Split(phases, sizes, axis=1, _outputs=BLOCK * BLOCK)
        return op.Max(*pieces)


def _slopes(slope: np.ndarray | None, outputs: int) -> np.ndarray | None:
    """PRelu's slopes as [O, 1, 1] (one per channel, or one shared); None where they are not that."""
    if slope is None:
        return None
    if slope.size == 1:
        return np.full((outputs, 1, 1), slope.reshape(()), slope.dtype)
    if slope.size == outputs and slope.shape in ((outputs, 1, 1), (outputs,), (1, outputs, 1, 1)):
        return slope.reshape(outputs, 1, 1)
    return None


def _layout(conv: ir.Node, x: ir.Value, weight: np.ndarray) -> dict | str:
    """The block move's pads and the phase Conv's kernel; a sentence where the shapes do not allow it."""
    _, _, kh, kw = weight.shape
    pads = attr_ints(conv, "pads", [0, 0, 0, 0])
    padded = (int(x.shape[2]) + pads[0] + pads[2], int(x.shape[3]) + pads[1] + pads[3])
    kernel = [kh // BLOCK + 1, kw // BLOCK + 1]
    extra = []
    for axis, (size, k, kk) in enumerate(zip(padded, (kh, kw), kernel, strict=True)):
        out = size - k + 1
        if out <= 0 or out % BLOCK:
            return f"Conv '{conv.name}' gives {out} outputs on axis {axis + 2}: not a positive multiple of {BLOCK}."
        # The block-moved image must give out/2 phase outputs: (size + pad) / 2 - kk + 1 = out / 2.
        moved = out // BLOCK + kk - 1
        pad = moved * BLOCK - size
        if pad < 0:
            return f"Conv '{conv.name}': the phase kernel would read past the image on axis {axis + 2}."
        extra.append(pad)
    return {"pads": [pads[0], pads[1], pads[2] + extra[0], pads[3] + extra[1]], "kernel": kernel}


def phase_weight(weight: np.ndarray) -> np.ndarray:
    """W''[p·O + o, c·4 + r'·2 + q', a, e] = W[o, c, 2a + r' − r, 2e + q' − q] (module docstring): for each phase
    ``(r, q)``, the kernel shifted by it, blocked as the strided form blocks a kernel."""
    outputs, channels, kh, kw = weight.shape
    phases = []
    for r in range(BLOCK):
        for q in range(BLOCK):
            shifted = np.zeros((outputs, channels, kh + 1, kw + 1), weight.dtype)
            shifted[:, :, r : r + kh, q : q + kw] = weight
            phases.append(blocked_weight(shifted, BLOCK))
    return np.concatenate(phases)


def _variant(activation: str | None) -> type[_PooledSpaceToDepth]:
    return type(f"PooledSpaceToDepth{activation or ''}", (_PooledSpaceToDepth,), {"activation": activation})


FORM = VendorForm(
    name="pooled_conv_space_to_depth",
    summary="Stride-1 Conv with few input channels under a 2x2 max pool → block-moving Conv + a Conv per output "
    "phase, max over the phases",
    variants={f"block2_{(a or 'linear').lower()}": _variant(a).rule() for a in ("PRelu", "Relu", None)},
    site_suffix="/pooled_space_to_depth",
)
