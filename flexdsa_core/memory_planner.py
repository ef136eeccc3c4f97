"""Static memory planning: one arena for the intermediate tensors, offsets from their lifetimes.

Over the graph in topological order, tensor ``t`` is live over the steps ``[first(t), last(t)]``: from its
producer to its last consumer (a node with a subgraph counts as using every outer value its subgraph
reads). Two tensors may share bytes only when their lifetimes are disjoint.

What the arena holds: the outputs of the main graph's nodes. Not in it, and reported apart:
- graph inputs and graph outputs (``io_bytes``): the caller binds those buffers;
- initializers and ``Constant`` outputs (``weight_bytes``): read-only, they live in the weights region;
- tensors inside subgraphs (If/Loop/Scan bodies): the control-flow op allocates those per iteration;
- tensors whose size cannot be computed (``unknown_size``): dynamic at run time, allocated apart.

The plan, in three steps:
1. In place: the output of an element-wise unary/binary op (``ELEMENTWISE_OPS``) takes the buffer of an
   input whose last use is that node and whose dtype and size match. The two become one buffer, live
   from the input's producer to the output's last use. ``in_place`` counts these reuses.
2. Buffers are placed greedily, largest first (ties: earliest first), each at the smallest gap that fits
   between the already-placed buffers whose lifetimes overlap its own, else on top of them (best-fit by
   size; sizes rounded up to ``ALIGNMENT`` bytes so every offset is aligned).
3. Bounds: ``peak_live_bytes = max over steps of the sum of the buffers live at that step``, a lower
   bound for any arena of these buffers; ``naive_bytes`` = the sum of every planned tensor (aligned), what
   one buffer per tensor costs. Always ``peak_live_bytes <= arena_bytes <= naive_bytes``: a buffer placed
   on top of the overlapping ones ends at most at the sum of their sizes plus its own.

Symbolic dims take their size from ``dims`` (the shape plan's values); a dim not given is assumed as the
shape plan assumes it (``shape_plan.open_dim_value``: batch-like names 1, others 128) and listed in
``assumed_dims``. Dims ONNX could not relate to the inputs (``unk__<n>``) are never assumed.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import onnx_ir as ir

from flexdsa_core.errors import InvalidModelError
from flexdsa_core.shape_plan import REPRESENTATIVE_BATCH, REPRESENTATIVE_DIM, open_dim_value

__all__ = ["ALIGNMENT", "ELEMENTWISE_OPS", "MemoryPlan", "TensorAssignment", "plan_memory"]

ALIGNMENT = 64

# Ops whose output element i depends only on input element i (after broadcasting), so the output may
# overwrite an input of the same size that dies there.
ELEMENTWISE_OPS = frozenset(
    {
        # unary
        "Abs", "Acos", "Acosh", "Asin", "Asinh", "Atan", "Atanh", "Ceil", "Celu", "Clip", "Cos", "Cosh",
        "Elu", "Erf", "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN",
        "LeakyRelu", "Log", "Mish", "Neg", "Not", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign",
        "Sin", "Sinh", "Softplus", "Softsign", "Sqrt", "Tan", "Tanh", "ThresholdedRelu",
        # binary
        "Add", "And", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "Div", "Max", "Min", "Mod",
        "Mul", "Or", "Pow", "PRelu", "Sub", "Sum", "Xor",
    }
)  # fmt: skip
_ONNX_FRESH_DIM = re.compile(r"^unk__\d+$")


def _align(size: int) -> int:
    return -(-size // ALIGNMENT) * ALIGNMENT


@dataclass
class TensorAssignment:
    """Where one tensor sits in the arena and when it is live (steps of the topological order)."""

    name: str
    offset: int
    size: int  # bytes, before alignment
    start: int
    end: int
    op_type: str
    in_place_of: str | None = None

    @property
    def aligned_size(self) -> int:
        return _align(self.size)

    def as_dict(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "size": self.size,
            "start": self.start,
            "end": self.end,
            "op_type": self.op_type,
            "in_place_of": self.in_place_of,
        }


@dataclass
class MemoryPlan:
    arena_bytes: int
    naive_bytes: int
    peak_live_bytes: int
    in_place: int
    assignments: dict[str, TensorAssignment]
    unknown_size: list[dict[str, str]]
    dims: dict[str, int]
    assumed_dims: list[str]
    io_bytes: int
    weight_bytes: int
    steps: int
    peak_step: int | None
    alignment: int = ALIGNMENT
    notes: list[str] = field(default_factory=list)

    @property
    def saving(self) -> float:
        """Fraction of the naive footprint the arena saves."""
        return 1 - self.arena_bytes / self.naive_bytes if self.naive_bytes else 0.0

    def violations(self) -> list[str]:
        """Broken invariants, as sentences (empty when the plan is sound).

        Two tensors live at the same step never share a byte, except an in-place output and the input it
        overwrites; offsets are aligned; the arena holds every tensor and respects both bounds.
        """
        problems = []
        tensors = list(self.assignments.values())
        for a in tensors:
            if a.offset % self.alignment:
                problems.append(f"{a.name!r} at offset {a.offset} is not {self.alignment}-byte aligned")
            if a.offset + a.size > self.arena_bytes:
                problems.append(
                    f"{a.name!r} ends at {a.offset + a.size}, past the arena ({self.arena_bytes})"
                )
        # Two lifetimes overlap exactly when the earlier-born tensor is still live at the later one's birth,
        # so each tensor is compared with what is live when it is born: O(tensors x live), not all pairs.
        live: list[TensorAssignment] = []
        for b in sorted(tensors, key=lambda t: t.start):
            live = [a for a in live if a.end >= b.start]
            for a in live:
                share_bytes = a.offset < b.offset + b.aligned_size and b.offset < a.offset + a.aligned_size
                in_place_pair = a.in_place_of == b.name or b.in_place_of == a.name
                if share_bytes and not in_place_pair:
                    problems.append(
                        f"{a.name!r} [{a.start},{a.end}] and {b.name!r} [{b.start},{b.end}] are live together "
                        f"and overlap in the arena ({a.offset}+{a.size} vs {b.offset}+{b.size})"
                    )
            live.append(b)
        if self.arena_bytes < self.peak_live_bytes:
            problems.append(
                f"arena {self.arena_bytes} is below the peak-live lower bound {self.peak_live_bytes}"
            )
        if self.arena_bytes > self.naive_bytes:
            problems.append(f"arena {self.arena_bytes} exceeds the naive sum {self.naive_bytes}")
        return problems

    def as_dict(self, *, with_assignments: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {
            "arena_bytes": self.arena_bytes,
            "naive_bytes": self.naive_bytes,
            "peak_live_bytes": self.peak_live_bytes,
            "saving": round(self.saving, 4),
            "in_place": self.in_place,
            "planned_tensors": len(self.assignments),
            "unknown_size": self.unknown_size,
            "io_bytes": self.io_bytes,
            "weight_bytes": self.weight_bytes,
            "steps": self.steps,
            "peak_step": self.peak_step,
            "alignment": self.alignment,
            "dims": self.dims,
            "assumed_dims": self.assumed_dims,
            "notes": self.notes,
        }
        if with_assignments:
            out["assignments"] = {name: a.as_dict() for name, a in self.assignments.items()}
        return out


def plan_memory(model: ir.Model, *, dims: Mapping[str, int] | None = None) -> MemoryPlan:
    """Plan a static arena for the intermediate tensors of ``model``'s main graph (see module docstring)."""
    graph = model.graph
    order, owner = _topological_order(graph)
    step_of = {id(node): i for i, node in enumerate(order)}
    for nested, top in owner.items():
        step_of[nested] = step_of[id(top)]
    sizer = _Sizer(dims or {})

    tensors: dict[str, TensorAssignment] = {}
    values: dict[str, ir.Value] = {}
    unknown_size: list[dict[str, str]] = []
    io_bytes = 0
    weight_bytes = 0
    graph_outputs = {id(v) for v in graph.outputs}
    for value in graph.inputs:
        io_bytes += sizer.size(value) or 0
    for value in graph.initializers.values():
        if not value.is_graph_input():
            weight_bytes += sizer.size(value) or 0

    for step, node in enumerate(order):
        for value in node.outputs:
            if not value.name:  # an optional output the node does not produce
                continue
            if id(value) in graph_outputs:
                io_bytes += sizer.size(value) or 0
                continue
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                weight_bytes += sizer.size(value) or 0
                continue
            size = sizer.size(value)
            if size is None:
                unknown_size.append(
                    {"tensor": value.name, "op_type": node.op_type, "reason": sizer.why_unknown(value)}
                )
                continue
            # A node that never feeds anything still writes its output: live for its own step. A use by
            # a node no longer in the graph (removed without detaching its inputs) does not count.
            uses = (step_of.get(id(use.node)) for use in value.uses())
            last = max((s for s in uses if s is not None), default=step)
            tensors[value.name] = TensorAssignment(value.name, 0, size, step, max(last, step), node.op_type)
            values[value.name] = value

    buffers, in_place = _merge_in_place(order, tensors, values)
    arena = _place(buffers)
    peak, peak_step = _peak_live(buffers, len(order))
    naive = sum(t.aligned_size for t in tensors.values())
    notes = [
        "Graph inputs/outputs are caller-bound and weights live apart: neither is in the arena.",
        "Sizes of symbolic dims come from 'dims'; those listed in 'assumed_dims' were assumed "
        f"(batch-like {REPRESENTATIVE_BATCH}, others {REPRESENTATIVE_DIM}).",
    ]
    if owner:
        notes.append("Tensors inside subgraphs are allocated by their control-flow op, not planned here.")
    return MemoryPlan(
        arena_bytes=arena,
        naive_bytes=naive,
        peak_live_bytes=peak,
        in_place=in_place,
        assignments=tensors,
        unknown_size=unknown_size,
        dims=dict(sorted(sizer.used.items())),
        assumed_dims=sorted(sizer.assumed),
        io_bytes=io_bytes,
        weight_bytes=weight_bytes,
        steps=len(order),
        peak_step=peak_step,
        notes=notes,
    )


