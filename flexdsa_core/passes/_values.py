"""Small helpers the generic passes share: reading small constants without touching large (possibly
external, memory-mapped) tensors, and shape arithmetic under ONNX broadcasting."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

# Rewrites inspect constants element by element; anything bigger is left alone rather than loaded.
MAX_INSPECTED_ELEMENTS = 1 << 16


def small_constant(value: ir.Value | None, max_elements: int = MAX_INSPECTED_ELEMENTS) -> np.ndarray | None:
    """The value's constant as numpy when it is an initializer (not also a graph input) or a Constant
    node's output, of at most ``max_elements`` elements; None otherwise. The size is checked before any data is read."""
    if value is None or value.is_graph_input():
        return None
    tensor = value.const_value
    if tensor is None:
        producer = value.producer()
        if producer is None or producer.op_type != "Constant" or producer.domain != "":
            return None
        tensor = ir.convenience.get_const_tensor(value, propagate_shape_type=False)
    if tensor is None or tensor.size > max_elements:
        return None
    try:
        return tensor.numpy()
    except Exception:  # missing external file, unsupported dtype: treat as not constant
        return None


def dims(value: ir.Value | None) -> tuple[int | ir.SymbolicDim, ...] | None:
    if value is None or value.shape is None:
        return None
    return tuple(value.shape.dims)


def broadcast_keeps_shape(x_dims: tuple, other_shape: tuple[int, ...]) -> bool:
    """True when broadcasting a tensor of shape ``x_dims`` with one of ``other_shape`` yields ``x_dims``
    again: ``other`` has no more dims than ``x`` and each of its dims is 1 or equals x's (static) dim."""
    if len(other_shape) > len(x_dims):
        return False
    for x_dim, other_dim in zip(reversed(x_dims), reversed(other_shape), strict=False):
        if other_dim == 1:
            continue
        if not (isinstance(x_dim, int) and x_dim == other_dim):
            return False
    return True


def is_float(dtype: ir.DataType | None) -> bool:
    return dtype is not None and dtype.is_floating_point()
