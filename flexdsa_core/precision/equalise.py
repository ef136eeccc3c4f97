"""Cross-layer equalisation (CLE, Nagel et al. 2019, "Data-Free Quantization"): the output channels of one
weight layer and the input channels of the layers that read it rescaled against each other, so that no
channel's range dwarfs the others' where int8 gives them one scale.

For a layer ``y = W1 x + b1`` whose output reaches the layers ``z = W2 f(y)`` through ops ``f`` that are
channel-wise and positive-homogeneous (``f(y / s) = f(y) / s`` for ``s > 0``: Relu, PRelu, LeakyRelu,
MaxPool, AveragePool, their Global forms, Identity), per channel ``c``:

    W1[c] /= s_c      b1[c] /= s_c      W2[:, c] *= s_c        s_c = 2 ** round(log2(sqrt(r1_c / r2_c)))

with ``r1_c`` the largest magnitude in W1's output channel ``c`` and ``r2_c`` the largest in the weights of
every reader that multiply input channel ``c``: both become about ``sqrt(r1_c * r2_c)``, and so do the
activation's channels between them, which share one per-tensor int8 scale. The scale is a power of two, so
every product and partial sum of both layers is scaled exactly (no rounding: the fp32 outputs are
bit-identical, barring subnormals) and the rewrite is exact, not close. Sweeps repeat until no scale moves
(at most ``SWEEPS``): equalising one pair changes the ranges its neighbours see.

A pair is refused, with the reason, where the rewrite would not be exact: Clip (ReLU6: ``Clip(y / s, 0, 6)``
clips at ``6 s``, not 6), a residual Add (both branches would need the same scales), an intermediate that is
a graph output, a weight shared with another node, a reader that is not a weight layer, or a Flatten/Reshape
between the layers (channels no longer on axis 1).
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["SWEEPS", "equalise", "max_relative_difference"]

SWEEPS = 4
# Positive-homogeneous, channel-wise ops a channel's scale passes through unchanged.
_PASS_THROUGH = frozenset({"Relu", "PRelu", "LeakyRelu", "MaxPool", "AveragePool", "GlobalAveragePool",
                           "GlobalMaxPool", "Identity"})  # fmt: skip
# Scales are clamped to this many powers of two either way: a dead channel (range 0) is left alone.
_MAX_EXPONENT = 16


def _attribute(node: onnx.NodeProto, name: str, default):
    found = next((a for a in node.attribute if a.name == name), None)
    return default if found is None else helper.get_attribute_value(found)


class _Graph:
    def __init__(self, model: onnx.ModelProto) -> None:
        self.initializers = {init.name: init for init in model.graph.initializer}
        self.arrays: dict[str, np.ndarray] = {}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in model.graph.node:
            for name in node.input:
                if name:
                    self.readers.setdefault(name, []).append(node)
        self.outputs = {output.name for output in model.graph.output}

    def array(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            self.arrays[name] = numpy_helper.to_array(self.initializers[name]).copy()
        return self.arrays[name]

    def owned(self, name: str, node: onnx.NodeProto) -> bool:
        """Whether ``name`` is a float initializer that ``node`` alone reads."""
        init = self.initializers.get(name)
        return (init is not None and init.data_type == onnx.TensorProto.FLOAT
                and all(reader is node for reader in self.readers.get(name, [])))  # fmt: skip


def _producer_why(graph: _Graph, node: onnx.NodeProto) -> str | None:
    """Why ``node``'s output channels (axis 1 of its output) cannot be scaled (None: they can)."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("Conv", "Gemm"):
        return "not a Conv or Gemm"
    if len(node.input) < 2 or not graph.owned(node.input[1], node):
        return "its weight is not an fp32 initializer of its own"
    if len(node.input) > 2 and node.input[2] and not graph.owned(node.input[2], node):
        return "its bias is not an fp32 initializer of its own"
    if node.op_type == "Gemm":
        if _attribute(node, "transA", 0) or _attribute(node, "alpha", 1.0) != 1.0 or _attribute(node, "beta", 1.0) != 1.0:
            return "a Gemm with transA, alpha or beta set"
        channels = _out_channels(graph, node)
        if len(node.input) > 2 and node.input[2] and graph.array(node.input[2]).size != channels:
            return "a Gemm whose bias is not one value per output channel"
    return None


def _out_channels(graph: _Graph, node: onnx.NodeProto) -> int:
    weight = graph.array(node.input[1])
    if node.op_type == "Gemm" and not _attribute(node, "transB", 0):
        return weight.shape[1]
    return weight.shape[0]


