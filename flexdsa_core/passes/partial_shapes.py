"""``partial_shape_folding``: shape arithmetic over the static dims of a tensor folds while others stay symbolic.

onnxscript 0.7.2's constant folder (``shape_folding``) folds a ``Shape`` whose slice is all static, a
``Gather`` with 1-D indices into a shape, and propagates symbolic shapes through ``Concat``/``Reshape``/
``Squeeze``/``Add``; it leaves scalar-index ``Gather`` (the exporters' ``Gather(Shape(x), 0)``), ``Slice``,
``Unsqueeze``, ``Mul``/``Div`` of dims, and any shape that stays partly symbolic. This pass does those.

Each small integer tensor computed from ``Shape`` is tracked as a list of dims, each an int or a
polynomial with integer coefficients over the model's symbolic dim names (``batch``, ``16*batch``), by one
short evaluator per op (``@_evaluates("Gather")``). Then:

* a tracked tensor whose every element is an int becomes a constant;
* a ``Reshape`` target becomes a constant when each symbolic element either equals the data's dim at the
  same axis (written ``0``, "copy that dim", when ``allowzero`` is 0) or is the only one left (``-1``):
  ``Reshape(x:[batch,4,4,16], Concat(Unsqueeze(Gather(Shape(x), 0)), [16, 16]))`` → ``Reshape(x, [0, 16, 16])``;
* an ``Expand`` target likewise, with ``1`` for each dim equal to the input's (broadcasting keeps it);
* a ``Concat`` of shape pieces that stays symbolic is rebuilt from ``Shape(x, start, end)`` slices (times a
  constant where the dim is a multiple) and one constant per run of static dims, when that takes fewer
  nodes: ``Concat(Unsqueeze(Gather(Shape(x), 0)), [3, -1])`` → ``Concat(Shape(x, 0, 1), [3, -1])``.

Producers left unused are removed. Two symbolic dims are equal when their names are (the convention of
ONNX shape inference and of the Shape Tracker: one name, one value throughout the model); a dim with no
name equals only itself. Only the main graph is rewritten.

Over 500 lines because each shape-arithmetic op (Shape, Gather, Slice, Concat, Unsqueeze, Squeeze,
Reshape...) needs its own rule over partly known values, all sharing one value lattice.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from flexdsa_core._libraries import sympy_expression
from flexdsa_core.passes._values import small_constant

# A shape computation never needs more integers than this; larger integer tensors are data, not shapes.
_MAX_ELEMENTS = 64
_INT_TYPES = (ir.DataType.INT64, ir.DataType.INT32)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Monomial = tuple[str, ...]  # sorted symbol names, repeated for powers


@dataclass(frozen=True)
class SymDim:
    """A dim as a polynomial with integer coefficients: ``((("batch",), 16),)`` is ``16*batch``."""

    terms: tuple[tuple[Monomial, int], ...]

    @staticmethod
    def of(terms: dict[Monomial, int]) -> Dim:
        kept = tuple(sorted((m, c) for m, c in terms.items() if c != 0))
        if not kept:
            return 0
        if len(kept) == 1 and kept[0][0] == ():
            return kept[0][1]
        return SymDim(kept)

    @staticmethod
    def symbol(name: str) -> SymDim:
        return SymDim((((name,), 1),))

    def __str__(self) -> str:
        return " + ".join(f"{c}*{'*'.join(m)}" if m else str(c) for m, c in self.terms)


Dim = int | SymDim


def _terms(dim: Dim) -> dict[Monomial, int]:
    return {(): dim} if isinstance(dim, int) else dict(dim.terms)


def _add(a: Dim, b: Dim, sign: int = 1) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a + sign * b
    terms = _terms(a)
    for monomial, coefficient in _terms(b).items():
        terms[monomial] = terms.get(monomial, 0) + sign * coefficient
    return SymDim.of(terms)


def _mul(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    terms: dict[Monomial, int] = {}
    for ma, ca in _terms(a).items():
        for mb, cb in _terms(b).items():
            monomial = tuple(sorted(ma + mb))
            terms[monomial] = terms.get(monomial, 0) + ca * cb
    return SymDim.of(terms)


def _div(a: Dim, b: Dim) -> Dim | None:
    """Integer division where it is exact, or of two non-negative ints (ONNX truncates; floor agrees)."""
    if isinstance(b, int):
        if b == 0:
            return None
        if isinstance(a, int):
            return a // b if a >= 0 and b > 0 else (a // b if a % b == 0 else None)
        if all(c % b == 0 for _, c in a.terms):
            return SymDim.of({m: c // b for m, c in a.terms})
        return None
    return 1 if a == b else None


@dataclass(frozen=True)
class Tracked:
    """The value of a small integer tensor: a 1-D list of dims, or one dim when ``scalar``."""

    dims: tuple[Dim, ...]
    scalar: bool = False

    @property
    def static(self) -> bool:
        return all(isinstance(d, int) for d in self.dims)


class _Context:
    """What the evaluators read: tracked values, constants, attributes; and where each symbolic dim is."""

    def __init__(self) -> None:
        self.values: dict[ir.Value, Tracked] = {}
        # A dim expression -> the (tensor, axis) pairs that hold it, for rebuilding shapes from Shape slices.
        self.sources: dict[SymDim, list[tuple[ir.Value, int]]] = {}
        self._parsed: dict[str, Dim] = {}

    def tracked(self, value: ir.Value | None) -> Tracked | None:
        if value is None:
            return None
        known = self.values.get(value)
        if known is not None:
            return known
        if value.dtype not in _INT_TYPES:  # narrower integers wrap around; shapes are int64 (or int32)
            return None
        array = small_constant(value, _MAX_ELEMENTS)
        if array is None or array.ndim > 1:
            return None
        return Tracked(tuple(int(v) for v in array.reshape(-1)), scalar=array.ndim == 0)

    def ints(self, value: ir.Value | None) -> list[int] | None:
        """A constant's integers (scalar or 1-D), or None when not constant."""
        known = self.tracked(value)
        if known is None or not known.static:
            return None
        return [int(d) for d in known.dims]

    def dims_of(self, value: ir.Value) -> list[Dim] | None:
        if value.shape is None:
            return None
        result = []
        for axis, dim in enumerate(value.shape.dims):
            if isinstance(dim, int):
                result.append(dim)
                continue
            expression = self._parse(dim, value, axis)
            if isinstance(expression, SymDim):
                holders = self.sources.setdefault(expression, [])
                if (value, axis) not in holders:
                    holders.append((value, axis))
            result.append(expression)
        return result

    def _parse(self, dim: ir.SymbolicDim, value: ir.Value, axis: int) -> Dim:
        name = dim.value
        if name is None:  # unknown: equal only to itself
            return SymDim.symbol(f"?{id(value)}:{axis}")
        if name not in self._parsed:
            self._parsed[name] = _parse_dim_name(dim)
        return self._parsed[name]


