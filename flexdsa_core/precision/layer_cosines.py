"""Where the quantised model departs from the fp32 one, per layer: the cosine of each layer's output tensor in
the shipped model to the same tensor in the fp32 model, on held-out samples.

``precision.layers`` says per quantisable layer what the quantiser was asked to do and why; this adds what it
did to the numbers. A layer's cosine is over every held-out sample and position at once (``cosine``) and its
worst sample (``worst_sample_cosine``): an int8 layer whose cosine drops where its inputs were still close is
where the error enters; a float layer's cosine below 1 is error carried in from upstream. Both models run
as written (``ORT_DISABLE_ALL``), so each tensor is the one the graph names, not one a fused kernel replaced.

The quantiser keeps each compute node's name and output name, except where the output is a graph output:
there the node's output is renamed (``<name>_QuantizeLinear_Input``) and the graph output is the
DequantizeLinear's. A node whose Relu the quantiser folded into its output range writes the Relu's output
(its negative values are clipped by the QuantizeLinear after it). Where a layer's output is quantised, what
is compared is what its readers read: the DequantizeLinear's output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

__all__ = ["MAX_LAYERS", "MAX_SAMPLES", "layer_cosines"]

MAX_SAMPLES = 16  # held-out samples run through both models (the figure is per layer, not a claim)
MAX_LAYERS = 400  # layers probed at most, in graph order (the rest are left without a figure)
_RENAMED = "_QuantizeLinear_Input"


def layer_cosines(fp32: Path, quantised: Path, layers: list[str], samples: list[dict]) -> dict[str, dict]:
    """Per layer of ``layers`` (node names of the shipped graph) whose output the fp32 graph also computes: ``{"tensor", "cosine",
    "worst_sample_cosine"}`` over ``samples`` (at most ``MAX_SAMPLES``); layers not found are left out."""
    reference, candidate = onnx.load(str(fp32)), onnx.load(str(quantised))
    wanted = set(layers)
    # A layer is compared at the tensor its node writes in the shipped model (a Relu the quantiser folded into
    # the layer's output range makes that the Relu's output), against the fp32 tensor of that name.
    outputs = {node.name: node.output[0] for node in candidate.graph.node if node.name in wanted and node.output}
    produced = {out for node in reference.graph.node for out in node.output}
    # Where the layer's output is quantised, its readers read the DequantizeLinear's output: that is compared.
    quantise = {n.input[0]: n.output[0] for n in candidate.graph.node if n.op_type == "QuantizeLinear"}
    dequantise = {n.input[0]: n.output[0] for n in candidate.graph.node if n.op_type == "DequantizeLinear"}
    pairs: dict[str, tuple[str, str]] = {}
    for layer in layers:
        tensor = outputs.get(layer)
        if tensor is None or len(pairs) >= MAX_LAYERS:
            continue
        original = tensor.removesuffix(_RENAMED)
        if original in produced:
            pairs[layer] = (original, dequantise.get(quantise.get(tensor, ""), tensor))
    if not pairs or not samples:
        return {}
    left = _run(reference, [a for a, _ in pairs.values()], samples[:MAX_SAMPLES])
    right = _run(candidate, [b for _, b in pairs.values()], samples[:MAX_SAMPLES])
    found = {}
    for layer, (a, b) in pairs.items():
        per_sample = [_cosine(x, y) for x, y in zip(left[a], right[b], strict=True)]
        whole = _cosine(np.concatenate([x.ravel() for x in left[a]]), np.concatenate([y.ravel() for y in right[b]]))
        found[layer] = {"tensor": a, "cosine": round(whole, 6), "worst_sample_cosine": round(min(per_sample), 6)}
    return found


def _run(model: onnx.ModelProto, names: list[str], samples: list[dict]) -> dict[str, list[np.ndarray]]:
    """Each tensor of ``names`` per sample, from an ``ORT_DISABLE_ALL`` session that also outputs them."""
    present = {o.name for o in model.graph.output}
    model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in dict.fromkeys(names) if n not in present)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {i.name for i in session.get_inputs()}
    wanted = list(dict.fromkeys(names))
    found: dict[str, list[np.ndarray]] = {n: [] for n in wanted}
    for sample in samples:
        values = session.run(wanted, {k: v for k, v in sample.items() if k in feeds})
        for name, value in zip(wanted, values, strict=True):
            found[name].append(np.asarray(value, dtype=np.float64))
    return found


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine of two tensors flattened; 1.0 when both are zero, 0.0 when one alone is."""
    a, b = a.ravel(), b.ravel()
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    if norms == 0.0:
        return 1.0 if not a.any() and not b.any() else 0.0
    return float(np.dot(a, b) / norms)
