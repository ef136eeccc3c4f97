"""Representative sizes for dynamic dims, and the memory budget they must respect: the Shape Tracker's plan.

Every stage that needs a concrete value for a dim the request left open (the cost model's kernels and
probes, the memory plan, validation, the default buckets of a static-shape target) reads it from here, so
no stage guesses shapes of its own.

* **Kind of a dim** (``dim_kind``), from its name first, then from where it sits:
  ``batch`` (``batch``, ``batch_size``, ``N``, ``B``..., or an exporter's anonymous name on axis 0:
  ``unk__214``, ``p2o.DynamicDimension.0``, ``x_dim0``); ``spatial`` (``height``, ``width``, ``H``,
  ``W``..., or an anonymous name on axis 2 or 3 of a 4-D float input); ``sequence`` (``seq``,
  ``sequence_length``, ``T``, ``L``, ``frames``...); anything else is ``other``.
* **Value**: batch 1; every other kind ``REPRESENTATIVE_DIM`` (128), then the candidates of
  ``CANDIDATES`` (smaller first: a 64-row position table; then larger: an STFT that needs 256 samples)
  until the model runs there (``ShapeTracker`` asks ONNX Runtime). A dim the plan does not hold (a value
  inside the graph that shape inference named, a model costed without a plan) takes ``open_dim_value``: 1
  for a batch dim, else the representative size. Where a model refuses a shape after all (a probe of some of
  its nodes, the original model in validation), every dim but the batch ones steps down ``LOWERED``
  (``lowered``): the cost model and validation step down the same ladder.
* **Memory budget**: ``memory_budget(model_bytes, machine_bytes)`` =
  ``clamp(4 x model size, 64 MiB, machine memory / 16)``. At the chosen values no single tensor the model
  makes may exceed it (``static_shapes``: ONNX shape inference on a copy without weights, nothing
  allocated); past it, the largest non-batch dims are halved (down to 8) and the report says so. Shape
  probes and folds that would allocate more than the budget are skipped with a reason (``CostModel``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from flexdsa_core.dims import is_batch_dim

__all__ = [
    "CANDIDATES",
    "LOWERED",
    "REPRESENTATIVE_BATCH",
    "REPRESENTATIVE_DIM",
    "ShapePlan",
    "dim_kind",
    "is_anonymous_dim",
    "lowered",
    "machine_memory_bytes",
    "memory_budget",
    "open_dim_value",
    "static_shapes",
]

REPRESENTATIVE_BATCH = 1
REPRESENTATIVE_DIM = 128
# The ceilings, largest first, that every dim but the batch ones is held to when a model refuses the shape it
# was given (a 64-row position table caps a sequence at 64).
LOWERED = (64, 32, 16, 8)
# Values tried, in order, when the model does not run at the one before (smaller first: a position table
# caps a sequence; then larger: a window or an STFT needs a minimum length).
CANDIDATES = {
    "batch": (REPRESENTATIVE_BATCH,),
    "sequence": (REPRESENTATIVE_DIM, *LOWERED, 256, 512),
    "spatial": (REPRESENTATIVE_DIM, 64, 32, 256),
    "other": (REPRESENTATIVE_DIM, *LOWERED, 256, 512),
}
MIN_BUDGET_BYTES = 64 << 20
MIN_HALVED_DIM = 8

# Names exporters give dims they know nothing about, and this project's own ``<input>_dim<axis>``.
_ANONYMOUS = re.compile(r"^(unk__\d+|p2o\.DynamicDimension\.\d+|\?|-1|none|dim_?\d+|.*_dim\d+(_\d+)?|)$", re.I)
_SPATIAL = re.compile(r"^(h|w|height|width|img_?h|img_?w|image_?height|image_?width|.*_(height|width))$", re.I)
_SEQUENCE = re.compile(
    r"^(t|l|s|seq|seq_?len|sequence|sequence_?length|.*_sequence_length|length|len|time|frames|num_frames|"
    r"tokens|num_tokens|positions|steps|total_sequence_length|past_sequence_length|.*seq.*)$",
    re.I,
)


def is_anonymous_dim(name: str | None) -> bool:
    """Whether ``name`` is a placeholder (``unk__3``, ``?``, ``p2o.DynamicDimension.0``) rather than a meaning."""
    return name is None or bool(_ANONYMOUS.match(str(name)))


def dim_kind(name: str, where: Sequence[tuple[int, int, str | None]]) -> str:
    """``batch``, ``spatial``, ``sequence`` or ``other`` for dim ``name``; ``where`` holds, per place it
    appears on an input, (axis, rank of that input, its element type name)."""
    if is_batch_dim(name):
        return "batch"
    if _SPATIAL.match(name):
        return "spatial"
    if _SEQUENCE.match(name):
        return "sequence"
    if is_anonymous_dim(name) and where:
        if all(axis == 0 for axis, _, _ in where):
            return "batch"
        if all(rank == 4 and axis in (2, 3) and (dtype or "").startswith("float") for axis, rank, dtype in where):
            return "spatial"
    return "other"


def open_dim_value(name: str | None, axis: int | None = None, *, size: int = REPRESENTATIVE_DIM) -> int:
    """The value of a dim no plan or bucket sizes: ``REPRESENTATIVE_BATCH`` for a batch dim (``dim_kind``: by
    its name, or an anonymous one on axis 0 when ``axis`` is known), else ``size`` (``REPRESENTATIVE_DIM``, or
    the ceiling of ``LOWERED`` a model that refused it was lowered to)."""
    where = [(axis, 0, None)] if axis is not None else []
    return REPRESENTATIVE_BATCH if dim_kind(name or "", where) == "batch" else size


def lowered(dims: Mapping[str, int], ceiling: int) -> dict[str, int]:
    """``dims`` with every dim but the batch ones held to at most ``ceiling`` (one step of ``LOWERED``): the
    shape tried next where a model refused ``dims``."""
    return {name: value if is_batch_dim(name) else min(value, ceiling) for name, value in dims.items()}


def machine_memory_bytes() -> int | None:
    """Physical memory of this machine, or None where the platform does not say."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def memory_budget(model_bytes: int, machine_bytes: int | None = None) -> tuple[int, str]:
    """(bytes one intermediate tensor may take, how that was decided): see the module docstring."""
    machine = machine_bytes if machine_bytes is not None else machine_memory_bytes()
    budget = max(4 * model_bytes, MIN_BUDGET_BYTES)
    basis = f"4 x the model's {model_bytes / 2**20:.1f} MiB of weights, at least {MIN_BUDGET_BYTES >> 20} MiB"
    if machine:
        cap = machine // 16
        if budget > cap:
            budget = cap
            basis += f", at most 1/16 of this machine's {machine / 2**30:.1f} GiB"
    return int(budget), basis