def _parse_dim_name(dim: ir.SymbolicDim) -> Dim:
    """``batch`` -> the symbol; ``16*batch`` (ONNX Runtime's symbolic inference) -> that polynomial, so that
    it equals ``Mul(batch, 16)`` computed in the graph; anything else -> one opaque symbol."""
    name = dim.value
    if _IDENTIFIER.match(name):
        return SymDim.symbol(name)
    try:
        import sympy

        expression = sympy_expression(dim)  # onnx_ir's own parser (no eval of the model's strings)
        polynomial = sympy.Poly(expression)
        if not all(isinstance(g, sympy.Symbol) for g in polynomial.gens):
            raise ValueError("not a polynomial in dim names")
        terms: dict[Monomial, int] = {}
        for powers, coefficient in polynomial.terms():
            if not coefficient.is_integer:
                raise ValueError("fractional coefficient")
            monomial = tuple(
                sorted(g.name for g, p in zip(polynomial.gens, powers, strict=True) for _ in range(p))
            )
            terms[monomial] = int(coefficient)
        return SymDim.of(terms)
    except Exception:  # noqa: BLE001 - an unparseable name is still a name
        return SymDim.symbol(name)


# -- one evaluator per op ------------------------------------------------------------------------------

_EVALUATORS: dict[str, Callable[[ir.Node, _Context], Tracked | None]] = {}


def _evaluates(*op_types: str):
    def register(function):
        for op_type in op_types:
            _EVALUATORS[op_type] = function
        return function

    return register