class _Sizer:
    """Bytes of a tensor, binding symbolic dims from ``dims`` (or assuming them, and remembering which)."""

    def __init__(self, dims: Mapping[str, int]) -> None:
        self.dims = dict(dims)
        self.used: dict[str, int] = {}
        self.assumed: set[str] = set()

    def _dim(self, dim: int | ir.SymbolicDim) -> int | None:
        if isinstance(dim, int):
            return dim
        name = dim.value
        if name is None:
            return None
        if name in self.dims:
            self.used[name] = self.dims[name]
            return self.dims[name]
        if _ONNX_FRESH_DIM.match(name):
            return None
        if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            value = open_dim_value(name)
            self.used[name] = value
            self.assumed.add(name)
            return value
        # An expression (``seq + 1``): bind its symbols, then evaluate.
        try:
            symbols = dim.free_symbols()
            bindings = {s: self._dim(ir.SymbolicDim(s)) for s in symbols}
            if any(v is None for v in bindings.values()):
                return None
            result = dim.evaluate(bindings)
        except Exception:  # an expression sympy cannot read is an unknown size
            return None
        return result if isinstance(result, int) else None

    def size(self, value: ir.Value) -> int | None:
        if value.shape is None or value.dtype is None or value.dtype == ir.DataType.STRING:
            return None
        sizes = [self._dim(d) for d in value.shape.dims]
        if any(s is None for s in sizes):
            return None
        return math.ceil(math.prod(sizes) * value.dtype.itemsize)

    def why_unknown(self, value: ir.Value) -> str:
        if value.shape is None:
            return "shape unknown"
        if value.dtype is None:
            return "dtype unknown"
        if value.dtype == ir.DataType.STRING:
            return "string tensors have no fixed size"
        unknown = [str(d) for d in value.shape.dims if not isinstance(d, int) and self._dim(d) is None]
        return f"dims {unknown} cannot be sized (data-dependent or unnamed)"


