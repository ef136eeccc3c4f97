"""A 1-D convolution over a short sequence as one matrix product over the whole batch.

ONNX Runtime's CPU ``Conv`` on a ``[N, C, L]`` input runs one im2col and one small GEMM per batch row: with
a short output (``L_out`` of a few frames, as in an audio model that convolves 32 ms chunks stacked along
the batch, Silero VAD's STFT and encoder) each GEMM is ``C_out x L_out x C·k``, far too narrow for the GEMM
kernel, and the Conv runs at a tenth of the machine's SGEMM rate. The same arithmetic as one product of
``[N·L_out, k·C]`` frames by a ``[k·C, C_out]`` weight runs at the full rate:

    Transpose(x, [0, 2, 1])                 [N, L, C]  channels last
    Pad (the Conv's pads, zeros)            [N, L + p0 + p1, C]
    frames: Gather of the taps along L      [N, L_out, k, C] -> Reshape [N, L_out, k·C]
        or, when the stride divides the kernel: Reshape into stride-long blocks [N, ·, s·C] and Concat of
        k/s shifted Slices (a Gather of one-channel taps copies element by element)
    MatMul(frames, W')                      W' = W transposed to [k, C, C_out], reshaped [k·C, C_out]
    Add(bias), the activation of a FusedConv
    Transpose(·, [0, 2, 1])                 [N, C_out, L_out]

Between two such convolutions the Transposes meet and the algebraic pass removes them. ``Conv`` and
``com.microsoft::FusedConv`` (``conv_bias_act`` runs first) with group 1, float32, constant weights and a
static channel count and length are matched; the result is the same sums in another order (float
rounding only).

Taken only where kernels are timed on this machine (``measured_only``): whether the product beats the
Conv depends on the Conv kernel's efficiency at that shape, which a roofline does not model, and on an
accelerator the Conv is the native op. The switcher times both sides at the bucket's shapes and takes a
match only when it is significantly faster.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from flexdsa_core._libraries import get_numpy_value
from flexdsa_core.fusions._activation import Activation
from flexdsa_core.fusions._dtypes import FLOAT32, dtype_refusal
from flexdsa_core.fusions._naming import fresh_name
from flexdsa_core.fusions.base import make_rule

# FusedConv's activations and how many float parameters each takes (ONNX Runtime's order).
_ACTIVATION_PARAMS = {"Relu": 0, "Sigmoid": 0, "Tanh": 0, "LeakyRelu": 1, "HardSigmoid": 2, "Clip": 2}
# The im2col buffer the frames take, in elements per batch row: a longer sequence is left to the Conv
# (its own kernel tiles it; frames of a long signal would copy it k/s times).
_MAX_FRAME_ELEMENTS = 1 << 20
# At most this many shifted Slices for the block form; beyond it the Gather form.
_MAX_BLOCK_SLICES = 8


def _static_int(dim) -> int | None:
    return dim if isinstance(dim, int) else None


class _Conv1dAsMatMul(RewriteRuleClassBase):
    fused = False

    def pattern(self, op, x):
        if self.fused:
            return op.FusedConv(x, _allow_other_inputs=True, _domain="com.microsoft", _outputs=["conv_out"])
        return op.Conv(x, _allow_other_inputs=True, _outputs=["conv_out"])

    def check(self, context, x, conv_out, **_) -> MatchResult:
        result = MatchResult()
        conv = conv_out.producer()
        weight = conv.inputs[1]
        refusal = dtype_refusal("MatMul", FLOAT32, x, weight)
        if refusal:
            return result.fail(refusal)
        if x.shape is None or x.shape.rank() != 3:
            return result.fail(f"'{x.name}' is not a known [N, C, L] (1-D convolution) input.")
        channels, length = _static_int(x.shape[1]), _static_int(x.shape[2])
        if channels is None or length is None:
            return result.fail(f"'{x.name}' has no static channel count and length ({x.shape}).")
        w = get_numpy_value(weight)
        if w is None or w.ndim != 3:
            return result.fail(f"Conv weight '{weight.name}' is not a constant [C_out, C, k].")
        bias_value = conv.inputs[2] if len(conv.inputs) > 2 else None
        bias = get_numpy_value(bias_value) if bias_value is not None else None
        if bias_value is not None and bias is None:
            return result.fail(f"Conv bias '{bias_value.name}' is not a constant.")
        attrs = conv.attributes
        if attrs.get_int("group", 1) != 1 or w.shape[1] != channels:
            return result.fail("A grouped (or depthwise) Conv is not one matrix product.")
        auto_pad = attrs.get_string("auto_pad", "NOTSET")
        if auto_pad not in ("NOTSET", "VALID"):
            return result.fail("auto_pad SAME_* is left to the Conv.")
        kernel = int(w.shape[2])
        stride = int(attrs.get_ints("strides", [1])[0])
        dilation = int(attrs.get_ints("dilations", [1])[0])
        pads = [0, 0] if auto_pad == "VALID" else [int(p) for p in attrs.get_ints("pads", [0, 0])]
        padded = length + pads[0] + pads[1]
        span = dilation * (kernel - 1) + 1
        if padded < span:
            return result.fail(f"The kernel ({span}) is longer than the padded input ({padded}).")
        out_length = (padded - span) // stride + 1
        if out_length * kernel * channels > _MAX_FRAME_ELEMENTS:
            return result.fail(
                f"The frames would take {out_length * kernel * channels} elements a batch row "
                f"(over {_MAX_FRAME_ELEMENTS}): the Conv's own tiling is left to do it."
            )
        activation = None
        if self.fused:
            name = attrs.get_string("activation", "")
            params = tuple(float(p) for p in attrs.get_floats("activation_params", []))
            if name not in _ACTIVATION_PARAMS or len(params) != _ACTIVATION_PARAMS[name]:
                return result.fail(
                    f"FusedConv activation {name!r} {list(params)} is not one this rule re-emits."
                )
            activation = Activation(name, params)
        graph = context.graph_or_function
        base = fresh_name(graph, f"{weight.name or 'conv'}_gemm")
        self._plan = {
            "channels": channels, "kernel": kernel, "stride": stride, "dilation": dilation, "pads": pads,
            "padded": padded, "out_length": out_length, "activation": activation,
            "weight": np.ascontiguousarray(w.transpose(2, 1, 0).reshape(kernel * channels, w.shape[0])),
            "bias": None if bias is None else np.ascontiguousarray(bias.reshape(-1)),
            "names": _Names(graph, base),
        }  # fmt: skip
        return result

    def rewrite(self, op, x, conv_out, **_):
        plan = self._plan
        names: _Names = plan["names"]

        def _ints(op, values):
            return names.constant(op, np.asarray(values, dtype=np.int64))

        channels, kernel, stride = plan["channels"], plan["kernel"], plan["stride"]
        dilation, out_length, pads = plan["dilation"], plan["out_length"], plan["pads"]
        last = op.Transpose(x, perm=[0, 2, 1])
        if pads[0] or pads[1]:
            last = op.Pad(last, _ints(op, [0, pads[0], 0, 0, pads[1], 0]))
        if dilation == 1 and stride > 1 and kernel % stride == 0 and kernel // stride <= _MAX_BLOCK_SLICES:
            # Stride-long blocks: frame o is blocks o .. o + k/s - 1, one after the other.
            needed = (out_length - 1) * stride + kernel
            if plan["padded"] > needed:
                last = op.Slice(last, _ints(op, [0]), _ints(op, [needed]), _ints(op, [1]))
            blocks = op.Reshape(last, _ints(op, [0, needed // stride, stride * channels]))
            parts = [
                op.Slice(blocks, _ints(op, [j]), _ints(op, [j + out_length]), _ints(op, [1]))
                for j in range(kernel // stride)
            ]
            frames = parts[0] if len(parts) == 1 else op.Concat(*parts, axis=2)
        else:
            taps = np.arange(out_length)[:, None] * stride + np.arange(kernel)[None, :] * dilation
            gathered = op.Gather(last, _ints(op, taps), axis=1)
            frames = op.Reshape(gathered, _ints(op, [0, out_length, kernel * channels]))
        out = op.MatMul(frames, names.constant(op, plan["weight"]))
        if plan["bias"] is not None:
            out = op.Add(out, names.constant(op, plan["bias"]))
        activation = plan["activation"]
        if activation is not None:
            out = _activation(op, activation, out, names)
        return op.Transpose(out, perm=[0, 2, 1])


class _Names:
    """Initializers for one rewrite, named ``<base>_0``, ``<base>_1``... (``base`` is fresh in the graph, and
    so is every name made from it; identical arrays share one). Initializers, not Constant nodes: the
    switcher times the replacement alone, and a Slice or Reshape is run there only with constant inputs it
    can read."""

    def __init__(self, graph, base: str):
        self.graph, self.base, self.made = graph, base, []

    def constant(self, op, array: np.ndarray) -> ir.Value:
        for known, value in self.made:
            if known.dtype == array.dtype and known.shape == array.shape and np.array_equal(known, array):
                return value
        value = op.initializer(ir.tensor(array), name=fresh_name(self.graph, f"{self.base}_{len(self.made)}"))
        self.made.append((array, value))
        return value


def _activation(op, activation: Activation, x, names: _Names):
    params = activation.params
    if activation.op_type == "LeakyRelu":
        return op.LeakyRelu(x, alpha=params[0])
    if activation.op_type == "HardSigmoid":
        return op.HardSigmoid(x, alpha=params[0], beta=params[1])
    if activation.op_type == "Clip":
        low, high = (names.constant(op, np.asarray(v, dtype=np.float32)) for v in params)
        return op.Clip(x, low, high)
    return getattr(op, activation.op_type)(x)


class Conv1dAsMatMul(_Conv1dAsMatMul):
    """Conv(x [N, C, L], W [C_out, C, k], B) → Transpose, frames, MatMul(W'), Add(B), Transpose"""


class FusedConv1dAsMatMul(_Conv1dAsMatMul):
    """FusedConv(x, W, B, activation) → the same with the activation after the Add"""

    fused = True


RULES = [
    make_rule(
        "conv1d_gemm",
        "A 1-D Conv over a short sequence as one MatMul of its frames over the whole batch (cpu-ort, timed).",
        ["Transpose", "Gather", "Reshape", "MatMul"],
        [Conv1dAsMatMul.rule(), FusedConv1dAsMatMul.rule()],
        # the bias Add and the activation are folded into the Conv first, and come out after the MatMul
        after=("conv_add_bias", "conv_bias_act"),
        measured_only=True,
    ),
]
