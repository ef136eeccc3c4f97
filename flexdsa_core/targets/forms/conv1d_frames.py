"""``Conv1d(x, W, stride s) → Conv1d(frames(x), W', stride 1)``: a strided 1-D convolution over few channels (an
STFT written as a convolution with its Fourier basis: kernel 256, hop 128) computed on the signal cut into frames
of ``s`` samples, the frame's samples as channels.

    x2[n, c·s + r, t] = x[n, c, s·t + r]                      (Reshape, Transpose, Reshape: a view of x)
    W'[o, c·s + r, a] = W[o, c, s·a + r]                      (0 where s·a + r ≥ K)
    Conv(x, W, stride s)[n, o, t] = Conv(x2, W')[n, o, t]     (kernel ⌈K/s⌉, stride 1)

exact up to the order of each sum. The framing is a reshape, not a one-hot convolution as in the 2-D form
(``space_to_depth.py``): a one-hot move over 128 samples is itself a convolution rknn-toolkit2 cuts into slices.
Only the samples the convolution reads are framed (a Slice drops a tail past the last window).

Why: rknn-toolkit2 cuts a 1-D convolution with a 256-tap kernel at stride 128 into slices of the batch and chains
of partial convolutions (Silero VAD's STFT over 32 windows: 64 convolutions, 4.66M of its 4.68M cycles); framed,
it is one convolution over 128 channels with a 2-tap kernel (about 22k cycles). Whether it pays is the vendor's
estimate to say (``vendor_runs.explore``).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from flexdsa_core._libraries import get_numpy_value
from flexdsa_core.fusions._naming import fresh_name
from flexdsa_core.targets.forms import VendorForm
from flexdsa_core.targets.forms.space_to_depth import MAX_MOVED_CHANNELS, attr_ints


class _FramedConv1d(RewriteRuleClassBase):
    def pattern(self, op, x, w):
        return op.Conv(x, w, _allow_other_inputs=True, _outputs=["conv_out"])

    def check(self, context, x, w, conv_out, **_) -> MatchResult:
        result = MatchResult()
        conv = conv_out.producer()
        weight = get_numpy_value(w)
        if weight is None or weight.ndim != 3:
            return result.fail(f"Conv '{conv.name}' is not 1-D with a constant weight.")
        if x.shape is None or not x.shape.is_static() or x.shape.rank() != 3:
            return result.fail(f"Conv '{conv.name}' input '{x.name}' has no static 3-D shape.")
        if conv.attributes.get_int("group", 1) != 1 or conv.attributes.get_string("auto_pad", "NOTSET") != "NOTSET":
            return result.fail(f"Conv '{conv.name}' is grouped or uses auto_pad.")
        if any(attr_ints(conv, "pads", [0, 0])) or attr_ints(conv, "dilations", [1]) != [1]:
            return result.fail(f"Conv '{conv.name}' is padded or dilated.")
        if len(conv.inputs) > 2 and conv.inputs[2] is not None and get_numpy_value(conv.inputs[2]) is None:
            return result.fail(f"Conv '{conv.name}' has a bias that is not a constant.")
        [stride] = attr_ints(conv, "strides", [1])
        if stride < 2:
            return result.fail(f"Conv '{conv.name}' is not strided.")
        channels = weight.shape[1]
        if channels * stride > MAX_MOVED_CHANNELS:
            return result.fail(f"Conv '{conv.name}': {channels * stride} channels once framed, over {MAX_MOVED_CHANNELS}.")
        used = _used(conv, x, weight)
        if isinstance(used, str):
            return result.fail(used)
        graph = context.graph_or_function
        self._names = [fresh_name(graph, f"{w.name}_frames_{part}") for part in ("start", "end", "axis", "shape", "merged", "weight")]
        return result

    def rewrite(self, op, x, w, conv_out, **_):
        conv = conv_out.producer()
        weight = get_numpy_value(w)
        [stride] = attr_ints(conv, "strides", [1])
        batch, channels, length = (int(d) for d in x.shape)
        used = _used(conv, x, weight)
        start, end, axis, shape, merged, weight_name = self._names
        signal = x
        if used < length:
            signal = op.Slice(x, _ints(op, start, [0]), _ints(op, end, [used]), _ints(op, axis, [2]))
        frames = used // stride
        if channels == 1:  # [n, 1, L] → [n, frames, s] → [n, s, frames]
            framed = op.Transpose(op.Reshape(signal, _ints(op, shape, [batch, frames, stride])), perm=[0, 2, 1])
        else:  # [n, c, L] → [n, c, frames, s] → [n, c, s, frames] → [n, c·s, frames]
            split = op.Reshape(signal, _ints(op, shape, [batch, channels, frames, stride]))
            framed = op.Reshape(op.Transpose(split, perm=[0, 1, 3, 2]),
                                _ints(op, merged, [batch, channels * stride, frames]))  # fmt: skip
        inputs = [framed, op.initializer(ir.tensor(framed_weight(weight, stride), name=weight_name))]
        if len(conv.inputs) > 2 and conv.inputs[2] is not None:
            inputs.append(conv.inputs[2])
        return op.Conv(*inputs, kernel_shape=[math.ceil(weight.shape[2] / stride)], strides=[1], pads=[0, 0])


def _ints(op, name: str, values: list[int]):
    return op.initializer(ir.tensor(np.array(values, np.int64), name=name))


def _used(conv: ir.Node, x: ir.Value, weight: np.ndarray) -> int | str:
    """The samples the framed convolution reads (whole frames); a sentence where the signal is too short."""
    [stride] = attr_ints(conv, "strides", [1])
    length, kernel = int(x.shape[2]), weight.shape[2]
    outputs = (length - kernel) // stride + 1
    used = (outputs - 1 + math.ceil(kernel / stride)) * stride
    if outputs < 1 or used > length:
        return (f"Conv '{conv.name}': framing its {length} samples by {stride} would read {used}, past the signal "
                "(its kernel is not a multiple of its stride)")  # fmt: skip
    return used


def framed_weight(weight: np.ndarray, stride: int) -> np.ndarray:
    """W'[o, c·s + r, a] = W[o, c, s·a + r], zero past the kernel."""
    outputs, channels, kernel = weight.shape
    taps = math.ceil(kernel / stride)
    padded = np.zeros((outputs, channels, taps * stride), weight.dtype)
    padded[:, :, :kernel] = weight
    return np.ascontiguousarray(
        padded.reshape(outputs, channels, taps, stride).transpose(0, 1, 3, 2).reshape(outputs, channels * stride, taps)
    )


FORM = VendorForm(
    name="strided_conv1d_frames",
    summary="Strided 1-D Conv over few channels → the signal framed by its stride (a view) + a stride-1 Conv",
    variants={"frames": _FramedConv1d.rule()},
    site_suffix="/frames",
)
