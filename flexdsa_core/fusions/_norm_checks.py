"""Checks shared by the normalisation rules: a ReduceMean's axes in both forms (an ``axes`` attribute
before opset 18, an input from 18), and the 1-D scale/bias vectors the fused ops take."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from flexdsa_core._libraries import get_numpy_value


def reduce_axes(node: ir.Node) -> list[int] | None:
    """The reduced axes as a list, or None when they are not known constants (or reduce everything)."""
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = get_numpy_value(node.inputs[1])
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


def vector_refusal(name: str, value: ir.Value, x: ir.Value) -> str | None:
    """None when ``value`` is a 1-D tensor of ``x``'s dtype as long as its last axis, else why not."""
    if value.shape is None or value.shape.rank() != 1:
        return f"The {name} '{value.name}' is not known to be a 1-D tensor."
    last = x.shape[-1] if x.shape is not None and x.shape.rank() else None
    if isinstance(last, int) and value.shape[0] != last:
        return f"The {name} '{value.name}' has {value.shape[0]} elements, the normalised axis {last}."
    if value.dtype != x.dtype:
        return f"The {name} '{value.name}' is {value.dtype}, the input {x.dtype}."
    return None


def ones_scale(context, x: ir.Value) -> tuple[str, np.ndarray] | str:
    """For a normalisation matched without its scale: the name and value of a scale of ones, or why not.

    Refuses when the normalised value is multiplied next by a 1-D tensor: that is the scale, and the
    scaled form of the rule, which meets it later in the graph, takes the whole."""
    last = x.shape[-1] if x.shape is not None and x.shape.rank() else None
    if not isinstance(last, int):
        return f"The normalised axis of '{x.name}' has no known size for a scale of ones."
    normalized = context.root.outputs[0]
    consumers = [node for node, _ in normalized.uses()]
    if len(consumers) == 1 and consumers[0].op_type == "Mul" and not normalized.is_graph_output():
        other = [v for v in consumers[0].inputs if v is not normalized]
        if other and other[0] is not None and other[0].shape is not None and other[0].shape.rank() == 1:
            return "The normalised value is scaled next; the scaled form of the rule takes it."
    return f"{normalized.name}__scale", np.ones(last, dtype=x.dtype.numpy())