def weight_bytes(model: ir.Model) -> int:
    """Bytes of the model's weights: initializers (external data counted from shapes, never loaded) and the
    tensors of ``Constant`` nodes (paddle2onnx writes its weights so)."""
    total = 0
    constants = (
        node.attributes["value"].value
        for node in model.graph
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and "value" in node.attributes
    )
    for tensor in (*(v.const_value for v in model.graph.initializers.values()), *constants):
        if tensor is None or not hasattr(tensor, "shape"):
            continue
        try:
            total += int(math.prod(int(d) for d in tensor.shape) * tensor.dtype.itemsize)
        except (TypeError, ValueError):
            continue
    return total


# Constants up to this size keep their values in the weightless copy: shape inference reads shapes,
# axes and small tables from them.
_KEEP_CONSTANT_BYTES = 4096


def static_shapes(
    model: ir.Model | ir.Graph, dims: Mapping[str, int]
) -> dict[str, tuple[tuple[int, ...], str]]:
    """Value name -> (static shape, numpy dtype name) for every tensor of ``model``'s main graph that ONNX
    shape inference sizes once the input dims in ``dims`` are bound. Nothing is allocated: the copy holds
    no weights beyond small constants (large initializers become typed graph inputs)."""
    source = model.graph if isinstance(model, ir.Model) else model
    proto = onnx.ModelProto()
    proto.ir_version = max(model.ir_version or 8, 8) if isinstance(model, ir.Model) else 10
    for domain, version in source.opset_imports.items():
        proto.opset_import.append(onnx.helper.make_opsetid(domain, version))
    if isinstance(model, ir.Model):
        for function in model.functions.values():
            proto.functions.append(ir.serde.serialize_function(function))
    graph = proto.graph
    model = source
    for value in model.inputs:
        if value.is_initializer():
            continue
        info = ir.serde.serialize_value(value)
        for dim in info.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in dims:
                dim.dim_value = int(dims[dim.dim_param])
        graph.input.append(info)
    for name, value in model.initializers.items():
        tensor = value.const_value
        if tensor is not None and tensor.nbytes <= _KEEP_CONSTANT_BYTES:
            graph.initializer.append(ir.serde.serialize_tensor(tensor))
            graph.initializer[-1].name = name
        else:
            graph.input.append(ir.serde.serialize_value(value))
    for node in model:
        large = _large_constant(node)
        if large is not None:  # a weight written as a Constant node (paddle2onnx): its typed shape, not its bytes
            graph.input.append(large)
            continue
        graph.node.append(ir.serde.serialize_node(node))
    for value in model.outputs:
        out = onnx.ValueInfoProto()
        out.name = value.name
        graph.output.append(out)
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is best effort: what it cannot size stays unknown
        return {}
    found: dict[str, tuple[tuple[int, ...], str]] = {}
    for info in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]:
        tensor_type = info.type.tensor_type
        if not tensor_type.HasField("shape") or not tensor_type.elem_type:
            continue
        shape = []
        for dim in tensor_type.shape.dim:
            if not dim.HasField("dim_value") or dim.dim_value < 0:
                break
            shape.append(int(dim.dim_value))
        else:
            try:
                dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)).name
            except (KeyError, TypeError, ValueError):
                continue
            found[info.name] = (tuple(shape), dtype)
    return found


