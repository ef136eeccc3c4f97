"""cpu-ort: a generic CPU running ONNX Runtime's CPU execution provider.

Its op table is not a list someone typed: it is the CPU provider's kernel registry in the installed
onnxruntime, so legality always matches the runtime that validates and runs the output.
"""

from __future__ import annotations

from functools import cache

import onnx_ir as ir

from flexdsa_core.targets.base import BucketModel, PlatformAdapter
from flexdsa_core.targets.spec import TargetSpec, op_key


@cache
def _ort_cpu_ops() -> frozenset[str]:
    from onnxruntime.capi import _pybind_state

    return frozenset(
        op_key(kernel.op_name, kernel.domain)
        for kernel in _pybind_state.get_all_opkernel_def()
        if kernel.provider == "CPUExecutionProvider"
    )


# Normalisations whose residual Add ONNX Runtime's own optimizer fuses at load time (ORT_ENABLE_EXTENDED+).
_SKIP_FUSED_NORMS = {"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization"}


def _same_shape(a: ir.Value, b: ir.Value) -> bool:
    return (
        a.shape is not None
        and b.shape is not None
        and len(a.shape) == len(b.shape)
        and all(x == y for x, y in zip(a.shape, b.shape, strict=True))
    )


def pin_unfused_residuals(model: ir.Model) -> int:
    """Residual ``Add`` -> ``Sum`` in front of a normalisation the Fusion Switcher left unfused.

    The switcher refuses SkipLayerNormalization where ORT's CPU kernel measures slower than Add +
    LayerNormalization (4-6x at [1,128,768] with ORT 1.31), but ORT's own optimizer would fuse the pair
    again when the package is loaded at ORT_ENABLE_ALL. A two-input ``Sum`` computes exactly the same
    element-wise sum at the same speed and is not what that fusion matches, so the decision holds at run
    time. Only same-shape inputs are rewritten (Sum and Add broadcast alike, but we keep it obvious).
    """
    pinned = 0
    for node in list(model.graph):
        if node.op_type not in _SKIP_FUSED_NORMS or node.domain not in ("", "ai.onnx") or not node.inputs:
            continue
        producer = node.inputs[0].producer() if node.inputs[0] is not None else None
        if producer is None or producer.op_type != "Add" or producer.domain not in ("", "ai.onnx"):
            continue
        a, b = producer.inputs
        if not _same_shape(a, b):
            continue
        total = ir.node("Sum", [a, b], name=f"{producer.name}_pinned" if producer.name else None)
        total.outputs[0].shape, total.outputs[0].type = producer.outputs[0].shape, producer.outputs[0].type
        model.graph.insert_before(producer, total)
        producer.outputs[0].replace_all_uses_with(total.outputs[0], replace_graph_outputs=True)
        name = producer.outputs[0].name
        model.graph.remove(producer, safe=True)
        total.outputs[0].name = name
        pinned += 1
    return pinned


class CpuOrtAdapter(PlatformAdapter):
    vendor = "generic"

    def legalize(self, model: ir.Model, target: TargetSpec, notes: list[str]) -> ir.Model:
        pinned = pin_unfused_residuals(model)
        if pinned:
            notes.append(
                f"{pinned} residual Add(s) before a normalisation written as Sum, so that ONNX Runtime's load-time "
                "SkipLayerNormalization fusion, which the Fusion Switcher measured as slower here, does not undo "
                "its decision"
            )
        return model

    def supported_op_keys(self, target: TargetSpec) -> frozenset[str]:
        if target.supported_ops == ["*"]:
            return _ort_cpu_ops()
        return frozenset(target.supported_ops)

    def manifest(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> dict:
        manifest = super().manifest(buckets, target, report)
        # The graph is already optimised offline; ORT's own basic passes remain cheap and safe at load time.
        manifest["session_options"] = {
            "graph_optimization_level": "ORT_ENABLE_ALL",
            "providers": ["CPUExecutionProvider"],
        }
        return manifest


ADAPTER = CpuOrtAdapter()
