"""``no_op_removal``: drop nodes whose output equals one of their inputs.

One short function per op answers "which input does this node's output equal, if any?" (the registry
below). A node that answers is bypassed: its consumers read the input directly. Broadcasting is respected:
``x * 1`` is only a no-op when the constant does not broadcast ``x`` to a bigger shape. A graph output
keeps its name (the forwarded value takes it); where that is impossible (the input is a graph input, an
initializer or another graph output) the node is kept, as an ``Identity`` when it was something heavier.
The one numeric liberty: ``x + 0`` for ``x = -0.0`` is ``+0.0``, and removing it keeps ``-0.0`` (equal
under every comparison).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from flexdsa_core.passes._values import broadcast_keeps_shape, dims, small_constant

_FORWARDERS: dict[str, Callable[[ir.Node], ir.Value | None]] = {}
_INT64_LARGE = 2**62  # an "end" at least this big means "to the end" whatever the dim


def _forwards(*op_types: str):
    def register(function):
        for op_type in op_types:
            _FORWARDERS[op_type] = function
        return function

    return register


@_forwards("Identity")
def _identity(node: ir.Node) -> ir.Value | None:
    return node.inputs[0]


@_forwards("Dropout")
def _dropout(node: ir.Node) -> ir.Value | None:
    """Dropout is the identity unless training_mode (input 2, opset >= 12) is true; its mask must be unused."""
    if len(node.outputs) > 1 and (node.outputs[1].uses() or node.outputs[1].is_graph_output()):
        return None
    if len(node.inputs) > 2 and node.inputs[2] is not None:
        training = small_constant(node.inputs[2])
        if training is None or bool(training.reshape(-1)[0]):
            return None
    if "is_test" in node.attributes and node.attributes.get_int("is_test", 0) == 0:
        return None  # opset < 7 training-mode Dropout
    return node.inputs[0]


@_forwards("Cast")
def _cast(node: ir.Node) -> ir.Value | None:
    source = node.inputs[0]
    to = node.attributes.get_int("to")
    if source is not None and source.dtype is not None and to is not None and source.dtype == to:
        return source
    return None


@_forwards("CastLike")
def _cast_like(node: ir.Node) -> ir.Value | None:
    source, like = node.inputs[0], node.inputs[1]
    if source is not None and like is not None and source.dtype is not None and source.dtype == like.dtype:
        return source
    return None


@_forwards("Reshape")
def _reshape(node: ir.Node) -> ir.Value | None:
    """Reshape to the shape the input already has: each target dim copies (0), equals, or is the one -1."""
    source_dims = dims(node.inputs[0])
    target = small_constant(node.inputs[1]) if len(node.inputs) > 1 else None
    if source_dims is None or target is None or target.ndim != 1 or len(target) != len(source_dims):
        return None
    allow_zero = node.attributes.get_int("allowzero", 0)
    unresolved = 0
    for source_dim, wanted in zip(source_dims, target.tolist(), strict=True):
        if wanted == 0 and not allow_zero:
            continue
        if isinstance(source_dim, int) and source_dim == wanted:
            continue
        if wanted == -1:
            unresolved += 1
            continue
        return None
    return node.inputs[0] if unresolved <= 1 else None


@_forwards("Transpose")
def _transpose(node: ir.Node) -> ir.Value | None:
    """The identity permutation, or the inverse of the Transpose that produced the input."""
    perm_attr = node.attributes.get("perm")
    if perm_attr is None:
        return None
    perm = list(perm_attr.as_ints())
    if perm == list(range(len(perm))):
        return node.inputs[0]
    producer = node.inputs[0].producer() if node.inputs[0] is not None else None
    if producer is None or producer.op_type != "Transpose" or producer.domain != "":
        return None
    inner_attr = producer.attributes.get("perm")
    if inner_attr is None:
        return None
    inner = list(inner_attr.as_ints())
    if len(inner) == len(perm) and [inner[p] for p in perm] == list(range(len(perm))):
        return producer.inputs[0]
    return None


_BINARY_IDENTITY = {"Mul": (1, True), "Add": (0, True), "Sub": (0, False), "Div": (1, False)}


@_forwards(*_BINARY_IDENTITY)
def _binary_identity(node: ir.Node) -> ir.Value | None:
    """x*1, 1*x, x+0, 0+x, x-0, x/1, when the constant broadcasts to no bigger shape than x."""
    neutral, commutative = _BINARY_IDENTITY[node.op_type]
    candidates = [(0, 1), (1, 0)] if commutative else [(0, 1)]
    for data_index, constant_index in candidates:
        data, constant_value = node.inputs[data_index], node.inputs[constant_index]
        constant = small_constant(constant_value)
        data_dims = dims(data)
        if constant is None or data_dims is None or data is None:
            continue
        if data.dtype is None or constant_value.dtype != data.dtype:
            continue
        if np.all(constant == neutral) and broadcast_keeps_shape(data_dims, constant.shape):
            return data
    return None


@_forwards("Expand")
def _expand(node: ir.Node) -> ir.Value | None:
    shape = small_constant(node.inputs[1])
    source_dims = dims(node.inputs[0])
    if shape is None or source_dims is None or shape.ndim != 1:
        return None
    return node.inputs[0] if broadcast_keeps_shape(source_dims, tuple(shape.tolist())) else None


@_forwards("Slice")
def _slice(node: ir.Node) -> ir.Value | None:
    """Every sliced axis starts at 0, steps by 1 and runs to (at least) its end."""
    source_dims = dims(node.inputs[0])
    if source_dims is None or len(node.inputs) < 3:
        return None
    starts, ends = small_constant(node.inputs[1]), small_constant(node.inputs[2])
    if starts is None or ends is None:
        return None
    rank = len(source_dims)
    axes = list(range(len(starts)))
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        given_axes = small_constant(node.inputs[3])
        if given_axes is None:
            return None
        axes = [int(axis) % rank if rank else int(axis) for axis in given_axes.tolist()]
    steps = [1] * len(axes)
    if len(node.inputs) > 4 and node.inputs[4] is not None:
        given_steps = small_constant(node.inputs[4])
        if given_steps is None:
            return None
        steps = given_steps.tolist()
    for axis, start, end, step in zip(axes, starts.tolist(), ends.tolist(), steps, strict=True):
        if step != 1 or axis >= rank:
            return None
        dim = source_dims[axis]
        if start != 0 and not (isinstance(dim, int) and start <= -dim):
            return None
        if end >= _INT64_LARGE or (isinstance(dim, int) and end >= dim):
            continue
        return None
    return node.inputs[0]


@_forwards("Pad")
def _pad(node: ir.Node) -> ir.Value | None:
    if "pads" in node.attributes:  # opset < 11
        pads = list(node.attributes.get_ints("pads"))
    elif len(node.inputs) > 1:
        constant = small_constant(node.inputs[1])
        if constant is None:
            return None
        pads = constant.tolist()
    else:
        return None
    return node.inputs[0] if all(p == 0 for p in pads) else None


@_forwards("Concat")
def _concat(node: ir.Node) -> ir.Value | None:
    """A Concat of one tensor, possibly with empty constants along the axis."""
    axis = node.attributes.get_int("axis", 0)
    non_empty = []
    for value in node.inputs:
        constant = small_constant(value)
        if constant is not None and constant.ndim > 0 and constant.shape[axis % constant.ndim] == 0:
            continue
        non_empty.append(value)
    if len(non_empty) != 1:
        return None
    return non_empty[0]


def _drop_if_unused(node: ir.Node) -> None:
    """Remove ``node`` and, transitively, the producers it alone fed, once nothing reads their outputs."""
    pending = [node]
    while pending:
        current = pending.pop()
        if current.graph is None or any(out.uses() or out.is_graph_output() for out in current.outputs):
            continue
        pending.extend(value.producer() for value in current.inputs if value is not None and value.producer())
        current.graph.remove(current, safe=True)


def _bypass(node: ir.Node, source: ir.Value) -> bool:
    """Make the consumers of ``node``'s output read ``source``; returns whether the graph changed."""
    output = node.outputs[0]
    graph = node.graph
    source_producer = source.producer()
    renamable = (
        source_producer is not None and source_producer.graph is graph and not source.is_graph_output()
    )
    if output.is_graph_output() and not renamable:
        # The output's name must survive, and the source (a graph input, an initializer, another output
        # or an outer-scope value) cannot take it: keep an Identity in the node's place.
        if node.op_type == "Identity" and node.domain == "":
            return False
        identity = ir.node("Identity", [source], name=f"{node.name or 'no_op'}_identity")
        graph.insert_before(node, identity)
        ir.convenience.replace_all_uses_with(output, identity.outputs[0], replace_graph_outputs=True)
        name, identity.outputs[0].type, identity.outputs[0].shape = output.name, output.type, output.shape
        graph.remove(node, safe=True)
        output.name = None
        identity.outputs[0].name = name
        return True
    was_output, name = output.is_graph_output(), output.name
    # The forwarded value computes the same tensor: keep what is known of its type and shape.
    if source.type is None:
        source.type = output.type
    if source.shape is None:
        source.shape = output.shape
    ir.convenience.replace_all_uses_with(output, source, replace_graph_outputs=True)
    graph.remove(node, safe=True)
    if was_output:
        output.name = None
        source.name = name
    return True


def bypass_no_ops(model: ir.Model, op_types: frozenset[str] | None = None) -> bool:
    """Bypass every no-op node (of ``op_types`` only, when given) in the model's graphs; returns whether
    anything changed."""
    modified = False
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        if node.domain != "" or node.graph is None or not node.outputs:
            continue
        if op_types is not None and node.op_type not in op_types:
            continue
        forwarder = _FORWARDERS.get(node.op_type)
        if forwarder is None:
            continue
        if any(output.is_graph_output() for output in node.outputs[1:]):
            continue
        source = forwarder(node)
        if source is None or source is node.outputs[0]:
            continue
        producers = [value.producer() for value in node.inputs if value is not None]
        if _bypass(node, source):
            modified = True
            for producer in producers:  # constants and Transposes the bypass left unread
                if producer is not None:
                    _drop_if_unused(producer)
    return modified


class NoOpRemovalPass(ir.passes.InPlacePass):
    """Identity, inference Dropout, same-type Cast, same-shape Reshape, inverse Transposes, x*1, x+0...
    → their input."""

    name = "no_op_removal"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        return ir.passes.PassResult(model, bypass_no_ops(model))
