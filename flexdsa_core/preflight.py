"""User mistakes refused before any work: one registry of switchable names, and a dry shape check per bucket.

* ``switchable_names(target)``: every name ``disabled_rules`` accepts for a target, by kind: the generic
  passes, the fusion rules, and the target adapter's own rewrites. The optimizer, the API's
  ``GET /targets/{name}``, the service's submit path and the CLI all read this one function.
* ``check_disabled``: unknown names are an ``InvalidOptionsError`` naming them and listing the known ones.
* ``check_buckets``: a shape bucket the model cannot run (``seq 128`` on a model with 64 positions) is an
  ``InvalidOptionsError`` naming the bucket. The check is ONNX Runtime's own: the Shape Tracker's
  specialisation of the bucket (dims bound, shape arithmetic and small constants folded) is loaded (``ORT_ENABLE_BASIC``:
  shape inference and constant folding, so a position table sliced past its end meets the activations
  it is added to). Nothing is run, so a data-dependent failure (an index out of range) still shows only
  in validation.
* ``check_request``: both, and a precision the target cannot have, for a model file and a request, as the
  service does before queuing a job.
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx
import onnx_ir as ir

from flexdsa_core.errors import InvalidOptionsError
from flexdsa_core.options import OptimizeOptions
from flexdsa_core.targets import TargetSpec, load_target
from flexdsa_core.wire import weightless_model

__all__ = ["check_buckets", "check_disabled", "check_request", "read_weightless", "switchable_names"]

# Above this the dry load would copy the weights into one protobuf: the check is skipped, not risked.
_DRY_LOAD_LIMIT_BYTES = 512 * 1024 * 1024
# Constant sub-graphs the dry check folds: tables of positions and masks, not weights.
_FOLD_BYTES = 1024 * 1024
# Where ``read_weightless`` declares the initializers it leaves out; nothing ever opens it.
_DECLARED = "flexdsa-declared-not-read"


def switchable_names(target: TargetSpec | str) -> dict[str, list[str]]:
    """Every name ``disabled_rules`` accepts on ``target``: ``passes``, ``fusions`` and ``target`` rewrites,
    exactly the target's ``registry.Registry``."""
    from flexdsa_core.registry import Registry

    return Registry(target).names()


def check_disabled(names: Sequence[str], target: TargetSpec | str) -> None:
    spec = load_target(target) if isinstance(target, str) else target
    known = {name for names_of_kind in switchable_names(spec).values() for name in names_of_kind}
    unknown = sorted(set(names) - known)
    if unknown:
        raise InvalidOptionsError(
            f"disabled_rules names unknown rewrites: {', '.join(unknown)}. "
            f"Known for target {spec.name!r}: {', '.join(sorted(known))}.",
            details={"unknown_rules": unknown},
        )


def check_buckets(tracker, buckets) -> None:
    """Refuse the first bucket ONNX Runtime cannot load the model at (see the module docstring), naming the
    model's limit where a smaller value of one dim loads ("this model takes at most 64 positions")."""
    for bucket in buckets:
        if not bucket.dims:
            continue
        reason = _dry_load_refusal(tracker, tracker.specialize(bucket))
        if reason is None:
            continue
        dims = ", ".join(f"{name}={value}" for name, value in bucket.dims.items())
        limit = _limit_text(tracker, bucket)
        raise InvalidOptionsError(
            f"shape bucket {bucket.name!r} ({dims}) cannot run on this model: "
            + (f"{limit[0]} ({reason[:300]}). Choose {limit[1]} in shape_buckets." if limit else
               f"{reason[:300]}. Choose smaller values in shape_buckets (or input_shapes), within what the model "
               "supports."),
            details={"bucket": bucket.name, "dims": dict(bucket.dims), "reason": reason[:300],
                     **({"limit": limit[2]} if limit else {})},
        )  # fmt: skip