def _axis_is_first(node: ir.Node, rank: int = 1) -> bool:
    axis = node.attributes.get_int("axis", 0)
    return axis in (0, -rank)


def _attribute_or_input(node: ir.Node, attribute: str, index: int, ctx: _Context) -> list[int] | None:
    if attribute in node.attributes:
        return list(node.attributes.get_ints(attribute))
    if len(node.inputs) > index and node.inputs[index] is not None:
        return ctx.ints(node.inputs[index])
    return None


@_evaluates("Shape")
def _shape(node: ir.Node, ctx: _Context) -> Tracked | None:
    dims = ctx.dims_of(node.inputs[0])
    if dims is None:
        return None
    rank = len(dims)
    start = node.attributes.get_int("start", 0)
    end = node.attributes.get_int("end", rank)
    start, end = (min(max(v + rank if v < 0 else v, 0), rank) for v in (start, end))
    return Tracked(tuple(dims[start:end]))


@_evaluates("Size")
def _size(node: ir.Node, ctx: _Context) -> Tracked | None:
    dims = ctx.dims_of(node.inputs[0])
    if dims is None:
        return None
    total: Dim = 1
    for dim in dims:
        total = _mul(total, dim)
    return Tracked((total,), scalar=True)


@_evaluates("Identity")
def _identity(node: ir.Node, ctx: _Context) -> Tracked | None:
    return ctx.tracked(node.inputs[0])


@_evaluates("Cast")
def _cast(node: ir.Node, ctx: _Context) -> Tracked | None:
    if node.attributes.get_int("to") not in _INT_TYPES:
        return None
    return ctx.tracked(node.inputs[0])


@_evaluates("Gather")
def _gather(node: ir.Node, ctx: _Context) -> Tracked | None:
    data, indices = ctx.tracked(node.inputs[0]), ctx.tracked(node.inputs[1])
    if data is None or data.scalar or indices is None or not indices.static or not _axis_is_first(node):
        return None
    size = len(data.dims)
    picked = []
    for index in indices.dims:
        index = index + size if index < 0 else index
        if not 0 <= index < size:
            return None
        picked.append(data.dims[index])
    return Tracked(tuple(picked), scalar=indices.scalar)


@_evaluates("Slice")
def _slice(node: ir.Node, ctx: _Context) -> Tracked | None:
    data = ctx.tracked(node.inputs[0])
    if data is None or data.scalar:
        return None
    starts = _attribute_or_input(node, "starts", 1, ctx)
    ends = _attribute_or_input(node, "ends", 2, ctx)
    axes = _attribute_or_input(node, "axes", 3, ctx) or [0]
    has_steps = len(node.inputs) > 4 and node.inputs[4] is not None
    steps = ctx.ints(node.inputs[4]) if has_steps else [1]
    if starts is None or ends is None or steps is None or axes not in ([0], [-1]):
        return None
    if len(starts) != 1 or len(ends) != 1 or len(steps) != 1 or steps[0] == 0:
        return None
    # ONNX clamps out-of-range starts/ends exactly as Python slicing does.
    return Tracked(tuple(data.dims[slice(starts[0], ends[0], steps[0])]))


@_evaluates("Unsqueeze")
def _unsqueeze(node: ir.Node, ctx: _Context) -> Tracked | None:
    data = ctx.tracked(node.inputs[0])
    axes = _attribute_or_input(node, "axes", 1, ctx)
    if data is None or not data.scalar or axes not in ([0], [-1]):
        return None
    return Tracked(data.dims)


@_evaluates("Squeeze")
def _squeeze(node: ir.Node, ctx: _Context) -> Tracked | None:
    data = ctx.tracked(node.inputs[0])
    axes = _attribute_or_input(node, "axes", 1, ctx)
    if data is None or data.scalar or len(data.dims) != 1 or axes not in (None, [0], [-1]):
        return None
    return Tracked(data.dims, scalar=True)


@_evaluates("Concat")
def _concat(node: ir.Node, ctx: _Context) -> Tracked | None:
    parts = [ctx.tracked(v) for v in node.inputs]
    if not parts or any(p is None or p.scalar for p in parts) or not _axis_is_first(node):
        return None
    return Tracked(tuple(d for p in parts for d in p.dims))


