"""Empirical bias correction of a static QDQ model: each quantised Conv's int32 bias shifted by the mean error
its output carries, measured on the calibration samples, one layer at a time in graph order.

Rounding weights and activations to int8 moves the *mean* of a layer's output, channel by channel (a
depthwise filter of nine weights rounds to a sum a few steps off); the shift adds up layer after layer. For
each quantised Conv (its bias a DequantizeLinear of an int32 initializer), in graph order:

    delta_c = mean over samples and positions of (fp32 output_c - quantised output_c)
    bias_c += round(delta_c / bias_scale_c)

with the quantised output read after its own QuantizeLinear/DequantizeLinear (what the next layer reads) and
the fp32 one at the same tensor of the original graph. One layer at a time: each layer's mean is measured
with every earlier layer already corrected (correcting a group at once over-corrects what follows: on
EfficientNet-Lite0 ten at a time took held-out top-1 from 0.871 to 0.46, one at a time to 0.929). A layer
whose channels have fewer than ``MIN_VALUES`` values each over the samples (a classifier's Gemm: one per
sample) is left alone: its means would be the samples', not the quantisation's.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from flexdsa_core.precision.cache import _Tensors

__all__ = ["MIN_VALUES", "correct_biases", "probe_session", "run_on_files"]

MIN_VALUES = 256  # values per channel over the samples, at least, for a layer to be corrected
_RENAMED = "_QuantizeLinear_Input"  # the quantiser renames a graph output's producer output so


def probe_session(model: onnx.ModelProto, outputs: list[str], as_inputs: frozenset[str] = frozenset()):
    """An ORT_DISABLE_ALL session (each Q/DQ as written) of ``model`` that also returns ``outputs`` and takes
    the initializers named in ``as_inputs`` as feeds: one session serves every step of the correction."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    present = {o.name for o in probe.graph.output}
    probe.graph.output.extend(onnx.ValueInfoProto(name=n) for n in outputs if n not in present)
    moved = [init for init in probe.graph.initializer if init.name in as_inputs]
    for init in moved:
        probe.graph.initializer.remove(init)
        probe.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _channel_means(
    session, names: list[str], samples: list[dict], extra: dict | None = None
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Per tensor in ``names``: the mean over samples and positions of each channel (axis 1), and how many
    values each channel's mean is over."""
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = dict.fromkeys(names, 0)
    for feed in samples:
        for name, value in zip(names, session.run(names, {**feed, **(extra or {})}), strict=True):
            value = np.asarray(value, dtype=np.float64)
            axes = (0, *range(2, value.ndim))
            sums[name] = sums.get(name, 0.0) + value.sum(axis=axes)
            counts[name] += value.size // value.shape[1]
    return {name: sums[name] / counts[name] for name in names}, counts


def _layers(model: onnx.ModelProto, tensors: _Tensors, fp32_names: set[str]) -> list[dict]:
    found = []
    for node in model.graph.node:  # graph order (nodes may be unnamed)
        if node.op_type != "Conv" or len(node.input) < 3:
            continue
        bias = tensors.producer.get(node.input[2])
        if bias is None or bias.op_type != "DequantizeLinear" or bias.input[0] not in tensors.initializers:
            continue
        out = node.output[0]
        reference = out if out in fp32_names else out.removesuffix(_RENAMED)
        if reference not in fp32_names:
            continue
        read = out  # what the next layer reads: the output after its own Q/DQ, where there is one
        quantize = [r for r in tensors.readers.get(out, []) if r.op_type == "QuantizeLinear"]
        if quantize:
            dequantize = [r for r in tensors.readers.get(quantize[0].output[0], []) if r.op_type == "DequantizeLinear"]
            read = dequantize[0].output[0] if dequantize else out
        found.append({"bias": bias.input[0], "scale": bias.input[1], "read": read, "reference": reference})
    return found


SEGMENTS = 8  # sessions per correction, each running only the part of the graph its layers' outputs need


def _segments(layers: list[dict]) -> list[list[dict]]:
    """``layers`` (graph order) cut into ``SEGMENTS`` runs of consecutive layers.

    ONNX Runtime runs the whole graph whatever outputs are asked for, so measuring each layer on a session
    of the whole model ran every layer after it too: a layer's mean needs only the graph up to it. Each
    segment's session holds what its own layers' outputs need (``_needed_for``): about half the work of
    the whole graph per layer, for ``SEGMENTS`` session builds. Every node that runs, runs as it did in
    the whole graph, on the same inputs, so the means and the corrected biases are the same."""
    count = min(SEGMENTS, len(layers))
    bounds = [round(k * len(layers) / count) for k in range(count + 1)]
    return [layers[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def _needed_for(model: onnx.ModelProto, outputs: list[str]) -> onnx.ModelProto:
    """``model`` with only the nodes ``outputs`` depend on, and no graph outputs (``probe_session`` adds
    ``outputs``). A graph with control flow stays whole: a subgraph may read any value of the outer one."""
    nodes = model.graph.node
    scoped = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    if any(attribute.type in scoped for node in nodes for attribute in node.attribute):
        return model
    producer = {name: i for i, node in enumerate(nodes) for name in node.output if name}
    keep: set[int] = set()
    pending = list(outputs)
    while pending:
        i = producer.get(pending.pop())
        if i is not None and i not in keep:
            keep.add(i)
            pending.extend(name for name in nodes[i].input if name)
    needed = onnx.ModelProto()
    needed.CopyFrom(model)
    del needed.graph.node[:]
    needed.graph.node.extend(nodes[i] for i in sorted(keep))
    del needed.graph.output[:]
    return needed


def correct_biases(quantized: Path, fp32: Path, samples: list[dict], out: Path) -> dict:
    """Write ``quantized`` with its Conv biases corrected on ``samples`` (module doc-string) to ``out``; what
    was done: layers corrected, layers left, seconds."""
    started = time.perf_counter()
    model = onnx.load(str(quantized))
    original = onnx.load(str(fp32))
    fp32_names = {v for node in original.graph.node for v in node.output}
    tensors = _Tensors(model)
    layers = _layers(model, tensors, fp32_names) if samples else []
    references = sorted({layer["reference"] for layer in layers})
    wanted, counts = _channel_means(probe_session(original, references), references, samples) if layers else ({}, {})
    layers = [layer for layer in layers if counts[layer["reference"]] >= MIN_VALUES]
    if not layers:
        onnx.save(model, str(out))
        return {"corrected": 0, "why": "no quantised Conv with an int32 bias and enough values per channel"}
    biases = {layer["bias"]: numpy_helper.to_array(tensors.initializers[layer["bias"]]) for layer in layers}
    shifts = []
    for segment in _segments(layers):
        reads = [layer["read"] for layer in segment]
        session = probe_session(_needed_for(model, reads), reads, frozenset(biases))
        for layer in segment:  # in graph order, each measured with the earlier ones corrected
            got = _channel_means(session, [layer["read"]], samples, biases)[0][layer["read"]]
            delta = wanted[layer["reference"]] - got
            bias = biases[layer["bias"]]
            if bias.shape != delta.shape:
                continue
            scale = numpy_helper.to_array(tensors.initializers[layer["scale"]]).astype(np.float64)
            shifted = bias.astype(np.int64) + np.round(delta / scale)
            biases[layer["bias"]] = np.clip(shifted, -(2**31), 2**31 - 1).astype(np.int32)
            shifts.append(float(np.abs(delta).max()))
    for name, value in biases.items():
        tensors.initializers[name].CopyFrom(numpy_helper.from_array(value, name))
    onnx.save(model, str(out))
    return {
        "corrected": len(shifts),
        "largest_mean_shift": round(max(shifts), 6) if shifts else 0.0,
        "samples": len(samples),
        "seconds": round(time.perf_counter() - started, 2),
    }


def run_on_files(step, prog: str, argv: list[str] | None = None) -> int:
    """``python -m PROG QDQ FP32 SAMPLES OUT``: ``step(quantized, fp32, samples, out)`` on a QDQ model a vendor's
    quantiser made in its own environment (the qualcomm driver calls this module and ``precision.adaround`` so).
    SAMPLES: a JSON file ``{"inputs": [names], "dataset": [[.npy per input] or {name: .npy}, ...]}``, the
    quantiser's own calibration samples. Prints what was done as one JSON line."""
    import argparse
    import json

    parser = argparse.ArgumentParser(prog=f"python -m {prog}")
    for name in ("quantized", "fp32", "samples", "out"):
        parser.add_argument(name, type=Path)
    args = parser.parse_args(argv)
    listing = json.loads(args.samples.read_text())
    samples = [
        {name: np.load(path) for name, path in (row.items() if isinstance(row, dict) else zip(listing["inputs"], row, strict=True))}
        for row in listing["dataset"]
    ]
    print(json.dumps(step(args.quantized, args.fp32, samples, args.out)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """The correction of a vendor quantiser's QDQ model, from the command line (``run_on_files``)."""
    return run_on_files(correct_biases, "flexdsa_core.precision.bias_correction", argv)


if __name__ == "__main__":
    raise SystemExit(main())