def _limit_text(tracker, bucket) -> tuple[str, str, dict] | None:
    """("this model takes at most 64 positions", "seq <= 64", {"dim": "seq", "max": 64}) for the first dim
    of ``bucket`` whose value the model refuses while a smaller one loads (binary search over dry loads)."""
    for name, value in bucket.dims.items():
        if value <= 1 or tracker.dim_kind(name) == "batch":
            continue
        def loads(candidate: int, name: str = name) -> bool:
            return _dry_load_refusal(tracker, tracker.specialize_at({**bucket.dims, name: candidate})) is None

        if not loads(1):
            continue
        low, high = 1, value  # loads(low), not loads(high)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if loads(middle) else (low, middle)
        what = "positions" if tracker.dim_kind(name) == "sequence" else f"for dim {name!r}"
        return f"this model takes at most {low} {what}", f"{name} <= {low}", {"dim": name, "max": low}
    return None


# A dim is probed up to this value: a model that loads there is taken to have no limit of its own in that dim.
LIMIT_PROBE = 1 << 16


def model_limits(tracker, buckets, loading: Mapping[str, int] | None = None) -> dict[str, int]:
    """The largest value of each dynamic dim (batch dims aside) at which ONNX Runtime still loads the model,
    for the dims where it has one (``seq`` of a model with a 64-row position table: 64); dims that load at
    ``LIMIT_PROBE`` are left out. What the runtime refuses a request by, naming the limit, before any backend
    is called. Probed on the model without its weights (large initializers as inputs of the same shape: a
    load checks shapes and needs no values) with its inputs' dims bound, at ORT_ENABLE_BASIC (ONNX Runtime's
    own shape inference and constant folding), other dims at the first bucket's values. ``loading``: values
    known to load (the shape plan's representative ones); with those, one or two loads (tens of ms each)
    where the limit is the largest of them or there is none, a bisection otherwise."""
    from flexdsa_core.serialized import weightless_proto

    names = [d for d in tracker.infer().dims if tracker.dim_kind(d) != "batch"]
    if not names:
        return {}
    light = weightless_proto(tracker.model, constants=True)
    base = {d: 1 for d in tracker.infer().dims} | (dict(buckets[0].dims) if buckets else {})
    limits = {}
    for name in names:
        def loads(value: int, name: str = name) -> bool:
            return _bound_load_refusal(light, {**base, name: value}) is None

        from_buckets = [b.dims[name] for b in buckets if name in b.dims]  # each loaded in check_buckets
        low = max(from_buckets, default=(loading or {}).get(name, 1))
        if loads(LIMIT_PROBE) or not (from_buckets or loads(low)):
            continue  # no limit; or the starting value does not load with the other dims here: nothing to say
        high = LIMIT_PROBE  # loads(low), not loads(high)
        if not loads(low + 1):
            high = low + 1  # the largest bucket is the model's limit (the usual case: no bisection)
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if loads(middle) else (low, middle)
        limits[name] = low
    return limits


def _dry_load_options():
    """ONNX Runtime's options for a load that only asks whether the model loads: its shape inference and
    constant folding (``ORT_ENABLE_BASIC``), folding only what ``_FOLD_BYTES`` allows, as the pipeline folds.
    Unbounded, a probe at ``LIMIT_PROBE`` materialised whatever the bound dims size (a ConstantOfShape
    expanded over 65,536 rows: 20 MiB, the peak of a small model's whole job) to answer a question about
    shapes."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.log_severity_level = 4
    options.add_session_config_entry("optimization.constant_folding_max_output_size_in_bytes", str(_FOLD_BYTES))
    return options


def _bound_load_refusal(proto: onnx.ModelProto, dims: dict[str, int]) -> str | None:
    """Why ONNX Runtime refuses ``proto`` with its inputs' named dims bound to ``dims``, or None."""
    import onnxruntime as ort

    bound = onnx.ModelProto()
    bound.CopyFrom(proto)
    for value in bound.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param in dims:
                dim.dim_value = dims[dim.dim_param]
    try:
        ort.InferenceSession(bound.SerializeToString(), _dry_load_options(), providers=["CPUExecutionProvider"])
    except Exception as error:  # noqa: BLE001 - any refusal at these shapes is the answer
        return str(error).splitlines()[0]
    return None