@_evaluates("Reshape")
def _reshape(node: ir.Node, ctx: _Context) -> Tracked | None:
    """A tracked 1-D or scalar value reshaped to 1-D or a scalar (``[1]`` <-> ``[]``, ``[-1]``)."""
    data, target = ctx.tracked(node.inputs[0]), ctx.ints(node.inputs[1])
    if data is None or target is None or len(target) > 1:
        return None
    if not target:
        return Tracked(data.dims, scalar=True) if len(data.dims) == 1 else None
    return Tracked(data.dims) if target[0] in (-1, len(data.dims)) else None


def _elementwise(combine: Callable[[Dim, Dim], Dim | None]):
    def evaluate(node: ir.Node, ctx: _Context) -> Tracked | None:
        a, b = ctx.tracked(node.inputs[0]), ctx.tracked(node.inputs[1])
        if a is None or b is None:
            return None
        length = max(len(a.dims), len(b.dims))
        if {len(a.dims), len(b.dims)} - {1, length}:
            return None  # not a broadcast of 1-D shapes
        result = []
        for index in range(length):
            value = combine(a.dims[index % len(a.dims)], b.dims[index % len(b.dims)])
            if value is None:
                return None
            result.append(value)
        return Tracked(tuple(result), scalar=a.scalar and b.scalar)

    return evaluate


_evaluates("Add")(_elementwise(_add))
_evaluates("Sub")(_elementwise(lambda a, b: _add(a, b, -1)))
_evaluates("Mul")(_elementwise(_mul))
_evaluates("Div")(_elementwise(_div))


# -- the rewrites ---------------------------------------------------------------------------------------


def _reshape_target(node: ir.Node, target: Tracked, ctx: _Context) -> list[int] | None:
    """The Reshape target as constants, with 0 ("copy") and -1 ("the rest") for symbolic dims; or None."""
    data = node.inputs[0]
    data_dims = ctx.dims_of(data) if data is not None else None
    copy_allowed = node.attributes.get_int("allowzero", 0) == 0
    result: list[int | None] = []
    for axis, dim in enumerate(target.dims):
        if isinstance(dim, int):
            result.append(dim)
        elif copy_allowed and data_dims is not None and axis < len(data_dims) and data_dims[axis] == dim:
            result.append(0)
        else:
            result.append(None)
    open_dims = [i for i, d in enumerate(result) if d is None]
    if len(open_dims) > 1 or (open_dims and -1 in result):
        return None
    return [-1 if d is None else d for d in result]


def _expand_target(node: ir.Node, target: Tracked, ctx: _Context) -> list[int] | None:
    """The Expand target as constants, with 1 where the dim equals the input's (broadcasting keeps it)."""
    data_dims = ctx.dims_of(node.inputs[0]) if node.inputs[0] is not None else None
    if data_dims is None:
        return None
    offset = len(target.dims) - len(data_dims)
    result = []
    for index, dim in enumerate(target.dims):
        if isinstance(dim, int):
            result.append(dim)
        elif index - offset >= 0 and data_dims[index - offset] == dim:
            result.append(1)
        else:
            return None
    return result


class PartialShapeFoldingPass(ir.passes.InPlacePass):
    """Shape arithmetic over static dims → constants while other dims stay symbolic (module docstring)."""

    name = "partial_shape_folding"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        ctx = _Context()
        names = _Names(model)
        modified = False
        for node in list(graph):
            if node.domain not in ("", "ai.onnx"):
                continue
            evaluator = _EVALUATORS.get(node.op_type)
            if evaluator is not None and len(node.outputs) == 1 and _integer_output(node):
                tracked = evaluator(node, ctx)
                if tracked is not None and len(tracked.dims) <= _MAX_ELEMENTS:
                    ctx.values[node.outputs[0]] = tracked
                    if tracked.static and node.op_type != "Constant":
                        modified |= _replace_by_constant(graph, node.outputs[0], tracked, names)
            if node.op_type in ("Reshape", "Expand") and len(node.inputs) > 1:
                modified |= _fold_target(graph, node, ctx, names)
        if model.opset_imports.get("", 0) >= 15:  # Shape's start/end attributes
            order = {node: index for index, node in enumerate(graph)}
            for node in list(graph):
                if node.op_type == "Concat" and node.domain in ("", "ai.onnx") and node.graph is graph:
                    modified |= _rebuild_concat(graph, node, ctx, names, order)
        if modified:
            common_passes.RemoveUnusedNodesPass()(model)
        return ir.passes.PassResult(model, modified)