def _topological_order(graph: ir.Graph) -> tuple[list[ir.Node], dict[int, ir.Node]]:
    """The graph's nodes in a topological order, and for every node inside a subgraph the main-graph node
    that holds it. The order is onnx_ir's stable sort, done in place: a graph already in order (as every
    stage leaves it) is unchanged."""
    try:
        graph.sort()
    except ValueError:
        raise InvalidModelError("The graph has a cycle; a memory plan needs a topological order.") from None
    nodes = list(graph)
    owner: dict[int, ir.Node] = {}  # id(nested node) -> the main-graph node holding it
    for node in nodes:
        for attr in node.attributes.values():
            for subgraph in _subgraphs(attr):
                for inner in ir.traversal.RecursiveGraphIterator(subgraph):
                    owner[id(inner)] = node
    return nodes, owner


def _subgraphs(attr: ir.Attr) -> list[ir.Graph]:
    if attr.type == ir.AttributeType.GRAPH:
        return [attr.as_graph()]
    if attr.type == ir.AttributeType.GRAPHS:
        return list(attr.as_graphs())
    return []


@dataclass
class _Buffer:
    tensors: list[TensorAssignment]
    start: int
    end: int
    size: int  # aligned bytes
    offset: int = 0


def _merge_in_place(
    order: list[ir.Node], tensors: dict[str, TensorAssignment], values: dict[str, ir.Value]
) -> tuple[list[_Buffer], int]:
    """One buffer per tensor, except an element-wise output that takes over an input dying at its node."""
    buffer_of: dict[str, _Buffer] = {}
    in_place = 0
    donated: set[str] = set()
    for step, node in enumerate(order):
        for value in node.outputs:
            if value.name in tensors:
                assignment = tensors[value.name]
                buffer_of[value.name] = _Buffer(
                    [assignment], assignment.start, assignment.end, assignment.aligned_size
                )
        if node.op_type not in ELEMENTWISE_OPS or node.domain not in ("", "ai.onnx") or not node.outputs:
            continue
        output = node.outputs[0]
        if output.name not in tensors:
            continue
        for candidate in node.inputs:
            if candidate is None or candidate.name not in tensors or candidate.name in donated:
                continue
            donor = tensors[candidate.name]
            if (
                donor.end != step
                or donor.size != tensors[output.name].size
                or candidate.dtype != output.dtype
            ):
                continue
            merged = buffer_of[candidate.name]
            own = buffer_of[output.name]
            merged.tensors.extend(own.tensors)
            merged.end = max(merged.end, own.end)
            for t in own.tensors:
                buffer_of[t.name] = merged
            tensors[output.name].in_place_of = candidate.name
            donated.add(candidate.name)
            in_place += 1
            break
    unique: dict[int, _Buffer] = {id(b): b for b in buffer_of.values()}
    return list(unique.values()), in_place


