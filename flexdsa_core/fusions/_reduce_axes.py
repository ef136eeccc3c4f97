"""Reading a ReduceMean's axes in both of its forms: an ``axes`` attribute (opset < 18) or an input (18+)."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import _ir_utils


def reduce_axes(node: ir.Node) -> list[int] | None:
    """The reduced axes as a list, or None when they are not known constants (or reduce everything)."""
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = _ir_utils.get_numpy_value(node.inputs[1])
        return None if axes is None else [int(a) for a in axes.reshape(-1)]
    attribute = node.attributes.get("axes")
    return None if attribute is None else [int(a) for a in attribute.as_ints()]


def node_label(node: ir.Node) -> str:
    """``ReduceMean 'name'``, or just the op type for an unnamed node."""
    return f"{node.op_type} '{node.name}'" if node.name else node.op_type


def last_axis_refusal(node: ir.Node, x: ir.Value) -> str | None:
    """None when ``node`` reduces exactly the last axis of ``x`` and keeps dims, else why not."""
    if node.attributes.get_int("keepdims", 1) != 1:
        return f"{node_label(node)} drops the reduced axis (keepdims=0)."
    axes = reduce_axes(node)
    if axes is None:
        return f"{node_label(node)} has no constant axes."
    rank = x.shape.rank() if x.shape is not None else None
    if axes == [-1] or (rank is not None and axes == [rank - 1]):
        return None
    return f"{node_label(node)} reduces axes {axes}, not only the last axis."