def _integer_output(node: ir.Node) -> bool:
    dtype = node.outputs[0].dtype
    return dtype in _INT_TYPES or (dtype is None and node.op_type in ("Shape", "Size"))


class _Names:
    """Fresh value names that no existing value uses."""

    def __init__(self, model: ir.Model) -> None:
        self.taken = {v.name for v in model.graph.inputs} | set(model.graph.initializers)
        self.taken |= {
            out.name for node in ir.traversal.RecursiveGraphIterator(model.graph) for out in node.outputs
        }

    def fresh(self, base: str) -> str:
        name, n = base, 1
        while name in self.taken:
            name, n = f"{base}_{n}", n + 1
        self.taken.add(name)
        return name


def _constant(graph: ir.Graph, values: Iterable[int], dtype: ir.DataType, names: _Names, base: str, *,
              scalar: bool = False) -> ir.Value:  # fmt: skip
    array = np.array(list(values), dtype=dtype.numpy())
    if scalar:
        array = array.reshape(())
    name = names.fresh(base)
    value = ir.Value(name=name, shape=ir.Shape(array.shape), type=ir.TensorType(dtype),
                     const_value=ir.tensor(array, name=name))  # fmt: skip
    graph.register_initializer(value)
    return value


def _replace_by_constant(graph: ir.Graph, output: ir.Value, tracked: Tracked, names: _Names) -> bool:
    if output.is_graph_output() or not output.uses() or output.dtype not in _INT_TYPES:
        return False
    constant = _constant(
        graph, tracked.dims, output.dtype, names, f"{output.name}_folded", scalar=tracked.scalar
    )
    ir.convenience.replace_all_uses_with(output, constant)
    return True


def _fold_target(graph: ir.Graph, node: ir.Node, ctx: _Context, names: _Names) -> bool:
    shape = node.inputs[1]
    if shape is None or small_constant(shape, _MAX_ELEMENTS) is not None:
        return False
    target = ctx.tracked(shape)
    if target is None or target.scalar:
        return False
    fold = _reshape_target if node.op_type == "Reshape" else _expand_target
    folded = fold(node, target, ctx)
    if folded is None:
        return False
    node.replace_input_with(1, _constant(graph, folded, ir.DataType.INT64, names, f"{shape.name}_folded"))
    return True


def _rebuild_concat(
    graph: ir.Graph, node: ir.Node, ctx: _Context, names: _Names, order: dict[ir.Node, int]
) -> bool:
    """Rebuild a partly symbolic shape from Shape slices and constants when that takes fewer nodes."""
    output = node.outputs[0]
    tracked = ctx.values.get(output)
    if tracked is None or tracked.static or output.is_graph_output() or not output.uses():
        return False
    plan = _slices_plan(tracked.dims, ctx, lambda value: _defined_before(value, node, order))
    if plan is None:
        return False
    # Shape slices are int64: an int32 shape (tf2onnx's arithmetic) is cast back so every consumer keeps its type.
    cast_back = output.dtype == ir.DataType.INT32
    new_node_count = sum(1 + (coefficient != 1) for kind, _, coefficient in plan if kind == "dims") + 1 + cast_back
    if new_node_count >= _exclusive_cone_size(node):
        return False
    pieces, new_nodes = [], []
    for kind, what, coefficient in plan:
        if kind == "ints":
            pieces.append(_constant(graph, what, ir.DataType.INT64, names, f"{output.name}_static"))
            continue
        source, start, end = what
        shape = ir.node(
            "Shape", [source], {"start": start, "end": end}, name=names.fresh(f"{output.name}_Shape")
        )
        shape.outputs[0].name = names.fresh(f"{output.name}_dims")
        new_nodes.append(shape)
        piece = shape.outputs[0]
        if coefficient != 1:
            factor = _constant(graph, [coefficient], ir.DataType.INT64, names, f"{output.name}_factor")
            scaled = ir.node("Mul", [piece, factor], name=names.fresh(f"{output.name}_Mul"))
            scaled.outputs[0].name = names.fresh(f"{output.name}_scaled")
            new_nodes.append(scaled)
            piece = scaled.outputs[0]
        pieces.append(piece)
    for piece in pieces:
        piece.type = ir.TensorType(ir.DataType.INT64)
    concat = ir.node("Concat", pieces, {"axis": 0}, name=names.fresh(f"{node.name or 'Concat'}_partial"))
    concat.outputs[0].name = names.fresh(f"{output.name}_partial")
    concat.outputs[0].type = ir.TensorType(ir.DataType.INT64)
    concat.outputs[0].shape = output.shape
    new_nodes.append(concat)
    rebuilt = concat.outputs[0]
    if cast_back:
        cast = ir.node("Cast", [rebuilt], {"to": ir.DataType.INT32}, name=names.fresh(f"{concat.name}_Cast"))
        cast.outputs[0].name = names.fresh(f"{output.name}_partial_int32")
        cast.outputs[0].type = output.type
        cast.outputs[0].shape = output.shape
        new_nodes.append(cast)
        rebuilt = cast.outputs[0]
    graph.insert_before(node, new_nodes)
    ir.convenience.replace_all_uses_with(output, rebuilt)
    ctx.values[rebuilt] = tracked
    return True


