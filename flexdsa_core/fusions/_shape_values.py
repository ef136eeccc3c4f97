"""Reading the values around a match: integer shape vectors the exporters compute at run time, and
whether a match's intermediates are used outside it.

With dynamic batch or sequence the TorchScript exporter builds every Reshape shape from Shape nodes:
``Concat(Unsqueeze(Gather(Shape(t), 0)), ..., [H], Unsqueeze(Div(Gather(Shape(t), 2), H)))``.
``shape_entries`` evaluates such a vector as far as constants and known dims allow (None where not), so
a rule can read the number of heads without shape folding. Those Shape nodes also read the tensors inside
a match; ``outside_use_refusal`` allows exactly that use (the nodes die with the match), which rules
built with ``remove_nodes=False`` need in place of onnxscript's own removability check.
"""

from __future__ import annotations

import onnx_ir as ir

from flexdsa_core._libraries import get_numpy_value, get_singleton_value
from flexdsa_core.fusions._norm_checks import node_label


def const_ints(value: ir.Value | None) -> list[int] | None:
    array = get_numpy_value(value)
    return None if array is None or array.ndim != 1 else [int(v) for v in array]


# Ops that compute with shapes: what a Shape node's result may flow through before a matched Reshape.
_SHAPE_OPS = frozenset(
    {"Shape", "Gather", "Unsqueeze", "Squeeze", "Concat", "Slice", "Cast", "Div", "Mul", "Add", "Sub"}
)


def dims(value: ir.Value, known: dict) -> list | None:
    if value in known:
        return known[value]
    if value.shape is None:
        return None
    return [d if isinstance(d, int) else None for d in value.shape]


def shape_entries(value: ir.Value | None, known: dict) -> list | None:
    """The entries of a 1-D shape tensor, each an int or None (unknown), or None when unreadable.
    Reads constants and the exporters' dynamic form Concat(Unsqueeze(Gather(Shape(t), i)), [H], ...)."""
    if value is None:
        return None
    if (constant := const_ints(value)) is not None:
        return constant
    node = value.producer()
    if node is None:
        return None
    if node.op_type == "Concat":
        parts = [shape_entries(part, known) for part in node.inputs]
        return None if any(part is None for part in parts) else [entry for part in parts for entry in part]
    if node.op_type == "Unsqueeze":
        return [scalar(node.inputs[0], known)]
    if node.op_type == "Shape":
        shape = dims(node.inputs[0], known)
        if shape is None:
            return None
        start, end = node.attributes.get_int("start", 0), node.attributes.get_int("end", len(shape))
        return shape[start:end]
    return None


def scalar(value: ir.Value | None, known: dict) -> int | None:
    """An integer scalar computed from constants and known dims, or None."""
    if value is None:
        return None
    if (constant := get_singleton_value(value)) is not None:
        return int(constant)
    node = value.producer()
    if node is None:
        return None
    if node.op_type in ("Cast", "Squeeze", "Identity"):
        return scalar(node.inputs[0], known)
    if node.op_type == "Gather" and node.attributes.get_int("axis", 0) == 0:
        entries, index = shape_entries(node.inputs[0], known), scalar(node.inputs[1], known)
        if entries is None or index is None or not -len(entries) <= index < len(entries):
            return None
        return entries[index]
    if node.op_type in ("Mul", "Div"):
        left, right = scalar(node.inputs[0], known), scalar(node.inputs[1], known)
        if left is None or right is None:
            return None
        if node.op_type == "Mul":
            return left * right
        return left // right if right and left % right == 0 else None
    return None


def outside_use_refusal(context) -> str | None:
    """None when the matched intermediates are read outside the match only to compute its own shapes."""
    matched = set(context.nodes)
    for node in matched:
        if node is context.root:
            continue
        for output in node.outputs:
            if output.is_graph_output():
                return f"'{output.name}' inside the attention is a graph output."
            for user, _ in output.uses():
                if user.graph is None:
                    continue  # a node a discarded rewrite built (tracing, or a refused candidate): not a use
                if user not in matched and not _only_shapes_for(user, matched):
                    return f"'{output.name}' inside the attention is also used by {node_label(user)}."
    return None


def _only_shapes_for(shape_node: ir.Node, matched: set) -> bool:
    """Whether ``shape_node`` is a Shape whose result only flows, through shape ops, into matched nodes."""
    if shape_node.op_type != "Shape":
        return False
    pending, seen = [shape_node], set()
    while pending:
        node = pending.pop()
        if node in seen:
            continue
        seen.add(node)
        for output in node.outputs:
            if output.is_graph_output():
                return False
            for user, _ in output.uses():
                if user in matched or user.graph is None:
                    continue
                if user.op_type not in _SHAPE_OPS:
                    return False
                pending.append(user)
    return True