def _large_constant(node: ir.Node) -> onnx.ValueInfoProto | None:
    """A typed graph input standing for ``node``'s output where ``node`` is a ``Constant`` whose tensor is
    larger than ``_KEEP_CONSTANT_BYTES`` (None otherwise): shape inference reads such a tensor's shape and
    type only, like a large initializer's, so its bytes need not be copied into the proto (PP-OCRv4 rec:
    10 MiB of weights, copied and re-parsed on every call)."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.outputs) != 1:
        return None
    attribute = node.attributes.get("value")
    tensor = attribute.value if attribute is not None else None
    if tensor is None or not hasattr(tensor, "nbytes") or tensor.nbytes <= _KEEP_CONSTANT_BYTES:
        return None
    return onnx.helper.make_tensor_value_info(
        node.outputs[0].name, int(tensor.dtype), [int(d) for d in tensor.shape]
    )


def largest_tensor(shapes: Mapping[str, tuple[tuple[int, ...], str]], skip: set[str] = frozenset()) -> tuple[str | None, int]:
    """(name, bytes) of the largest tensor in ``shapes`` (``skip``: names not to count, e.g. weights)."""
    best: tuple[str | None, int] = (None, 0)
    for name, (shape, dtype) in shapes.items():
        if name in skip:
            continue
        size = math.prod(shape) * np.dtype(dtype).itemsize
        if size > best[1]:
            best = (name, size)
    return best


@dataclass
class ShapePlan:
    """The value each open dim takes, its kind and why, and the budget they were held to."""

    dims: dict[str, int] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    budget_bytes: int = 0
    budget_basis: str = ""
    largest_tensor: str | None = None
    largest_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dims": {
                name: {"value": value, "kind": self.kinds.get(name), "why": self.why.get(name)}
                for name, value in self.dims.items()
            },
            "memory_budget_bytes": self.budget_bytes,
            "memory_budget_basis": self.budget_basis,
            "largest_tensor": (
                {"name": self.largest_tensor, "bytes": self.largest_bytes} if self.largest_tensor else None
            ),
            "notes": self.notes,
        }