def _reader_columns(graph: _Graph, node: onnx.NodeProto, tensor: str, channels: int):
    """For a weight layer reading a ``channels``-channel tensor as its input: a function scaling its weight's
    input-channel columns by ``s`` in place, and the largest magnitude per input channel; or the reason it
    cannot be."""
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("Conv", "Gemm"):
        return f"read by a {node.op_type}, not a weight layer"
    if node.input[0] != tensor:
        return f"{node.op_type} {node.name!r} reads it as a weight"
    if len(node.input) < 2 or not graph.owned(node.input[1], node):
        return f"{node.op_type} {node.name!r}: its weight is not an fp32 initializer of its own"
    weight = graph.array(node.input[1])
    if node.op_type == "Gemm":
        if _attribute(node, "transA", 0) or _attribute(node, "alpha", 1.0) != 1.0:
            return f"Gemm {node.name!r}: transA or alpha set"
        axis = 1 if _attribute(node, "transB", 0) else 0
        if weight.shape[axis] != channels:
            return f"Gemm {node.name!r}: its input width is not the producer's channels"

        def scale(s: np.ndarray) -> None:
            weight[...] = weight * (s[None, :] if axis == 1 else s[:, None])

        ranges = np.abs(weight).max(axis=1 - axis)
        return scale, ranges
    groups = _attribute(node, "group", 1)
    per_group_in = weight.shape[1]
    if per_group_in * groups != channels or weight.shape[0] % groups:
        return f"Conv {node.name!r}: its input channels are not the producer's"
    per_group_out = weight.shape[0] // groups
    # Input channel read by weight[o, j]: (o // per_group_out) * per_group_in + j.
    index = (np.arange(weight.shape[0])[:, None] // per_group_out) * per_group_in + np.arange(per_group_in)[None, :]
    magnitude = np.abs(weight).reshape(weight.shape[0], per_group_in, -1).max(axis=2)
    ranges = np.zeros(channels, dtype=weight.dtype)
    np.maximum.at(ranges, index.ravel(), magnitude.ravel())

    def scale_conv(s: np.ndarray) -> None:
        weight[...] = weight * s[index].reshape(index.shape + (1,) * (weight.ndim - 2))

    return scale_conv, ranges


def _pair(graph: _Graph, producer: onnx.NodeProto):
    """The readers of ``producer``'s channels past the pass-through ops, or the reason there are none."""
    tensor = producer.output[0]
    while True:
        if tensor in graph.outputs:
            return f"{tensor!r} is a graph output"
        readers = graph.readers.get(tensor, [])
        if not readers:
            return "its output is not read"
        if len(readers) == 1 and readers[0].op_type in _PASS_THROUGH and readers[0].domain in ("", "ai.onnx"):
            if readers[0].op_type == "PRelu" and readers[0].input[0] != tensor:
                return "it is the slope of a PRelu"
            tensor = readers[0].output[0]
            continue
        if any(r.op_type == "Clip" for r in readers):
            return "a Clip (ReLU6) follows: not positive-homogeneous, scaling would move where it clips"
        if any(r.op_type in ("Add", "Sum", "Concat") for r in readers):
            return f"a {next(r.op_type for r in readers if r.op_type in ('Add', 'Sum', 'Concat'))} joins it to another branch"
        if any(r.op_type in ("Flatten", "Reshape", "Transpose") for r in readers):
            return "a Flatten/Reshape/Transpose moves its channels off axis 1"
        return tensor, readers


def equalise(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    """A copy of ``model`` with cross-layer equalisation (module docstring) and what was done: pairs equalised,
    pairs refused by reason, sweeps, the largest scale applied (log2)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = _Graph(model)
    pairs, refused = [], Counter()
    for node in model.graph.node:
        why = _producer_why(graph, node)
        if why == "not a Conv or Gemm":
            continue
        if why is None:
            found = _pair(graph, node)
            if isinstance(found, str):
                why = found
            else:
                tensor, readers = found
                channels = _out_channels(graph, node)
                columns = [_reader_columns(graph, reader, tensor, channels) for reader in readers]
                why = next((c for c in columns if isinstance(c, str)), None)
                if why is None:
                    pairs.append((node, columns))
        if why is not None:
            refused[why] += 1
    total = np.zeros(0)
    exponents_applied: dict[str, np.ndarray] = {}
    sweeps = 0
    for sweeps in range(1, SWEEPS + 1):  # noqa: B007 - how many ran is reported
        moved = False
        for producer, columns in pairs:
            weight = graph.array(producer.input[1])
            axis = 1 if producer.op_type == "Gemm" and not _attribute(producer, "transB", 0) else 0
            r1 = np.abs(np.moveaxis(weight, axis, 0)).reshape(weight.shape[axis], -1).max(axis=1)
            r2 = np.max([ranges for _, ranges in columns], axis=0)
            with np.errstate(divide="ignore", invalid="ignore"):
                exponent = np.round(0.5 * np.log2(r1.astype(np.float64) / r2))
            exponent = np.where(np.isfinite(exponent), np.clip(exponent, -_MAX_EXPONENT, _MAX_EXPONENT), 0.0)
            if not exponent.any():
                continue
            moved = True
            s = np.exp2(exponent).astype(weight.dtype)
            shape = [1] * weight.ndim
            shape[axis] = -1
            weight[...] = weight / s.reshape(shape)
            if len(producer.input) > 2 and producer.input[2]:
                bias = graph.array(producer.input[2])
                bias[...] = bias / s.reshape(bias.shape)
            for scale, ranges in columns:
                scale(s)
                ranges[...] = ranges * s
            key = producer.name or producer.output[0]
            exponents_applied[key] = exponents_applied.get(key, 0.0) + exponent
        if not moved:
            break
    for name, array in graph.arrays.items():
        graph.initializers[name].CopyFrom(numpy_helper.from_array(array, name))
    if exponents_applied:
        total = np.concatenate([np.abs(e).ravel() for e in exponents_applied.values()])
    return model, {
        "pairs": len(pairs),
        "layers_rescaled": len(exponents_applied),
        "channels_rescaled": int(np.count_nonzero(total)),
        "largest_scale_log2": int(total.max()) if total.size else 0,
        "sweeps": sweeps,
        "refused": dict(refused.most_common()),
        "exact": "power-of-two scales through positive-homogeneous ops: fp32 outputs bit-identical",
    }


def max_relative_difference(reference: list[dict], got: list[dict]) -> float:
    """The largest |a - b| / max|a| over outputs and samples (0.0: bit-identical)."""
    worst = 0.0
    for want, have in zip(reference, got, strict=True):
        for name, value in want.items():
            scale = float(np.abs(value).max()) or 1.0
            worst = max(worst, float(np.abs(value.astype(np.float64) - have[name]).max()) / scale)
    return worst if math.isfinite(worst) else math.inf
