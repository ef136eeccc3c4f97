"""The Subgraph Mapper: which nodes run on the accelerator, which on the CPU beside it, and how the
accelerator's share is cut into kernels that keep intermediates in on-chip SRAM.

1. **Placement.** Every node asks the target adapter for a ``fallback_reason`` (op table, static shapes,
   the spec's op constraints, vendor checks); a node with a reason runs on the CPU, with that reason.
   Data-movement nodes (Reshape, Unsqueeze, ...) that the accelerator runs but that sit alone between CPU
   nodes join the CPU: moving them saves two transitions and costs nothing.
2. **Partitions.** A topological order that keeps running on the current device while it can (Kahn's
   algorithm, preferring ready nodes of the last node's device) cuts the graph into runs; each run of one
   device is a partition. A contiguous run of a topological order is convex (any path between two of its
   nodes stays inside it), so every partition compiles as one subgraph, and the greedy preference gives
   few transitions (the count is reported).
3. **Kernels.** Inside an accelerator partition, consecutive nodes are grouped while the group is cheaper
   than its parts under the roofline cost model: an intermediate produced and consumed inside a group
   stays in SRAM and never travels to DRAM. A group is tiled along its outermost non-batch axis of
   activations; per tile count ``t`` (1, 2, 4, ... 64) the group must fit::

       weights + (inputs + outputs + intermediates) / t  <=  sram_bytes

   and costs ``max(flops / peak, dram_bytes / bandwidth) + t * launch_overhead``, where ``dram_bytes``
   counts the group's inputs, outputs and weights once. A group that fits at no ``t`` is not formed.
   With no sourced SRAM size, nothing is grouped (and the report says so).
4. **Kernel cache.** Each explored group's canonical form (ops, attributes, shapes and dtypes, wiring
   inside the group; never weight values) hashes to a kernel-cache key with the target (its name,
   version and whole-spec hash): N identical layers are explored once, the rest are cache hits (counted
   in the report).
"""

from __future__ import annotations

import heapq
import json
import math
from dataclasses import dataclass, field

import onnx_ir as ir

from flexdsa_core.cache import KernelCache, LRUCache, kernel_key
from flexdsa_core.cost_model import CostModel
from flexdsa_core.targets.accelerator import SHAPE_OPS, AcceleratorAdapter
from flexdsa_core.targets.spec import ACCELERATOR, CPU, TargetSpec, op_key

TILE_COUNTS = (1, 2, 4, 8, 16, 32, 64)
# A group closes at this many nodes: exploring stays linear in the model's size.
MAX_GROUP_NODES = 32
MAPPER_VERSION = "1"


@dataclass
class Partition:
    device: str
    nodes: list[ir.Node] = field(default_factory=list)


@dataclass
class Group:
    nodes: list[ir.Node]
    tiles: int
    seconds: float | None
    dram_bytes: float
    sram_bytes: float
    flops: float
    cached: bool
    compute_s: float = 0.0  # FLOPs over the dtype's peak: the compute side of the group's roofline


@dataclass
class Mapping:
    """What the mapper decided for one bucket's model."""

    placement: dict[str, str]
    fallback: list[dict]
    partitions: list[Partition]
    groups: list[Group]
    flops: dict[str, float]
    explored: int
    hits: int
    notes: list[str]
    split: list[dict] = field(default_factory=list)  # over a documented limit, split by the vendor compiler
    # (FLOPs, bytes) of each node on the CPU: what ``vendor_runs/estimate.py`` prices where the CPU has a sourced peak.
    cpu_work: list[tuple[float, float]] = field(default_factory=list)

    @property
    def transitions(self) -> int:
        return max(0, len(self.partitions) - 1)

    def as_dict(self) -> dict:
        total_flops = sum(self.flops.values())
        accelerator_nodes = sum(1 for d in self.placement.values() if d == ACCELERATOR)
        return {
            "nodes": len(self.placement),
            "accelerator_nodes": accelerator_nodes,
            "cpu_nodes": len(self.placement) - accelerator_nodes,
            "accelerator_flop_share": (self.flops[ACCELERATOR] / total_flops) if total_flops else None,
            "flops": self.flops,
            "transitions": self.transitions,
            "partitions": [
                {"device": p.device, "nodes": len(p.nodes), "first": p.nodes[0].name, "last": p.nodes[-1].name}
                for p in self.partitions
            ],
            "fallback": self.fallback,
            "split_by_vendor": self.split,
            "placement": self.placement,
            "kernels": {
                "groups": len(self.groups),
                "explored": self.explored,
                "cache_hits": self.hits,
                "multi_node_groups": sum(1 for g in self.groups if len(g.nodes) > 1),
                "tiled_groups": sum(1 for g in self.groups if g.tiles > 1),
                "largest": [_group_dict(g) for g in sorted(self.groups, key=lambda g: -g.flops)[:10]],
            },
            "notes": self.notes,
        }


