"""cpu-ort: a generic CPU running ONNX Runtime's CPU execution provider.

Its op table is not a list someone typed: it is the CPU provider's kernel registry in the installed
onnxruntime, so legality always matches the runtime that validates and runs the output.
"""

from __future__ import annotations

from functools import cache

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


class CpuOrtAdapter(PlatformAdapter):
    vendor = "generic"

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