def _dry_load_refusal(tracker, model) -> str | None:
    """Why ONNX Runtime refuses to load ``model`` (a specialisation of ``tracker``'s model), or None."""
    from flexdsa_core.in_memory import InMemoryModel
    from flexdsa_core.passes import run_passes
    from flexdsa_core.passes.folding import ConstantFoldingPass, ShapeFoldingPass
    from flexdsa_core.passes.partial_shapes import PartialShapeFoldingPass

    # What the bucket's dims decide, folded as the pipeline will: the ends of a Slice of a position
    # table become constants, so ONNX Runtime sees the table's real length.
    run_passes(model, [ShapeFoldingPass(), PartialShapeFoldingPass(), ConstantFoldingPass(_FOLD_BYTES)])
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for value in node.outputs:
            if not value.is_graph_output():
                value.shape = None
    weights = sum(
        v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None
    )
    if weights > _DRY_LOAD_LIMIT_BYTES:
        return None
    try:
        # The weights from memory (``in_memory``), as the other sessions read them: serialised into a protobuf,
        # they were there three times at once (the message, its bytes, ONNX Runtime's copy).
        InMemoryModel.from_ir(model, finished=False).session(_dry_load_options())
    except Exception as error:  # noqa: BLE001 - any refusal at these shapes is the answer
        reason = str(error).splitlines()[0]
        return re.sub(r"^\[ONNXRuntimeError\] : \d+ : [A-Z_]+ : ", "", reason)
    return None


def check_request(
    model: str | os.PathLike | bytes | ir.Model | onnx.ModelProto, options: OptimizeOptions, target: TargetSpec,
    has_samples: bool | None = None,
) -> None:
    """``check_disabled``, the precision (and, with ``has_samples`` known, whether an int8-only target has
    calibration samples), metrics naming outputs the model lacks, and, where ``shape_buckets`` are given,
    ``check_buckets``: before any work. ``model`` may be ``read_weightless``'s protobuf."""
    from flexdsa_core.accuracy import check_outputs
    from flexdsa_core.precision import check_calibration_source, check_precision_request
    from flexdsa_core.shape_tracker import ShapeTracker

    check_disabled(options.disabled_rules, target)
    check_precision_request(options, target)  # fp16 on cpu-ort: refused before queuing
    if has_samples is not None:  # the KV260 without samples: refused before queuing, naming the fix
        check_calibration_source(options, target, has_samples)
    if options.accuracy.outputs or options.accuracy.top1_outputs:
        check_outputs(options.accuracy, _graph_outputs(model))
    if not options.shape_buckets:
        return
    if isinstance(model, bytes):
        model = ir.from_proto(onnx.load_from_string(model))
    elif isinstance(model, onnx.ModelProto):
        model = _declared_as_inputs(ir.from_proto(model))
    elif not isinstance(model, ir.Model):
        model = ir.load(Path(model))
    tracker = ShapeTracker(model, input_shapes=options.input_shapes)
    tracker.infer()
    check_buckets(tracker, tracker.buckets(options.shape_buckets, target))