def _group_dict(group: Group) -> dict:
    return {
        "nodes": [n.name for n in group.nodes],
        "tiles": group.tiles,
        "estimated_seconds": group.seconds,
        "dram_bytes": group.dram_bytes,
        "sram_bytes": group.sram_bytes,
        "flops": group.flops,
        "from_cache": group.cached,
    }


class SubgraphMapper:
    def __init__(
        self,
        target: TargetSpec,
        adapter: AcceleratorAdapter,
        cost_model: CostModel,
        cache: KernelCache | None = None,
    ) -> None:
        self.target = target
        self.adapter = adapter
        self.cost_model = cost_model
        self.cache = cache if cache is not None else LRUCache()
        self._node_costs: dict[int, object] = {}

    def _node_cost(self, node: ir.Node, opsets):
        cost = self._node_costs.get(id(node))
        if cost is None:
            cost = self._node_costs[id(node)] = self.cost_model.node_cost(node, opsets=opsets)
        return cost

    # ---- 1. placement -----------------------------------------------------------------------------
    def place(self, model: ir.Model) -> tuple[dict[str, str], dict[str, str]]:
        """Device per node name, and the reason of every CPU node."""
        device: dict[str, str] = {}
        reasons: dict[str, str] = {}
        for node in model.graph:
            reason = self.adapter.fallback_reason(node, self.target)
            device[node.name] = CPU if reason else ACCELERATOR
            if reason:
                reasons[node.name] = reason
        # Data movement alone between CPU nodes joins the CPU (two transitions saved, nothing lost).
        for node in model.graph:
            if device[node.name] != ACCELERATOR or node.op_type not in SHAPE_OPS:
                continue
            neighbours = [p for p in _producers(node)] + [c for c in _consumers(node)]
            if neighbours and all(device[n.name] == CPU for n in neighbours):
                device[node.name] = CPU
                reasons[node.name] = "data movement between CPU nodes: kept on the CPU to save two transitions"
        return device, reasons

    # ---- 2. partitions ----------------------------------------------------------------------------
    def partition(self, model: ir.Model, device: dict[str, str]) -> list[Partition]:
        nodes = list(model.graph)
        index = {id(n): i for i, n in enumerate(nodes)}
        pending = {id(n): len({id(p) for p in _producers(n)}) for n in nodes}
        ready: dict[str, list[tuple[int, int]]] = {ACCELERATOR: [], CPU: []}
        for n in nodes:
            if pending[id(n)] == 0:
                heapq.heappush(ready[device[n.name]], (index[id(n)], id(n)))
        by_id = {id(n): n for n in nodes}
        current = ACCELERATOR if ready[ACCELERATOR] else CPU
        partitions: list[Partition] = []
        while ready[ACCELERATOR] or ready[CPU]:
            if not ready[current]:
                current = CPU if current == ACCELERATOR else ACCELERATOR
            _, node_id = heapq.heappop(ready[current])
            node = by_id[node_id]
            if not partitions or partitions[-1].device != current:
                partitions.append(Partition(current))
            partitions[-1].nodes.append(node)
            for consumer in {id(c): c for c in _consumers(node)}.values():
                pending[id(consumer)] -= 1
                if pending[id(consumer)] == 0:
                    heapq.heappush(ready[device[consumer.name]], (index[id(consumer)], id(consumer)))
        return partitions

    # ---- 3-4. kernels -----------------------------------------------------------------------------
    def group(self, partition: Partition, opsets) -> tuple[list[Group], int, int]:
        """Greedy grouping of one accelerator partition; returns groups, kernels explored, cache hits."""
        groups: list[Group] = []
        explored = hits = 0
        current: list[ir.Node] = []
        current_group: Group | None = None
        for node in partition.nodes:
            if node.op_type == "Constant":
                continue
            single, e, h = self._explore([node], opsets)
            explored, hits = explored + e, hits + h
            if current_group is not None and self.target.sram_bytes and len(current) < MAX_GROUP_NODES:
                merged, e, h = self._explore([*current, node], opsets)
                explored, hits = explored + e, hits + h
                if merged is not None and _cheaper(merged, current_group, single):
                    current, current_group = [*current, node], merged
                    continue
            if current_group is not None:
                groups.append(current_group)
            current, current_group = [node], single
        if current_group is not None:
            groups.append(current_group)
        return groups, explored, hits

    def _explore(self, nodes: list[ir.Node], opsets) -> tuple[Group | None, int, int]:
        canonical = _canonical(nodes, opsets)
        key = kernel_key(
            {"mapper": MAPPER_VERSION, "group": canonical, "sram": self.target.sram_bytes},
            self.target,
            self.cost_model.compiler_version,
        )
        raw = self.cache.get(key)
        if raw is not None:
            entry = json.loads(raw)
            if entry is None:
                return None, 0, 1
            return Group(nodes, entry["tiles"], entry["seconds"], entry["dram_bytes"], entry["sram_bytes"],
                         entry["flops"], True, entry["compute_s"]), 0, 1  # fmt: skip
        group = self._tile(nodes, opsets)
        entry = None if group is None else {
            "tiles": group.tiles, "seconds": group.seconds, "dram_bytes": group.dram_bytes,
            "sram_bytes": group.sram_bytes, "flops": group.flops, "compute_s": group.compute_s,
        }  # fmt: skip
        self.cache.put(key, json.dumps(entry).encode())
        return group, 1, 0

    def _tile(self, nodes: list[ir.Node], opsets) -> Group | None:
        inside = {id(n) for n in nodes}
        flops = weights = external = intermediate = compute_s = 0.0
        for node in nodes:
            cost = self._node_cost(node, opsets)
            flops += cost.flops
            peak = self.cost_model.peak(_node_dtype(node))
            compute_s += cost.flops / peak if peak else 0.0
            for value in node.inputs:
                if value is None:
                    continue
                producer = value.producer()
                if value.const_value is not None or (producer is not None and producer.op_type == "Constant"):
                    weights += _nbytes(value)
                elif producer is None or id(producer) not in inside:
                    external += _nbytes(value)
            for value in node.outputs:
                if value.is_graph_output() or any(id(c) not in inside for c, _ in value.uses()):
                    external += _nbytes(value)
                else:
                    intermediate += _nbytes(value)
        sram = self.target.sram_bytes
        dram = external + weights
        # Only the launch overhead grows with the tile count: the fewest tiles that fit is the cheapest.
        for tiles in TILE_COUNTS:
            need = weights + (external + intermediate) / tiles
            if sram is None or need <= sram:
                return Group(nodes, tiles, self._seconds(compute_s, dram, tiles), dram, need, flops, False, compute_s)
        if len(nodes) > 1:
            return None  # does not fit at any tile count: not a group
        # One node too big for SRAM at any tiling still runs, streaming from DRAM.
        tiles = TILE_COUNTS[-1]
        need = weights + (external + intermediate) / tiles
        return Group(nodes, tiles, self._seconds(compute_s, dram, tiles), dram, need, flops, False, compute_s)

    def _seconds(self, compute_s: float | None, dram_bytes: float, tiles: int) -> float | None:
        bandwidth = self.target.mem_bandwidth_bytes_per_s
        memory_s = dram_bytes / bandwidth if bandwidth else None
        parts = [s for s in (compute_s, memory_s) if s is not None]
        if not parts:
            return None
        return max(parts) + tiles * self.target.launch_overhead_s

    # ---- the whole mapping ------------------------------------------------------------------------
    def map(self, model: ir.Model) -> Mapping:
        device, reasons = self.place(model)
        partitions = self.partition(model, device)
        opsets = model.opset_imports
        groups: list[Group] = []
        explored = hits = 0
        flops = {ACCELERATOR: 0.0, CPU: 0.0}
        cpu_work: list[tuple[float, float]] = []
        for part in partitions:
            if part.device == ACCELERATOR:
                found, e, h = self.group(part, opsets)
                groups += found
                explored, hits = explored + e, hits + h
            for node in part.nodes:
                cost = self._node_cost(node, opsets)
                flops[part.device] += cost.flops
                if part.device == CPU:
                    cpu_work.append((cost.flops, cost.bytes))
        fallback = [
            {"node": n.name, "op": op_key(n.op_type, n.domain), "reason": reasons[n.name]}
            for n in model.graph
            if device[n.name] == CPU
        ]
        split = [
            {"node": n.name, "op": op_key(n.op_type, n.domain), "note": note}
            for n in model.graph
            if device[n.name] == ACCELERATOR and (note := self.adapter.split_note(n, self.target))
        ]
        notes = []
        if self.target.sram_bytes is None:
            notes.append(
                f"{self.target.name}: on-chip SRAM size unsourced; layers were not grouped for on-chip reuse"
            )
        notes += self.adapter.partition_notes(model, self.target)
        return Mapping(device, fallback, partitions, groups, flops, explored, hits, notes, split, cpu_work)


