"""Learned rounding (AdaRound) of a static QDQ model's int8 weights: each quantised Conv, Gemm and MatMul weight
rounded up or down, not to nearest, so that the layer's output on the calibration samples moves least.

Rounding each weight to its nearest int8 step minimises each weight's own error, not the layer's: errors of
weights that read correlated inputs add up or cancel in the output. For one layer with float weights ``W`` (a
row per output channel), per-channel scale ``s`` and input columns ``X`` (im2col for a Conv, the rows of a
MatMul's input), the output error of a rounding ``Q`` is

    E(Q) = sum over rows r of (s_r Q_r - W_r) G (s_r Q_r - W_r)^T / P,    G = X X^T over the samples' P columns

so the samples enter only through the Gram matrix ``G`` (K x K, K = input channels x kernel): one pass over the
samples per layer, then every step of the search is a matrix product of the weights' size. ``Q = floor(W/s) +
h(V)``, with ``h`` the rectified sigmoid of the AdaRound paper (Nagel et al., 2020) started at each weight's
fractional part; Adam minimises ``E`` (relative to round-to-nearest's) plus a term pulling each ``h`` to 0 or 1
whose exponent is annealed from ``BETA[0]`` to ``BETA[1]``; then ``h >= 0.5`` rounds up. Every weight stays on
its floor or its ceiling (one step from nearest at most), inside the range the quantiser used for that tensor,
and a layer whose learned rounding is not below nearest's error keeps nearest. Inputs are the fp32 model's
(the paper's plain objective), read with the graph run as written.

Per group of a grouped Conv (a depthwise one: a 9 x 9 ``G`` per channel) the rows and ``G`` are batched, so a
layer costs ``ITERATIONS`` batched products; a layer whose product is past ``MAX_WORK`` multiply-adds per step
takes proportionally fewer steps (MiniLM's 1536-wide projections), and the whole model stays within
``MAX_TOTAL_WORK`` (``_steps``: fewer steps for every layer, then nearest rounding for the last ones).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from flexdsa_core.precision.bias_correction import probe_session, run_on_files
from flexdsa_core.precision.cache import _Tensors

__all__ = ["adaround"]

ITERATIONS = 400
WARM_UP = 0.2  # share of the steps without the pull to 0/1 (the paper's 20%)
BETA = (20.0, 2.0)
REGULARISATION = 30.0  # against the output error relative to nearest's (EfficientNet-Lite0: 0.01 to 100 tried)
LEARNING_RATE = 0.05
ZETA, GAMMA = 1.1, -0.1
V_LIMIT = 20.0  # h is 0 or 1 well inside it (sigmoid(+-2.4) already)
MAX_WORK = 2e8  # multiply-adds per step above which a layer takes fewer steps
MIN_ITERATIONS = 100
# Multiply-adds over every step of every layer, at most (EfficientNet-Lite0 needs 7.2e11, about 10 s here): past
# it every layer takes proportionally fewer steps, down to ``MIN_ITERATIONS``, then the later layers in graph order
# keep nearest rounding (a BERT-base encoder would need 1.5e13).
MAX_TOTAL_WORK = 1e12
# Input columns per row of G, at least: with fewer, G has too few samples behind it and the rounding fits the
# calibration samples, not the layer (a classifier's Gemm: one column per sample).
MIN_COLUMNS_PER_INPUT = 1


def _layers(model: onnx.ModelProto, original: onnx.ModelProto, tensors: _Tensors) -> list[dict]:
    """Each Conv/Gemm/MatMul of ``model`` whose weight is a DequantizeLinear of an integer initializer, with the
    float weight and the input of the same node in ``original`` (node names survive the quantiser)."""
    fp32 = {node.name: node for node in original.graph.node if node.name}
    weights = {init.name: init for init in original.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul") or node.name not in fp32 or len(node.input) < 2:
            continue
        dq = tensors.producer.get(node.input[1])
        reference = fp32[node.name]
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in tensors.initializers:
            continue
        if reference.op_type != node.op_type or reference.input[1] not in weights:
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        dq_axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
        if node.op_type == "Gemm" and (attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0):
            continue
        found.append({
            "node": node.name, "op": node.op_type, "attrs": attrs, "int": dq.input[0], "axis": dq_axis,
            "scale": numpy_helper.to_array(tensors.initializers[dq.input[1]]).astype(np.float64),
            "zero": (numpy_helper.to_array(tensors.initializers[dq.input[2]]).astype(np.float64)
                     if len(dq.input) > 2 and dq.input[2] in tensors.initializers else np.zeros(1)),
            "weight": numpy_helper.to_array(weights[reference.input[1]]).astype(np.float64),
            "input": reference.input[0],
        })  # fmt: skip
    return found


def _rows(layer: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The layer's weight as [groups, rows, K] with each row's scale and zero point ([groups, rows, 1]), or None
    where its quantisation axis is not its output channel's."""
    weight, op, attrs = layer["weight"], layer["op"], layer["attrs"]
    if op == "Conv":
        out_axis, groups = 0, int(attrs.get("group", 1))
        rows = weight.reshape(groups, weight.shape[0] // groups, -1)
    elif op == "Gemm" and attrs.get("transB", 0):
        out_axis, groups, rows = 0, 1, weight[None]
    elif weight.ndim == 2:  # MatMul, or Gemm without transB: [K, N], a row per output column
        out_axis, groups, rows = 1, 1, weight.T[None]
    else:
        return None
    count = weight.shape[out_axis]
    per = []
    for name in ("scale", "zero"):
        value = layer[name]
        if value.size == 1:
            per.append(np.full(count, float(value.reshape(-1)[0])))
        elif value.size == count and layer["axis"] % weight.ndim == out_axis:
            per.append(value.reshape(-1))
        else:
            return None
    scale, zero = (v.reshape(groups, count // groups, 1) for v in per)
    return rows, scale, zero


def _columns(value: np.ndarray, layer: dict) -> np.ndarray:
    """The layer's input as [groups, K, P]: im2col for a Conv (pads, strides, dilations), rows for the rest."""
    if layer["op"] != "Conv":
        return value.reshape(-1, value.shape[-1]).T[None]
    attrs, kernel = layer["attrs"], layer["weight"].shape[2:]
    spatial = len(kernel)
    strides = attrs.get("strides") or [1] * spatial
    dilations = attrs.get("dilations") or [1] * spatial
    pads = attrs.get("pads") or [0] * (2 * spatial)
    padded = np.pad(value, [(0, 0), (0, 0), *[(pads[i], pads[i + spatial]) for i in range(spatial)]])
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations, strict=True)]
    windows = np.lib.stride_tricks.sliding_window_view(padded, span, axis=tuple(range(2, 2 + spatial)))
    index = (slice(None), slice(None), *[slice(None, None, s) for s in strides], *[slice(None, None, d) for d in dilations])
    windows = windows[index]  # [N, C, *out, *kernel]
    groups = int(attrs.get("group", 1))
    n, channels = windows.shape[:2]
    out = windows.shape[2 : 2 + spatial]
    # -> [groups, C/groups * kernel, N * out]
    moved = np.moveaxis(windows, 1, -1 - spatial)  # [N, *out, C, *kernel]
    cols = moved.reshape(n * int(np.prod(out)), groups, channels // groups * int(np.prod(kernel)))
    return np.transpose(cols, (1, 2, 0))


def _grams(session, layers: list[dict], samples: list[dict]) -> tuple[list[np.ndarray | None], list[int]]:
    """Per layer, G = X X^T over the samples ([groups, K, K]) and the column count P."""
    names = sorted({layer["input"] for layer in layers})
    grams: list[np.ndarray | None] = [None] * len(layers)
    counts = [0] * len(layers)
    for feed in samples:
        values = dict(zip(names, session.run(names, feed), strict=True))
        for index, layer in enumerate(layers):
            cols = _columns(np.asarray(values[layer["input"]], dtype=np.float32), layer)
            gram = (cols @ np.transpose(cols, (0, 2, 1))).astype(np.float64)
            grams[index] = gram if grams[index] is None else grams[index] + gram
            counts[index] += cols.shape[-1]
    return grams, counts


def _error(q: np.ndarray, rows: np.ndarray, scale: np.ndarray, zero: np.ndarray, gram: np.ndarray) -> float:
    diff = scale * (q - zero) - rows
    return float(np.sum((diff @ gram) * diff))


def _steps(layers: list[dict]) -> list[int]:
    """Adam steps per layer within ``MAX_WORK`` per step and ``MAX_TOTAL_WORK`` in all; 0: past the budget."""
    work = [rows.shape[0] * rows.shape[1] * rows.shape[2] ** 2 for rows in (layer["rows"] for layer in layers)]
    steps = [max(MIN_ITERATIONS, min(ITERATIONS, int(ITERATIONS * MAX_WORK / max(w, 1)))) for w in work]
    total = sum(w * n for w, n in zip(work, steps, strict=True))
    if total > MAX_TOTAL_WORK:
        steps = [max(MIN_ITERATIONS, int(n * MAX_TOTAL_WORK / total)) for n in steps]
    spent, found = 0.0, []
    for w, n in zip(work, steps, strict=True):
        spent += w * n
        found.append(n if spent <= MAX_TOTAL_WORK else 0)
    return found


def _learn(rows: np.ndarray, scale: np.ndarray, zero: np.ndarray, gram: np.ndarray, low: float, high: float,
           steps: int) -> tuple[np.ndarray, float, float]:  # fmt: skip
    """The rounding of ``rows`` (module docstring): integer values [groups, rows, K], and the output error of
    nearest rounding and of the learned one."""
    exact = rows / scale + zero
    floor = np.floor(exact)
    nearest = np.clip(np.round(exact), low, high)
    base = _error(nearest, rows, scale, zero, gram)
    if base <= 0:
        return nearest, base, base
    fraction = np.clip(exact - floor, 1e-3, 1 - 1e-3)
    v = -np.log((ZETA - GAMMA) / (fraction - GAMMA) - 1)
    movable = (floor >= low) & (floor + 1 <= high)  # else the clip decides, not the rounding
    # The product with G in float32 (the costly part); the rest in float64 with v kept in [-V_LIMIT, V_LIMIT], so
    # that nothing falls into subnormal floats (|2h - 1| ** 19 near h = 0.5 would: their arithmetic is a
    # hundred times slower on x86 where the flush-to-zero mode is off).
    gram32 = gram.astype(np.float32)
    m, s2 = np.zeros_like(v), np.zeros_like(v)
    count = rows.size
    for step in range(steps):
        sig = 1 / (1 + np.exp(-v))
        h = np.clip(sig * (ZETA - GAMMA) + GAMMA, 0, 1)
        q = np.where(movable, floor + h, nearest)
        diff = scale * (q - zero) - rows
        grad = (2 / base) * (diff.astype(np.float32) @ gram32).astype(np.float64) * scale  # d(E / E_nearest)/dq
        progress = step / steps
        if progress >= WARM_UP:
            beta = BETA[0] + (BETA[1] - BETA[0]) * (progress - WARM_UP) / (1 - WARM_UP)
            centred = 2 * h - 1
            pull = np.maximum(np.abs(centred), 1e-12) ** (beta - 1)
            grad = grad + REGULARISATION * (-2 * beta * pull * np.sign(centred)) / count
        inside = (h > 0) & (h < 1) & movable
        grad = np.where(inside, grad * sig * (1 - sig) * (ZETA - GAMMA), 0.0)
        m = 0.9 * m + 0.1 * grad
        s2 = 0.999 * s2 + 0.001 * grad**2
        v -= LEARNING_RATE * (m / (1 - 0.9 ** (step + 1))) / (np.sqrt(s2 / (1 - 0.999 ** (step + 1))) + 1e-8)
        np.clip(v, -V_LIMIT, V_LIMIT, out=v)
    h = np.clip(1 / (1 + np.exp(-v)) * (ZETA - GAMMA) + GAMMA, 0, 1)
    learned = np.where(movable, floor + (h >= 0.5), nearest)
    return learned, base, _error(learned, rows, scale, zero, gram)


def adaround(quantized: Path, fp32: Path, samples: list[dict], out: Path) -> dict:
    """Write ``quantized`` with its integer weights rounded as the module docstring says to ``out``; what was
    done: layers rounded, their output error against nearest rounding, layers left and why, seconds."""
    started = time.perf_counter()
    model = onnx.load(str(quantized))
    original = onnx.load(str(fp32))
    tensors = _Tensors(model)
    layers, left = [], {}
    for layer in _layers(model, original, tensors) if samples else []:
        if layer["attrs"].get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
            left[layer["node"]] = "its padding is auto_pad, which the input columns are not made for"
            continue
        shaped = _rows(layer)
        if shaped is None:
            left[layer["node"]] = "its weight is not quantised along its output channels"
            continue
        layer["rows"], layer["row_scale"], layer["row_zero"] = shaped
        layers.append(layer)
    if not layers:
        onnx.save(model, str(out))
        return {"rounded": 0, "left": left, "why": "no quantised Conv/Gemm/MatMul weight with its float original"}
    session = probe_session(original, sorted({layer["input"] for layer in layers}))
    grams, counts = _grams(session, layers, samples)
    eligible = []
    for layer, gram, count in zip(layers, grams, counts, strict=True):
        if gram is None or gram.shape[-1] != layer["rows"].shape[-1]:
            left[layer["node"]] = "its input columns do not match its weight"
        elif count < MIN_COLUMNS_PER_INPUT * gram.shape[-1]:
            left[layer["node"]] = (f"{count} input columns over the samples for {gram.shape[-1]} inputs (fewer than "
                                   f"{MIN_COLUMNS_PER_INPUT} each): its rounding would fit the samples")  # fmt: skip
        else:
            eligible.append((layer, gram / count))
    ratios = []
    for (layer, gram), steps in zip(eligible, _steps([layer for layer, _ in eligible]), strict=True):
        if not steps:
            left[layer["node"]] = f"past learned rounding's budget of {MAX_TOTAL_WORK:.0e} multiply-adds"
            continue
        init = tensors.initializers[layer["int"]]
        current = numpy_helper.to_array(init)
        low, high = float(current.min()), float(current.max())  # the range the quantiser used
        learned, base, error = _learn(layer["rows"], layer["row_scale"], layer["row_zero"], gram, low, high, steps)
        if not error < base:
            left[layer["node"]] = "learned rounding was not below nearest's output error"
            continue
        values = learned.reshape(layer["rows"].shape)
        if layer["op"] == "Conv":
            values = values.reshape(layer["weight"].shape)
        elif layer["op"] == "Gemm" and layer["attrs"].get("transB", 0):
            values = values[0]
        else:
            values = values[0].T
        init.CopyFrom(numpy_helper.from_array(values.astype(current.dtype), layer["int"]))
        ratios.append(error / base)
    onnx.save(model, str(out))
    return {
        "rounded": len(ratios),
        "output_error_vs_nearest": {"median": round(float(np.median(ratios)), 4), "worst": round(float(max(ratios)), 4),
                                    "best": round(float(min(ratios)), 4)} if ratios else None,  # fmt: skip
        "left": left,
        "samples": len(samples),
        "seconds": round(time.perf_counter() - started, 2),
    }


def main(argv: list[str] | None = None) -> int:
    """Learned rounding of a vendor quantiser's QDQ model, from the command line (``bias_correction.run_on_files``:
    ``python -m flexdsa_core.precision.adaround QDQ FP32 SAMPLES OUT``)."""
    return run_on_files(adaround, "flexdsa_core.precision.adaround", argv)


if __name__ == "__main__":
    raise SystemExit(main())
