"""What one bucket is expected to cost on an accelerator, from the Subgraph Mapper's kernels: always an
estimate, labelled so, and incomplete wherever the spec leaves a figure it needs unsourced.

    latency  = sum(kernel seconds on the accelerator) + transfers + CPU-fallback time
    transfer = bytes crossing partition boundaries / memory bandwidth (both ways go through DRAM)
    fallback = sum over the CPU nodes of max(FLOPs / cpu_peak_ops_per_s, bytes / memory bandwidth)
    energy   = power_w * latency                     (None without a sourced power figure)
    memory   = weights + the planned activation arena
    roofline = max(sum(kernel FLOPs / peak), sum(kernel DRAM bytes) / bandwidth)
               the same FLOPs and bytes as the kernels, without launches or fallback: a lower bound

The CPU-fallback time needs the CPU's own peak (``TargetSpec.cpu_peak_ops_per_s``), which no built-in spec
sources today: there the latency leaves those nodes out. Whatever a term leaves out (fallback nodes, kernels
without a sourced peak or bandwidth, transfers without a bandwidth) is named in ``left_out``, and
``complete`` is False: the latency (and the energy from it) is then a lower bound, and every surface shows it
as one (``flexdsa_core.figures``).
"""

from __future__ import annotations

import onnx_ir as ir

from flexdsa_core.cost import Cost
from flexdsa_core.targets.spec import ACCELERATOR, TargetSpec


def target_estimate(target: TargetSpec, mapping, graph_cost: Cost, memory: dict) -> dict:
    notes = list(mapping.notes)
    left_out: list[str] = []
    kernel_seconds = [g.seconds for g in mapping.groups]
    accelerator_s = sum(s for s in kernel_seconds if s is not None) if kernel_seconds else 0.0
    untimed = sum(1 for s in kernel_seconds if s is None)
    if untimed:
        left_out.append(f"{untimed} accelerator kernel{'s' if untimed != 1 else ''} (no sourced peak or bandwidth)")
    crossing = _crossing_bytes(mapping)
    bandwidth = target.mem_bandwidth_bytes_per_s
    transfer_s = crossing / bandwidth if bandwidth and crossing else (0.0 if not crossing else None)
    fallback_nodes = len(mapping.fallback)
    fallback_s = _fallback_seconds(target, mapping)
    _say_fallback(target, fallback_nodes, fallback_s, left_out, notes)
    if transfer_s is None:
        left_out.append(f"transfers to and from the CPU ({crossing / 1e3:.0f} KB, bandwidth unsourced)")
    latency_s = accelerator_s + (transfer_s or 0.0) + (fallback_s or 0.0)
    peak = _peak(target)
    compute_bound = sum(g.compute_s for g in mapping.groups) if peak else None
    kernel_bytes = sum(g.dram_bytes for g in mapping.groups)
    memory_bound = kernel_bytes / bandwidth if bandwidth else None
    bounds = [b for b in (compute_bound, memory_bound) if b is not None]
    weights = memory.get("weight_bytes")
    return {
        "label": f"estimate from the {target.name} spec (roofline per kernel), not a measurement",
        "complete": not left_out,
        "left_out": left_out,
        "partial": bool(left_out),  # the older name of "not complete", kept for readers of older reports
        "latency_s": latency_s,
        "accelerator_s": accelerator_s,
        "transfer_s": transfer_s,
        "transfer_bytes": crossing,
        "fallback_s": fallback_s if fallback_nodes else 0.0,
        "fallback_nodes": fallback_nodes,
        "energy_j": target.power_w * latency_s if target.power_w is not None else None,
        "peak_memory_bytes": (memory.get("arena_bytes") or 0) + (weights or 0),
        "accelerator_flop_share": mapping.as_dict()["accelerator_flop_share"],
        "flops": graph_cost.flops,
        "bytes_unfused": graph_cost.bytes,
        "kernel_dram_bytes": kernel_bytes,
        "roofline_bound_s": max(bounds) if bounds else None,
        "roofline_basis": {
            "compute_s": compute_bound,
            "memory_s": memory_bound,
            "peak_ops_per_s": peak,
            "bandwidth_bytes_per_s": bandwidth,
            "label": "lower bound: the kernels' FLOPs at peak or their DRAM bytes at full bandwidth",
        },
        "kernels": len(mapping.groups),
        "devices": sorted({p.device for p in mapping.partitions}) or [ACCELERATOR],
        "notes": notes,
    }


def _say_fallback(target: TargetSpec, nodes: int, seconds: float | None, left_out: list, notes: list) -> None:
    """What the fallback term leaves out (``left_out``) and rests on (``notes``)."""
    if not nodes:
        return
    if seconds is None:
        left_out.append(f"{nodes} CPU-fallback node{'s' if nodes != 1 else ''}")
        notes.append(
            f"{nodes} node(s) on the CPU: the CPU beside {target.name} has no sourced throughput, so their time "
            "is not in the latency"
        )
        return
    notes.append(f"{nodes} node(s) on the CPU, estimated at its sourced peak ({target.cpu_peak_ops_per_s / 1e9:g} GFLOP/s)")
    if not target.mem_bandwidth_bytes_per_s:
        left_out.append("the CPU-fallback nodes' memory traffic (bandwidth unsourced)")


def _fallback_seconds(target: TargetSpec, mapping) -> float | None:
    """The CPU nodes' time at the CPU's sourced peak (and the memory bandwidth, where sourced), node by node;
    None when nodes fall back and the CPU's peak is unsourced."""
    if not mapping.fallback:
        return 0.0
    peak = target.cpu_peak_ops_per_s
    if peak is None:
        return None
    bandwidth = target.mem_bandwidth_bytes_per_s
    return sum(max(flops / peak, bytes_ / bandwidth if bandwidth else 0.0) for flops, bytes_ in mapping.cpu_work)


def _peak(target: TargetSpec) -> float | None:
    peaks = target.peak_ops_per_s
    return peaks.get("float32") or peaks.get("float16")


def _crossing_bytes(mapping) -> float:
    """Bytes of every value produced in one partition and read in another."""
    where = {}
    for index, part in enumerate(mapping.partitions):
        for node in part.nodes:
            where[id(node)] = index
    total = 0.0
    for index, part in enumerate(mapping.partitions):
        for node in part.nodes:
            for value in node.outputs:
                if any(where.get(id(c), index) != index for c, _ in value.uses()):
                    total += _nbytes(value)
    return total


def _nbytes(value: ir.Value) -> float:
    if value.shape is None or value.dtype is None or not value.shape.is_static():
        return 0.0
    count = 1
    for d in value.shape:
        count *= d
    return float(count * value.dtype.itemsize)
