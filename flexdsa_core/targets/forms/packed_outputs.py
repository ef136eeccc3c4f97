"""An output that packs unlike quantities (a detector's boxes in input pixels beside its scores in 0..1, as one
``[cells, 5]`` tensor) keeps its packing float16: the ``Concat`` that packs them and the shape-only ops between it
and the graph output. Nothing is rewritten; each packed quantity is still computed (and quantised) apart.

Why: a vendor's w8a8 gives a tensor one per-tensor int8 scale, so the pack's scale spans its largest quantity. In
MTCNN's P-Net exported with its decode (``bench/trained_build.py``), the boxes reach 172 pixels and the score
stays within 1: at the pack's scale (about 0.68 a step) a score has two levels, and rknn-toolkit2's w8a8 build
judges the scores at cosine 0.80 on held-out photos while the boxes stay at 0.99999. The toolkit's per-layer
analysis cannot see it (the pack's cosine is the boxes'), so the sites are found from the ranges measured on the
calibration samples (``find``): a ``Concat`` reaching a graph output through shape-only ops whose inputs' peaks
(largest magnitude over the samples) differ by at least ``FACTOR``.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from flexdsa_core.targets.forms import Applied, FloatPathForm, observe

FACTOR = 8.0
MEASURED_SAMPLES = 64
# Ops that move or relabel data without computing on it, between a pack and the graph output.
SHAPE_ONLY = frozenset({"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


def packs(model: ir.Model) -> list[tuple[ir.Node, list[ir.Node]]]:
    """Each ``Concat`` (of at least two inputs) that reaches a graph output through shape-only ops alone, with
    those ops (in order from it); each once."""
    found: dict[int, tuple[ir.Node, list[ir.Node]]] = {}
    for output in model.graph.outputs:
        chain: list[ir.Node] = []
        node = output.producer()
        while node is not None and node.op_type in SHAPE_ONLY and node.domain in ("", "ai.onnx"):
            chain.append(node)
            node = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
        if node is not None and node.op_type == "Concat" and node.domain in ("", "ai.onnx"):
            computed = [v for v in node.inputs if v is not None and v.const_value is None]
            if len(computed) >= 2:
                found.setdefault(id(node), (node, chain[::-1]))
    return list(found.values())


def find(model: ir.Model, samples: list[dict]) -> Applied:
    """The packs whose inputs' peaks on ``samples`` differ by ``FACTOR`` or more, kept float16 with their
    shape-only ops to the output."""
    applied = Applied()
    found = packs(model)
    if not found:
        applied.measured["detail"] = "no graph output packed by a Concat (through shape-only ops)"
        return applied
    names = list(dict.fromkeys(v.name for node, _ in found for v in node.inputs if v is not None and v.const_value is None))
    observed = observe(model, names, samples[:MEASURED_SAMPLES])
    peak = {name: max(float(np.abs(run[name]).max(initial=0.0)) for run in observed) for name in names}
    for node, chain in found:
        peaks = [peak[v.name] for v in node.inputs if v is not None and v.const_value is None]
        ratio = max(peaks) / max(min(peaks), np.finfo(np.float32).tiny)
        applied.measured[node.name] = {"input_peaks": [round(p, 4) for p in peaks], "ratio": round(ratio, 1)}
        if ratio < FACTOR:
            reason = f"its packed quantities' peaks are within {FACTOR:g}x of each other"
            applied.refused[reason] = applied.refused.get(reason, 0) + 1
            continue
        applied.sites[node.name] = (
            f"packs quantities {ratio:.0f}x apart in peak (from {min(peaks):.3g} to {max(peaks):.3g}): the pack and "
            f"{len(chain)} shape-only op(s) to the output stay float16"
        )
        applied.float16 += [node.name, *(n.name for n in chain)]
    return applied


FORM = FloatPathForm(
    name="packed_output_float16",
    summary="an output packing quantities of unlike range keeps its packing float16",
    find=find,
)
