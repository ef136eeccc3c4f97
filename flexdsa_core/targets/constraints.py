"""The generic checker of ``TargetSpec.op_constraints``: why a node in the op table still cannot run.

Each constraint is one short function registered by key (``@constraint("kernel_max")``) that reads the
node and returns a plain sentence when the node breaks the limit, or None. The spec says, per op key
(``"*"`` for every op), which limits hold on the part and where they come from::

    "Conv": {"kernel_max": 31, "stride_max": 7, "pads_max": 15, "dilation_max": 31,
             "depthwise_kernel_max": 8, "source": "R2"}

Shapes are read from the (specialised, static) graph; a limit whose quantity is unknown (a symbolic
dim) is not judged here: the static-shape check of the accelerator adapter speaks for it.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx
import onnx_ir as ir

Check = Callable[[ir.Node, object], str | None]
_CHECKS: dict[str, Check] = {}


def constraint(key: str):
    def register(function: Check) -> Check:
        _CHECKS[key] = function
        return function

    return register


def known_keys() -> frozenset[str]:
    # over_limit: "split" = the vendor compiler splits a node over these limits into several accelerator ops.
    return frozenset(_CHECKS) | {"source", "note", "over_limit"}


def violations(node: ir.Node, limits: dict) -> list[str]:
    """Every limit in ``limits`` that ``node`` breaks, as sentences (the source cited once, at the end)."""
    found = []
    for key, limit in limits.items():
        check = _CHECKS.get(key)
        if check is None:
            continue
        reason = check(node, limit)
        if reason:
            found.append(reason)
    return found


# ---- attribute access, with the ONNX defaults a missing attribute stands for -----------------------


def _ints(node: ir.Node, name: str) -> list[int] | None:
    attr = node.attributes.get(name)
    if attr is None:
        return None
    value = attr.value
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _default(node: ir.Node, name: str):
    try:
        schema = onnx.defs.get_schema(node.op_type, domain=node.domain or "")
    except onnx.defs.SchemaError:
        return None
    attr = schema.attributes.get(name)
    if attr is None or not attr.default_value.name:
        return None
    value = onnx.helper.get_attribute_value(attr.default_value)
    return value.decode() if isinstance(value, bytes) else value


def _attr(node: ir.Node, name: str):
    attr = node.attributes.get(name)
    if attr is None:
        return _default(node, name)
    value = attr.value
    if isinstance(value, bytes):
        return value.decode()
    return value


def _kernel(node: ir.Node) -> list[int] | None:
    kernel = _ints(node, "kernel_shape")
    if kernel is not None:
        return kernel
    if len(node.inputs) > 1 and node.inputs[1] is not None and node.inputs[1].shape is not None:
        dims = list(node.inputs[1].shape)[2:]
        if all(isinstance(d, int) for d in dims):
            return dims
    return None


def _is_depthwise(node: ir.Node) -> bool:
    group = _attr(node, "group") or 1
    data = node.inputs[0] if node.inputs else None
    if group == 1 or data is None or data.shape is None or len(data.shape) < 2:
        return False
    return data.shape[1] == group


def _shape(value: ir.Value | None) -> list | None:
    return None if value is None or value.shape is None else list(value.shape)


# ---- the constraints -------------------------------------------------------------------------------


@constraint("kernel_max")
def _kernel_max(node, limit):
    kernel = _kernel(node)
    if kernel and not (node.op_type == "Conv" and _is_depthwise(node)) and max(kernel) > limit:
        return f"kernel {'x'.join(map(str, kernel))} exceeds the limit of {limit}"
    return None


@constraint("depthwise_kernel_max")
def _depthwise_kernel_max(node, limit):
    kernel = _kernel(node)
    if kernel and _is_depthwise(node) and max(kernel) > limit:
        return f"depthwise kernel {'x'.join(map(str, kernel))} exceeds the limit of {limit}"
    return None


@constraint("stride_max")
def _stride_max(node, limit):
    strides = _ints(node, "strides")
    if strides and max(strides) > limit:
        return f"stride {max(strides)} exceeds the limit of {limit}"
    return None


@constraint("pads_max")
def _pads_max(node, limit):
    pads = _ints(node, "pads")
    if pads and max(pads) > limit:
        return f"padding {max(pads)} exceeds the limit of {limit}"
    return None


@constraint("dilation_max")
def _dilation_max(node, limit):
    dilations = _ints(node, "dilations")
    if dilations and max(dilations) > limit:
        return f"dilation {max(dilations)} exceeds the limit of {limit}"
    return None


@constraint("batch_max")
def _batch_max(node, limit):
    shape = _shape(node.inputs[0] if node.inputs else None)
    if shape and isinstance(shape[0], int) and shape[0] > limit:
        return f"batch {shape[0]} exceeds the supported batch of {limit}"
    return None


@constraint("rank_max")
def _rank_max(node, limit):
    shape = _shape(node.inputs[0] if node.inputs else None)
    if shape is not None and len(shape) > limit:
        return f"rank {len(shape)} exceeds the supported rank of {limit}"
    return None


@constraint("dim_max")
def _dim_max(node, limit):
    for value in (*node.inputs, *node.outputs):
        shape = _shape(value)
        if value is None or value.const_value is not None or not shape:
            continue
        largest = max((d for d in shape if isinstance(d, int)), default=0)
        if largest > limit:
            return f"dimension {largest} of {value.name!r} exceeds the limit of {limit}"
    return None


@constraint("elements_max")
def _elements_max(node, limit):
    shape = _shape(node.inputs[0] if node.inputs else None)
    if shape and all(isinstance(d, int) for d in shape):
        elements = 1
        for d in shape:
            elements *= d
        if elements > limit:
            return f"{elements} elements exceed the limit of {limit}"
    return None


@constraint("attr_in")
def _attr_in(node, allowed: dict):
    for name, values in allowed.items():
        value = _attr(node, name)
        if value is not None and value not in values:
            return f"{name}={value!r} is not supported (only {', '.join(map(repr, values))})"
    return None


@constraint("const_inputs")
def _const_inputs(node, indices: list[int]):
    for index in indices:
        if index < len(node.inputs) and node.inputs[index] is not None:
            value = node.inputs[index]
            if value.const_value is None and not _is_constant_output(value):
                return f"input {index} ({value.name!r}) must be a constant"
    return None


@constraint("dtypes")
def _dtypes(node, allowed: list[str]):
    for value in node.inputs:
        if value is None or value.dtype is None:
            continue
        try:
            name = value.dtype.numpy().name
        except (TypeError, ValueError):
            name = str(value.dtype)
        if name not in allowed:
            return f"input {value.name!r} has dtype {name}, supported: {', '.join(allowed)}"
    return None


def _is_constant_output(value: ir.Value) -> bool:
    producer = value.producer()
    return producer is not None and producer.op_type == "Constant" and producer.domain in ("", "ai.onnx")