def _defined_before(value: ir.Value, node: ir.Node, order: dict[ir.Node, int]) -> bool:
    producer = value.producer()
    if producer is None:
        return value.is_graph_input() or value.is_initializer()
    return producer in order and order[producer] < order[node]


def _slices_plan(
    dims: tuple[Dim, ...], ctx: _Context, usable: Callable[[ir.Value], bool]
) -> list[tuple[str, object, int]] | None:
    """[("ints", [3, -1], 1) | ("dims", (tensor, start, end), k)]: runs of static dims, runs of consecutive
    axes of one tensor, and k times a tensor's dim. None when a dim is held by no usable tensor."""
    plan: list[tuple[str, object, int]] = []
    for dim in dims:
        if isinstance(dim, int):
            if plan and plan[-1][0] == "ints":
                plan[-1][1].append(dim)
            else:
                plan.append(("ints", [dim], 1))
            continue
        found = _source_of(dim, ctx, usable)
        if found is None:
            return None
        (source, axis), coefficient = found
        last = plan[-1] if plan else None
        if (
            last is not None and last[0] == "dims" and coefficient == 1 and last[2] == 1
            and last[1][0] is source and last[1][2] == axis
        ):  # fmt: skip
            plan[-1] = ("dims", (source, last[1][1], axis + 1), 1)
        else:
            plan.append(("dims", (source, axis, axis + 1), coefficient))
    return plan


def _source_of(
    dim: SymDim, ctx: _Context, usable: Callable[[ir.Value], bool]
) -> tuple[tuple[ir.Value, int], int] | None:
    """(tensor, axis) holding ``dim``, or holding ``dim / k`` for the gcd k of its coefficients, with k."""
    common = 0
    for _, coefficient in dim.terms:
        common = math.gcd(common, coefficient)
    candidates = [(dim, 1)]
    if common > 1:
        candidates.append((_div(dim, common), common))
    for expression, factor in candidates:
        for source, axis in ctx.sources.get(expression, []):
            if usable(source):
                return (source, axis), factor
    return None


def _exclusive_cone_size(node: ir.Node) -> int:
    """Nodes that would go with ``node``: itself and the shape arithmetic only it (transitively) reads, up
    to and including Shape nodes; Constant nodes are not counted (they become initializers either way)."""
    upstream: list[ir.Node] = []
    seen = {node}
    frontier = [node]
    while frontier:
        current = frontier.pop()
        if current is not node and current.op_type in ("Shape", "Size"):
            continue  # the tensor it reads is needed anyway
        for value in current.inputs:
            producer = value.producer() if value is not None else None
            if producer is not None and producer not in seen and producer.graph is node.graph:
                seen.add(producer)
                upstream.append(producer)
                frontier.append(producer)
    cone = {node}
    changed = True
    while changed:
        changed = False
        for producer in upstream:
            if producer in cone:
                continue
            if all(
                not out.is_graph_output() and all(use.node in cone for use in out.uses())
                for out in producer.outputs
            ):
                cone.add(producer)
                changed = True
    return sum(1 for n in cone if n.op_type != "Constant")