def _place(buffers: list[_Buffer]) -> int:
    """Greedy best-fit by size: largest first, into the smallest gap among lifetime-overlapping buffers."""
    placed: list[_Buffer] = []
    arena = 0
    for buffer in sorted(buffers, key=lambda b: (-b.size, b.start, b.end)):
        overlapping = sorted(
            (p for p in placed if p.start <= buffer.end and buffer.start <= p.end), key=lambda p: p.offset
        )
        best_offset, best_gap = None, None
        top = 0
        for other in overlapping:
            gap = other.offset - top
            if gap >= buffer.size and (best_gap is None or gap < best_gap):
                best_offset, best_gap = top, gap
            top = max(top, other.offset + other.size)
        buffer.offset = best_offset if best_offset is not None else top
        for tensor in buffer.tensors:
            tensor.offset = buffer.offset
        placed.append(buffer)
        arena = max(arena, buffer.offset + buffer.size)
    return arena


def _peak_live(buffers: list[_Buffer], steps: int) -> tuple[int, int | None]:
    """Max over steps of the bytes of buffers live at that step (difference array over the steps)."""
    if not buffers:
        return 0, None
    delta = [0] * (steps + 1)
    for buffer in buffers:
        delta[buffer.start] += buffer.size
        delta[buffer.end + 1] -= buffer.size
    live, peak, peak_step = 0, 0, 0
    for step in range(steps):
        live += delta[step]
        if live > peak:
            peak, peak_step = live, step
    return peak, peak_step