def read_weightless(path: str | os.PathLike) -> onnx.ModelProto:
    """The model file at ``path`` with each initializer over ``_FOLD_BYTES`` declared (name, type, shape) and
    its values never read: the graph, the inputs and the tables' shapes are what the checks before queuing
    need, and a service checking a 256 MiB upload against several targets holds a few hundred KB, not the
    weights once per target. The file is read through a memory map, field by field (``wire``)."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        data, _declared = weightless_model(buf, _FOLD_BYTES, _DECLARED)
    from flexdsa_core.ingest import parse_model_bytes

    return parse_model_bytes(data, what="The upload")


def _declared_as_inputs(model: ir.Model) -> ir.Model:
    """``read_weightless``'s declared initializers as graph inputs of their type and shape: ONNX Runtime
    loads the graph without their values, and shape inference sees the same static shapes."""
    for name, value in list(model.graph.initializers.items()):
        tensor = value.const_value
        if isinstance(tensor, ir.ExternalTensor) and tensor.location == _DECLARED:
            model.graph.initializers.pop(name)
            value.const_value = None
            value.type, value.shape = ir.TensorType(tensor.dtype), ir.Shape(tensor.shape)
            if value not in model.graph.inputs:
                model.graph.inputs.append(value)
    return model


def _graph_outputs(model) -> dict[str, list | None]:
    """Output name -> dims (ints or names) of a model file, bytes or IR, its weights left unread where they are
    external."""
    if isinstance(model, ir.Model):
        return {v.name: None if v.shape is None else [d if isinstance(d, int) else str(d) for d in v.shape]
                for v in model.graph.outputs}  # fmt: skip
    if isinstance(model, onnx.ModelProto):
        proto = model
    elif isinstance(model, bytes):
        proto = onnx.load_from_string(model)
    else:
        proto = onnx.load(str(model), load_external_data=False)
    return {
        value.name: [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
                     for d in value.type.tensor_type.shape.dim] if value.type.tensor_type.HasField("shape") else None
        for value in proto.graph.output
    }  # fmt: skip


# No single tensor of a model this service takes may need more than this: beyond it a run cannot allocate
# on any machine we run on, and ONNX Runtime would only fail deep inside (or the host would swap).
MAX_TENSOR_BYTES = 16 << 30


def refuse_impossible_tensors(model: ir.Model, limit_bytes: int = MAX_TENSOR_BYTES) -> None:
    """``UnsupportedModelError`` naming the first value that needs more than ``limit_bytes``, before any
    run allocates it: from its inferred static shape, or, where inference leaves it open, from the constant
    shape input of ``ConstantOfShape``/``Expand`` (e.g. a 10^12-element Expand)."""
    from flexdsa_core.errors import UnsupportedModelError

    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for value in node.outputs:
            dims = _static_dims(value) or _constant_shape_dims(node)
            if dims is None:
                continue
            elements = 1
            for dim in dims:
                elements *= max(int(dim), 0)
            itemsize = value.dtype.itemsize if value.dtype is not None else 4
            size = int(elements * max(1, itemsize))
            if size > limit_bytes:
                raise UnsupportedModelError(
                    f"{node.op_type} output {value.name!r} would have shape {dims} ({elements:.3g} elements, "
                    f"{size / 2**30:,.0f} GiB): no run can allocate it (limit {limit_bytes / 2**30:.0f} GiB per "
                    f"tensor). "
                    + (f"Check the shape input of this {node.op_type}." if node.op_type in ("ConstantOfShape", "Expand")
                       else "Give shape_buckets or input_shapes that fix smaller dims."),
                    details={"node": node.name, "value": value.name, "bytes": size, "limit_bytes": limit_bytes},
                )


def _static_dims(value: ir.Value) -> list[int] | None:
    if value.shape is None or not value.shape.is_static():
        return None
    return [int(d) for d in value.shape]


def _constant_shape_dims(node: ir.Node) -> list[int] | None:
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("ConstantOfShape", "Expand"):
        return None
    shape_input = node.inputs[0] if node.op_type == "ConstantOfShape" else node.inputs[1] if len(node.inputs) > 1 else None
    if shape_input is None or shape_input.const_value is None:
        return None
    try:
        dims = [int(d) for d in shape_input.const_value.numpy().reshape(-1)]
    except Exception:  # noqa: BLE001 - an unreadable constant is for the checker to report, not us
        return None
    if node.op_type == "Expand" and node.inputs[0] is not None:
        known = _static_dims(node.inputs[0]) or []
        width = max(len(dims), len(known))
        dims = [1] * (width - len(dims)) + dims
        known = [1] * (width - len(known)) + known
        dims = [max(a, b) for a, b in zip(dims, known, strict=True)]
    return dims