def _cheaper(merged: Group, left: Group, right: Group | None) -> bool:
    if right is None or merged.seconds is None or left.seconds is None or right.seconds is None:
        return False
    return merged.seconds < left.seconds + right.seconds


def _node_dtype(node: ir.Node) -> str:
    """The dtype whose peak bounds the node: its first float input, else 8-bit integers as 'int8'."""
    values = [v for v in (*node.inputs, *node.outputs) if v is not None and v.dtype is not None]
    for value in values:
        if value.dtype.is_floating_point():
            return value.dtype.numpy().name
    for value in values:
        if value.dtype in (ir.DataType.INT8, ir.DataType.UINT8):
            return "int8"
    return values[0].dtype.numpy().name if values else "float32"


def _producers(node: ir.Node) -> list[ir.Node]:
    found = []
    for value in node.inputs:
        if value is not None and value.producer() is not None:
            found.append(value.producer())
    return found


def _consumers(node: ir.Node) -> list[ir.Node]:
    return [consumer for value in node.outputs for consumer, _ in value.uses()]


def _nbytes(value: ir.Value) -> float:
    if value.shape is None or value.dtype is None or not value.shape.is_static():
        return 0.0
    return float(math.prod(value.shape) * value.dtype.itemsize)


def _canonical(nodes: list[ir.Node], opsets) -> list:
    """Ops, attributes, shapes, dtypes and wiring of a group; names and weight values left out."""
    position = {id(n): i for i, n in enumerate(nodes)}
    out = []
    for node in nodes:
        inputs = []
        for value in node.inputs:
            if value is None:
                inputs.append(None)
                continue
            producer = value.producer()
            source = (
                [position[id(producer)], list(producer.outputs).index(value)]
                if producer is not None and id(producer) in position
                else ("const" if value.const_value is not None else "ext")
            )
            inputs.append([source, _shape(value), _dtype(value)])
        out.append(
            {
                "op": op_key(node.op_type, node.domain),
                "opset": opsets.get(node.domain, None),
                "attrs": {k: str(a.value) for k, a in sorted(node.attributes.items())},
                "in": inputs,
                "out": [[_shape(v), _dtype(v)] for v in node.outputs],
            }
        )
    return out


def _shape(value: ir.Value):
    return None if value.shape is None else [d if isinstance(d, int) else str(d) for d in value.shape]


def _dtype(value: ir.Value):
    return None if value.dtype is None else value.dtype.name
