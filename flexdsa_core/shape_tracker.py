"""The Shape Tracker: symbolic shapes with named dims, shape buckets, and specialisation.

1. ``infer``: ONNX shape inference with data propagation (through ``onnx_ir``'s ``ShapeInferencePass``)
   carries the graph inputs' named dims (``batch``, ``seq`` ...) through the graph. An input dim with no
   name gets a fresh one (``<input>_dim<axis>``) so that it can be bucketed; what stays unknown is listed
   with the op that produced it. Where ONNX's data propagation loses a dim (``Slice(table, 0, seq)``
   becomes ``[unk__0, 8]``), onnxruntime's sympy-based symbolic inference is asked for those tensors only.
2. ``buckets``: the values each dynamic dim is specialised to, per dim: the request's ``shape_buckets``,
   else the calibration samples' own value of the dim (``samples``: a dim the target would otherwise default,
   axis 0 aside, where every sample has one size), else the target's ``default_shape_buckets`` (its ``batch``/``seq`` entries serve every dim of that kind,
   ``batch_size``, ``sequence_length``...), else on static-shape targets the plan's value; defaults are
   capped by what the model runs (``plan``: ``shape_plan``'s kinds, memory budget and candidates). One bucket
   per combination, named ``batch1_seq128``. A dim nobody bucketed stays symbolic; a model with nothing
   bucketed keeps one bucket, ``dynamic`` (or ``static`` when the model has no dynamic dim). With the
   request's ``observed_shapes`` and no ``shape_buckets``, the observed dims' values come from traffic
   (``traffic_buckets.choose_traffic_buckets``): at most K buckets minimising the traffic's expected
   padded cost.
3. ``specialize``: a copy of the model with the bucket's dims bound everywhere, shapes re-inferred and the
   shape arithmetic (Shape -> Gather -> Concat -> Reshape ...) folded to constants by onnxscript's constant
   folder. Only integer/bool-valued nodes are evaluated here; folding weights is the generic passes' job.
4. ``update``: at run time, the bucket with the fewest padded input elements among those whose every dim
   is >= the runtime dim (padding per input and axis is reported); when none fits, a new bucket for the
   exact shape is specialised, memory-planned and kept.

Over 500 lines (about 1,080) because the four steps share one state, the named dims and
their bindings, and splitting them would pass that state between modules; the traffic-driven bucket choice,
which shares none of it, lives in ``traffic_buckets``.
"""

from __future__ import annotations

import functools
import gc
import itertools
import math
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx
import onnx_ir as ir
from onnx_ir.passes.common import RemoveUnusedNodesPass, ShapeInferencePass

from flexdsa_core._libraries import fold_known_shapes, ort_symbolic_shapes
from flexdsa_core.cost_model import CostModel
from flexdsa_core.dims import is_batch_dim
from flexdsa_core.errors import InvalidOptionsError
from flexdsa_core.kernel_timing import measure_sgemm_peak
from flexdsa_core.options import ObservedShape
from flexdsa_core.shape_plan import (
    CANDIDATES,
    MIN_HALVED_DIM,
    REPRESENTATIVE_BATCH,
    REPRESENTATIVE_DIM,
    ShapePlan,
    dim_kind,
    is_anonymous_dim,
    largest_tensor,
    memory_budget,
    static_shapes,
    weight_bytes,
)
from flexdsa_core.targets.spec import TargetSpec
from flexdsa_core.traffic_buckets import (  # noqa: F401 - re-exported with the tracker
    TrafficChoice,
    choose_traffic_buckets,
    evenly_spaced_buckets,
    optimal_buckets,
)

__all__ = [
    "DYNAMIC_BUCKET",
    "STATIC_BUCKET",
    "Bucket",
    "Selection",
    "ShapeReport",
    "ShapeTracker",
    "TrafficChoice",
    "UnknownShape",
    "apply_input_shapes",
    "choose_traffic_buckets",
    "evenly_spaced_buckets",
    "optimal_buckets",
]

DYNAMIC_BUCKET = "dynamic"
STATIC_BUCKET = "static"
# Combinations beyond this are almost always a mistake in shape_buckets, and each one is a full compile.
MAX_BUCKETS = 64
# Each distinct observed value of a dim costs one specialisation and one graph costing (~0.1 s on a small
# BERT); past this many, rounding the traffic's values (e.g. to multiples of 8) is the better request.
MAX_TRAFFIC_VALUES = 64
# A target default given for "batch"/"seq" applies to every dim of that kind (``batch_size``, ``sequence_length``).
_DEFAULT_KEYS = {"batch": "batch", "sequence": "seq"}
# Above this much weight the run check of ``ShapeTracker.plan`` is not made (it would hold the weights twice).
_RUN_CHECK_MAX_BYTES = 512 << 20
# ONNX shape inference names the dims it cannot relate to any input ``unk__<n>`` (data-dependent sizes).
_ONNX_FRESH_DIM = re.compile(r"^unk__\d+$")

Dim = int | str


def _dim_out(dim: int | ir.SymbolicDim) -> Dim | None:
    """A dim as plain data: an int, a name, or None when unknown."""
    if isinstance(dim, int):
        return dim
    return dim.value


def _shape_out(shape: ir.Shape | None) -> list[Dim | None] | None:
    return None if shape is None else [_dim_out(d) for d in shape.dims]


def _placeholder_dim(dim: int | ir.SymbolicDim) -> bool:
    """An input dim that says only "unknown": unnamed, a negative int, or a placeholder name ('?', '-1')."""
    if isinstance(dim, int):
        return dim < 0
    return dim.value is None or str(dim.value).strip() in ("", "?", "-1", "None")


def _free_symbols(dim: ir.SymbolicDim) -> frozenset[str]:
    """Symbols a dim depends on: itself for a plain name, the free symbols of an expression (``s0 + 1``)."""
    return frozenset() if dim.value is None else _free_symbols_of(dim.value)


@functools.lru_cache(maxsize=4096)
def _free_symbols_of(value: str) -> frozenset[str]:
    """``_free_symbols`` of a dim's text. Remembered by the text: each dim object parses its expression anew,
    and a detector's graph holds the same few expressions on hundreds of values in several copies (PP-OCRv4
    det: 2,031 asks, 0.46 s of parsing, for a few dozen texts)."""
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", value):
        return frozenset([value])
    try:
        return ir.SymbolicDim(value).free_symbols()
    except Exception:  # sympy cannot parse every dim_param a exporter writes; treat it as one opaque name
        return frozenset([value])


def _bind_dim(dim: int | ir.SymbolicDim, bindings: Mapping[str, int | str]) -> int | ir.SymbolicDim:
    """``dim`` with the bound names replaced (by an int or another name); expressions evaluated."""
    if isinstance(dim, int) or dim.value is None:
        return dim
    if dim.value in bindings:
        new = bindings[dim.value]
        return new if isinstance(new, int) else ir.SymbolicDim(new)
    int_bindings = {k: v for k, v in bindings.items() if isinstance(v, int)}
    if int_bindings and not (_free_symbols(dim) <= {dim.value}):
        try:
            return dim.evaluate(int_bindings)
        except Exception:  # an unparseable expression stays as it is
            return dim
    return dim


def _bind_shape(shape: ir.Shape | None, bindings: Mapping[str, int | str]) -> ir.Shape | None:
    if shape is None:
        return None
    dims = [_bind_dim(d, bindings) for d in shape.dims]
    if list(dims) == list(shape.dims):
        return shape
    return ir.Shape(dims)


def _all_values(model: ir.Model) -> list[ir.Value]:
    """Every value of the model: graph inputs and initializers, node outputs, in subgraphs too."""
    seen: dict[int, ir.Value] = {}
    graphs = [model.graph, *model.graphs()]
    for graph in graphs:
        for value in [*graph.inputs, *graph.initializers.values(), *graph.outputs]:
            seen.setdefault(id(value), value)
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        for value in node.outputs:
            seen.setdefault(id(value), value)
    return list(seen.values())


def _all_static(model: ir.Model) -> bool:
    """Every node output of a model without subgraphs or functions has a type and a static shape."""
    if model.functions:
        return False
    for node in model.graph:
        if any(attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for attr in node.attributes.values()):
            return False
        for value in node.outputs:
            if value.type is None or value.shape is None or not value.shape.is_static():
                return False
    return True


def _bind_model(model: ir.Model, bindings: Mapping[str, int | str]) -> None:
    """Substitute dim names in every shape of the model, in place."""
    if not bindings:
        return
    for value in _all_values(model):
        if value.shape is not None:
            value.shape = _bind_shape(value.shape, bindings)


def _runtime_inputs(model: ir.Model) -> list[ir.Value]:
    """The graph inputs a caller feeds (an input that is also an initializer is a default, not a feed)."""
    return [v for v in model.graph.inputs if not v.is_initializer()]


def _input_dims(model: ir.Model) -> dict[str, list[tuple[str, int]]]:
    """Named dynamic dims of the graph inputs -> where each appears, as (input name, axis)."""
    dims: dict[str, list[tuple[str, int]]] = {}
    for value in _runtime_inputs(model):
        for axis, dim in enumerate(value.shape.dims if value.shape is not None else ()):
            if (
                isinstance(dim, ir.SymbolicDim)
                and dim.value is not None
                and _free_symbols(dim) <= {dim.value}
            ):
                dims.setdefault(dim.value, []).append((value.name, axis))
    return dims


# Above this, serialising the model for onnxruntime's symbolic inference risks protobuf's 2 GiB limit.
_SYMBOLIC_REFINE_MAX_BYTES = 1 << 30


def _refine_symbolically(
    model: ir.Model, unresolved: list[ir.Value], input_symbols: set[str]
) -> tuple[dict[str, ir.Shape], str | None]:
    """Second opinion for the tensors ONNX inference left unknown: onnxruntime's symbolic shape inference.

    ONNX's data propagation loses a dim at ops like Slice(position_ids, 0, seq); onnxruntime's sympy-based
    inference keeps it. Its answer is taken only for those tensors, and only when it is expressed in the
    inputs' dims. It merges symbols that broadcasting says are equal (``auto_merge``), a heuristic: so
    ``specialize`` drops these shapes and lets ONNX inference recompute them from the bound inputs.
    Returns the shapes refined, by tensor name, and a note when it could not run.
    """
    if not unresolved:
        return {}, None
    weight_bytes = sum(
        v.const_value.nbytes for v in model.graph.initializers.values() if v.const_value is not None
    )
    if weight_bytes > _SYMBOLIC_REFINE_MAX_BYTES:
        return {}, "onnxruntime symbolic shape inference skipped: the model's weights exceed 1 GiB"
    try:
        inferred = ort_symbolic_shapes(_symbolic_probe(model, {v.name for v in unresolved}))  # partial answers too
    except Exception as error:  # an op it has no rule for, an opset it refuses: keep ONNX's answer
        return {}, f"onnxruntime symbolic shape inference could not run ({type(error).__name__}: {error})"
    finally:
        # The probe graph is cycles (nodes and values refer to each other), long promoted to the oldest
        # generation by the time it goes, so only a full collection frees it before the job's peak; on
        # PP-OCRv4 det it held 3 MiB of the peak at the never-slower check. Paid only by models that need
        # this inference, whose sympy work takes far longer.
        gc.collect()
    found = {vi.name: vi for vi in [*inferred.graph.value_info, *inferred.graph.output]}
    refined: dict[str, ir.Shape] = {}
    for value in unresolved:
        info = found.get(value.name)
        if (
            info is None
            or not info.type.HasField("tensor_type")
            or not info.type.tensor_type.HasField("shape")
        ):
            continue
        shape = ir.serde.deserialize_type_proto_for_shape(info.type)
        if shape is None or (value.shape is not None and shape.rank() != value.shape.rank()):
            continue
        candidate = ir.Value(name=value.name, shape=shape)
        if _unknown_reason(candidate, input_symbols) is None:
            value.shape = shape
            refined[value.name] = shape
    return refined, None


# Initializers the symbolic inference may read as values (shapes, axes, indices): integer tensors up to this
# many elements, any tensor up to ``_VALUE_FLOAT_ELEMENTS``. Bigger ones are weights: only their shapes count.
_VALUE_INT_ELEMENTS = 4096
_VALUE_FLOAT_ELEMENTS = 64


def _is_weight(tensor) -> bool:
    """Whether ``tensor`` is too large to be a value the inference reads (a weight: only its shape counts)."""
    size = math.prod(tensor.shape.numpy())
    return size > (_VALUE_INT_ELEMENTS if tensor.dtype.is_integer() else _VALUE_FLOAT_ELEMENTS)


def _constant_weight(node: ir.Node):
    """The tensor of a ``Constant`` node (one output, its tensor in ``value`` alone) that holds a weight, or None."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or set(node.attributes) != {"value"}:
        return None
    tensor = node.attributes["value"].value
    if tensor is None or not hasattr(tensor, "shape") or len(node.outputs) != 1 or not _is_weight(tensor):
        return None
    return tensor


def _symbolic_probe(model: ir.Model, names: set[str]) -> onnx.ModelProto:
    """What the symbolic inference is asked: a copy of ``model`` with its weights as typed inputs and the
    values ``names`` untyped (inferred afresh rather than keeping ONNX's ``unk__`` names), as a protobuf.
    The copy goes when this returns."""
    probe = model.clone()
    _weights_as_inputs(probe)
    for node in probe.graph:
        for value in node.outputs:
            if value.name in names and not value.is_graph_output():
                value.shape = None
    return ir.to_proto(probe)


def _weights_as_inputs(model: ir.Model) -> None:
    """Turn ``model``'s weight initializers into graph inputs of the same type and shape (in place; a
    clone's), so the symbolic inference gets their shapes without serialising and copying their bytes (on
    a BERT-base-width model: ~1.5 s of a 2.2 s refinement were copies of weights it never reads)."""
    for name, value in list(model.graph.initializers.items()):
        tensor = value.const_value
        if tensor is None or value.shape is None or value.type is None or not _is_weight(tensor):
            continue
        model.graph.initializers.pop(name)
        value.const_value = None
        model.graph.inputs.append(value)
    # Weights written as Constant nodes (paddle2onnx writes all of its so) alike: the inference turns every
    # Constant into a numpy array it keeps, and copies it into a one-node model to infer it (PP-OCRv4 det:
    # 25 MiB for 4.7 MB of weights). The node goes; a typed input of the same name stands for its output.
    # Those inside subgraphs too (spox writes silero-vad's weights in its If branches, which the inference
    # copies per branch): the main graph's input stands for them there, a value from the outer scope.
    for node in list(ir.traversal.RecursiveGraphIterator(model.graph)):
        tensor = _constant_weight(node)
        if tensor is None or node.outputs[0].is_graph_output():
            continue
        output = node.outputs[0]
        standing = ir.Value(name=output.name, type=ir.TensorType(tensor.dtype), shape=ir.Shape(tensor.shape.numpy()))
        output.replace_all_uses_with(standing)
        node.graph.remove(node, safe=True)
        model.graph.inputs.append(standing)


def _infer_shapes(model: ir.Model) -> None:
    # Non-strict: one node ONNX cannot infer must not cost the shapes of every other node; whatever stays
    # unknown is listed in the report.
    stubbed = _stub_weight_constants(model)
    try:
        ShapeInferencePass(check_type=False, strict_mode=False, data_prop=True)(model)
    finally:
        for node, attribute in stubbed:
            node.attributes["value"] = attribute


def _stub_weight_constants(model: ir.Model) -> list[tuple[ir.Node, ir.Attr]]:
    """Weights written as Constant nodes (paddle2onnx) stand as data-less declarations of the same type and
    shape while ONNX infers shapes (the caller puts each (node, attribute) back). onnx_ir leaves initializers'
    bytes out of the protobuf it hands to ONNX, but not a Constant's: the protobuf, ONNX's parse of it, its
    answer and the parse of that each held the weights again (PP-OCRv4 rec: +30 MiB per inference for its
    10.8 MB). Shapes, axes and other small tensors (``_VALUE_*_ELEMENTS``) keep their values for the data
    propagation."""
    stubbed = []
    for node in model.graph:
        tensor = _constant_weight(node)
        if tensor is None or isinstance(tensor, ir.ExternalTensor):
            continue
        attribute = node.attributes["value"]
        stub = ir.ExternalTensor("flexdsa-shape-only", None, None, tensor.dtype, shape=tensor.shape, name=tensor.name)
        node.attributes["value"] = ir.AttrTensor("value", stub)
        stubbed.append((node, attribute))
    return stubbed


def _safe_name(name: str) -> str:
    """A dim name fit for a bucket (and so a file) name."""
    return re.sub(r"[^A-Za-z0-9]+", "", name) or "dim"


def _sanitize_identifier(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", name).strip("_") or "input"


def apply_input_shapes(model: ir.Model, input_shapes: Mapping[str, Sequence[Dim]] | None) -> ir.Model:
    """A copy of ``model`` with ``options.input_shapes`` applied: an int fixes a dim, a string names it.

    A named dim an override replaces is replaced everywhere it appears (inputs not mentioned and
    intermediate shapes too), since one name means one size in ONNX. Refused: unknown input names, a rank
    that differs from the model's, changing a dim the model fixes, and one old name sent two ways.
    """
    model = model.clone()
    if not input_shapes:
        return model
    inputs = {v.name: v for v in _runtime_inputs(model)}
    unknown = sorted(set(input_shapes) - set(inputs))
    if unknown:
        raise InvalidOptionsError(
            f"input_shapes names {', '.join(map(repr, unknown))}, which the model does not take as input. "
            f"Model inputs: {', '.join(map(repr, inputs)) or '(none)'}.",
            details={"unknown_inputs": unknown, "model_inputs": list(inputs)},
        )
    renames: dict[str, int | str] = {}
    for input_name, dims in input_shapes.items():
        value = inputs[input_name]
        for axis, dim in enumerate(dims):
            if (
                isinstance(dim, bool)
                or not isinstance(dim, int | str)
                or dim == ""
                or (isinstance(dim, int) and dim < 0)
            ):
                raise InvalidOptionsError(
                    f"input_shapes[{input_name!r}][{axis}] is {dim!r}: give a size >= 0 or a dim name."
                )
        if value.shape is None:
            continue
        if len(dims) != value.shape.rank():
            raise InvalidOptionsError(
                f"input_shapes[{input_name!r}] has rank {len(dims)}, but the model's input has rank "
                f"{value.shape.rank()} ({_shape_out(value.shape)}). Give one entry per axis.",
            )
        for axis, (old, new) in enumerate(zip(value.shape.dims, dims, strict=True)):
            if isinstance(old, int):
                if old != new:
                    raise InvalidOptionsError(
                        f"input_shapes[{input_name!r}][{axis}] is {new!r}, but the model fixes that axis "
                        f"to {old}. Only dynamic dims can be overridden.",
                    )
                continue
            if old.value is None:
                continue
            if renames.get(old.value, new) != new:
                raise InvalidOptionsError(
                    f"Dim {old.value!r} is set to both {renames[old.value]!r} and {new!r} by input_shapes; "
                    "one name stands for one size, so give it one value.",
                )
            renames[old.value] = new
    _bind_model(model, renames)
    for input_name, dims in input_shapes.items():
        inputs[input_name].shape = ir.Shape(list(dims))
    return model


@dataclass
class UnknownShape:
    """A tensor whose shape inference could not (fully) tell."""

    tensor: str
    op_type: str
    node: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"tensor": self.tensor, "op_type": self.op_type, "node": self.node, "reason": self.reason}


@dataclass
class ShapeReport:
    """What ``ShapeTracker.infer`` found: the inputs' named dims and every tensor still unknown."""

    inputs: dict[str, list[Dim | None] | None]
    outputs: dict[str, list[Dim | None] | None]
    # Dim name -> where it appears on the inputs, as (input name, axis).
    dims: dict[str, list[tuple[str, int]]]
    # '<input>[<axis>]' -> the fresh name an unnamed input dim was given.
    named_dims: dict[str, str]
    unknown: list[UnknownShape]
    counts: dict[str, int]
    # Tensors ONNX inference left unknown that onnxruntime's symbolic inference resolved.
    refined: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # ``TrafficChoice.as_dict()`` when the buckets came from the request's observed_shapes.
    from_traffic: dict[str, Any] | None = None
    # Dim -> value, for dims whose bucket came from the calibration samples' shapes (no shape_buckets given).
    from_samples: dict[str, int] | None = None
    # ``ShapePlan.as_dict()``: the values dims nobody bucketed take (default buckets, costing), and the budget.
    plan: dict[str, Any] | None = None

    @property
    def dynamic_dims(self) -> list[str]:
        return list(self.dims)

    def as_dict(self) -> dict[str, Any]:
        return {
            "inputs": self.inputs,
            "outputs": self.outputs,
            "dims": {name: [{"input": i, "axis": a} for i, a in where] for name, where in self.dims.items()},
            "named_dims": self.named_dims,
            "unknown": [u.as_dict() for u in self.unknown],
            "counts": self.counts,
            # The full list can run to thousands of names on a large model; a sample says enough.
            "refined_examples": self.refined[:10],
            "notes": self.notes,
            **({"from_traffic": self.from_traffic} if self.from_traffic is not None else {}),
            **({"from_samples": self.from_samples} if self.from_samples else {}),
            **({"plan": self.plan} if self.plan is not None else {}),
        }


@dataclass
class Bucket:
    """One specialisation: the dims it fixes (``dims``); dims it does not name stay symbolic."""

    name: str
    dims: dict[str, int]
    # Added by ``ShapeTracker.update`` for a runtime shape no planned bucket fitted.
    from_runtime: bool = False

    def input_shapes(self, model: ir.Model) -> dict[str, list[Dim | None]]:
        """The model's input shapes under this bucket: ints where fixed, names where still symbolic."""
        shapes: dict[str, list[Dim | None]] = {}
        for value in _runtime_inputs(model):
            bound = _bind_shape(value.shape, self.dims)
            shapes[value.name] = _shape_out(bound) or []
        return shapes

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dims": dict(self.dims), "from_runtime": self.from_runtime}


@dataclass
class Selection:
    """What ``ShapeTracker.update`` chose for one runtime shape."""

    bucket: Bucket
    model: ir.Model
    # Runtime value of every dynamic dim.
    dims: dict[str, int]
    # Per input, per axis: elements to pad at the end of that axis to reach the bucket's shape.
    padding: dict[str, list[int]]
    new_bucket: bool
    memory_plan: Any = None  # flexdsa_core.memory_planner.MemoryPlan for a newly specialised bucket

    @property
    def needs_padding(self) -> bool:
        return any(any(p) for p in self.padding.values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket.name,
            "dims": self.dims,
            "padding": self.padding,
            "needs_padding": self.needs_padding,
            "new_bucket": self.new_bucket,
            "memory_plan": self.memory_plan.as_dict() if self.memory_plan is not None else None,
        }


class ShapeTracker:
    """Symbolic shapes, buckets and specialisation for one model (the tracker works on its own copy)."""

    def __init__(self, model: ir.Model, *, input_shapes: Mapping[str, Sequence[Dim]] | None = None) -> None:
        self.model = apply_input_shapes(model, input_shapes)
        self._report: ShapeReport | None = None
        self._refined: dict[str, ir.Shape] = {}
        self._buckets: list[Bucket] = []
        self._specialized: dict[str, ir.Model] = {}
        self._specialization_info: dict[str, dict[str, Any]] = {}
        self._plans: dict[tuple, ShapePlan] = {}
        self._refusals: dict[tuple, str | None] = {}
        # The largest value each dim may take, where the model has a limit (``preflight.model_limits``).
        self.limits: dict[str, int] = {}

    def apply_input_shapes(self, input_shapes: Mapping[str, Sequence[Dim]] | None) -> None:
        """Apply ``options.input_shapes`` (see the module function) and start over from inference."""
        self.model = apply_input_shapes(self.model, input_shapes)
        self._report = None
        self._buckets = []
        self._specialized.clear()
        self._specialization_info.clear()

    # ---- inference -------------------------------------------------------------------------------
    def infer(self) -> ShapeReport:
        """Name unnamed input dims, run shape inference with data propagation, and report."""
        if self._report is not None:
            return self._report
        named_dims = self._name_input_dims()
        _infer_shapes(self.model)
        input_symbols = set(_input_dims(self.model))
        unresolved = [
            value
            for node in self.model.graph
            for value in node.outputs
            if value.name and _unknown_reason(value, input_symbols) is not None
        ]
        self._refined, refine_note = _refine_symbolically(self.model, unresolved, input_symbols)
        self._report = self._build_report(named_dims)
        self._report.refined = sorted(self._refined)
        self._report.counts["refined_symbolically"] = len(self._refined)
        if refine_note:
            self._report.notes.append(refine_note)
        return self._report

    def _name_input_dims(self) -> dict[str, str]:
        taken = {
            symbol
            for value in _all_values(self.model)
            if value.shape is not None
            for dim in value.shape.dims
            if isinstance(dim, ir.SymbolicDim)
            for symbol in _free_symbols(dim)
        }
        named: dict[str, str] = {}
        for value in _runtime_inputs(self.model):
            if value.shape is None or not any(_placeholder_dim(dim) for dim in value.shape.dims):
                continue
            dims = list(value.shape.dims)
            for axis, dim in enumerate(dims):
                # A dim written as -1, '?' or '' (paddle2onnx, older exporters) is unknown, not one shared symbol.
                if _placeholder_dim(dim):
                    base = fresh = f"{_sanitize_identifier(value.name)}_dim{axis}"
                    n = 1
                    while fresh in taken:
                        fresh, n = f"{base}_{n}", n + 1
                    taken.add(fresh)
                    dims[axis] = ir.SymbolicDim(fresh)
                    named[f"{value.name}[{axis}]"] = fresh
            value.shape = ir.Shape(dims)
        return named

    def _build_report(self, named_dims: dict[str, str]) -> ShapeReport:
        graph = self.model.graph
        inputs = {v.name: _shape_out(v.shape) for v in _runtime_inputs(self.model)}
        dims = _input_dims(self.model)
        known_symbols = set(dims)
        unknown: list[UnknownShape] = []
        counts = {"tensors": 0, "static": 0, "symbolic": 0, "unknown": 0}
        for node in graph:
            for value in node.outputs:
                if not value.name:
                    continue
                counts["tensors"] += 1
                reason = _unknown_reason(value, known_symbols)
                if reason is not None:
                    counts["unknown"] += 1
                    unknown.append(UnknownShape(value.name, node.op_type, node.name or "", reason))
                elif value.shape.is_static():
                    counts["static"] += 1
                else:
                    counts["symbolic"] += 1
        outputs = {v.name: _shape_out(v.shape) for v in graph.outputs}
        counts["inputs"] = len(inputs)
        counts["dynamic_dims"] = len(dims)
        return ShapeReport(inputs, outputs, dims, named_dims, unknown, counts)

    # ---- buckets ---------------------------------------------------------------------------------
    def buckets(
        self,
        shape_buckets: Mapping[str, Sequence[int]] | None,
        target: TargetSpec,
        *,
        observed: Sequence[ObservedShape | Mapping[str, Any]] | None = None,
        max_buckets: int = 3,
        samples: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[Bucket]:
        """The buckets to compile for: see the module docstring for where each dim's values come from.
        ``samples``: the calibration samples as feeds (input name -> array), whose shapes the dims the target
        would default take instead, so samples at seq 64 make a seq-64 bucket rather than being refused at 128."""
        report = self.infer()
        if observed:
            traffic = self._observed(observed)
            if shape_buckets is None:
                choice = choose_traffic_buckets(traffic, max_buckets, *self.traffic_cost(target))
                report.from_traffic = choice.as_dict()
                shape_buckets = choice.chosen
            else:
                report.notes.append("observed_shapes not used: the request gives shape_buckets")
        requested = dict(shape_buckets or {})
        unknown = sorted(set(requested) - set(report.dims))
        if unknown:
            raise InvalidOptionsError(
                f"shape_buckets names {', '.join(map(repr, unknown))}, which is not a dynamic dim of the model's "
                f"inputs. Dynamic dims: {', '.join(map(repr, report.dims)) or '(none: the model is static)'}.",
                details={"unknown_dims": unknown, "dynamic_dims": list(report.dims)},
            )
        values: dict[str, list[int]] = {}
        defaulted: dict[str, list[int] | None] = {}  # dims the target's defaults decide, capped by the model
        seen = _sample_dims(report.dims, samples) if shape_buckets is None else {}
        report.from_samples = None
        for dim_name in report.dims:
            if dim_name in requested:
                values[dim_name] = _checked_values(dim_name, requested[dim_name], "shape_buckets")
                continue
            kind = self.dim_kind(dim_name)
            default = target.default_shape_buckets.get(dim_name) or target.default_shape_buckets.get(
                _DEFAULT_KEYS.get(kind, "")
            )
            if dim_name in seen and kind != "batch" and (default or target.static_shapes):
                values[dim_name] = _checked_values(dim_name, [seen[dim_name]], "the calibration samples")
                report.from_samples = {**(report.from_samples or {}), dim_name: seen[dim_name]}
                continue
            if default:
                defaulted[dim_name] = _checked_values(
                    dim_name, default, f"target {target.name!r} default_shape_buckets"
                )
            elif target.static_shapes:
                defaulted[dim_name] = [REPRESENTATIVE_BATCH] if kind == "batch" else None
        if report.from_samples:
            taken = ", ".join(f"{name} {value}" for name, value in report.from_samples.items())
            report.notes.append(f"buckets from the calibration samples' shapes ({taken}): no shape_buckets given")
        if defaulted:
            values.update(self._defaults(values, defaulted, target))
            values = {name: values[name] for name in report.dims if name in values}  # the inputs' order
        if not values:
            name = DYNAMIC_BUCKET if report.dims else STATIC_BUCKET
            self._buckets = [Bucket(name, {})]
            return list(self._buckets)
        combos = math.prod(len(v) for v in values.values())
        if combos > MAX_BUCKETS:
            raise InvalidOptionsError(
                f"shape_buckets make {combos} combinations (at most {MAX_BUCKETS}): each one is compiled "
                "separately. Give fewer values per dim.",
            )
        names = list(values)
        self._buckets = []
        for combo in itertools.product(*(values[n] for n in names)):
            self._buckets.append(self._new_bucket(dict(zip(names, combo, strict=True))))
        return list(self._buckets)

    def dim_kind(self, dim_name: str) -> str:
        """``shape_plan.dim_kind`` of one of the inputs' dynamic dims, from its name and where it sits."""
        where = []
        inputs = {v.name: v for v in _runtime_inputs(self.model)}
        for input_name, axis in self.infer().dims.get(dim_name, []):
            value = inputs[input_name]
            dtype = value.dtype.numpy().name if value.dtype is not None else None
            where.append((axis, len(value.shape), dtype))
        return dim_kind(dim_name, where)

    def _defaults(
        self, requested: Mapping[str, list[int]], defaulted: Mapping[str, list[int] | None], target: TargetSpec
    ) -> dict[str, list[int]]:
        """Values for the dims the target's defaults decide (``defaulted``: dim -> the default's values, or None
        where the target has none and the plan chooses), capped by what the model runs: the plan's first
        candidate at or under each default that the model runs at, with the request's dims at their first value."""
        fixed = {name: vals[0] for name, vals in requested.items()}
        preferred = {name: vals[0] for name, vals in defaulted.items() if vals}
        plan = self.plan(list(defaulted), fixed=fixed, preferred=preferred)
        chosen: dict[str, list[int]] = {}
        for name, vals in defaulted.items():
            # The default as the target gives it where the model runs at its first value, else the plan's value.
            chosen[name] = list(vals) if vals and plan.dims[name] == vals[0] else [plan.dims[name]]
            if vals and chosen[name] != list(vals):
                plan.why[name] = f"target {target.name!r} default {vals} changed for this model: {plan.why.get(name)}"
            elif vals:
                plan.why[name] = f"target {target.name!r} default_shape_buckets"
        self.infer().plan = plan.as_dict()
        return chosen

    def plan(
        self,
        names: Sequence[str],
        *,
        fixed: Mapping[str, int] | None = None,
        preferred: Mapping[str, int] | None = None,
    ) -> ShapePlan:
        """Representative values for the dynamic dims ``names`` (the others at ``fixed``), by the rules of
        ``shape_plan``: by kind, held to the memory budget, and moved along ``CANDIDATES`` until the model
        runs (``preferred``: where to start for a dim, e.g. a target's default)."""
        fixed = dict(fixed or {})
        key = (tuple(names), tuple(sorted(fixed.items())), tuple(sorted((preferred or {}).items())))
        if key in self._plans:
            return self._plans[key]
        budget, basis = memory_budget(weight_bytes(self.model))
        plan = ShapePlan(budget_bytes=budget, budget_basis=basis)
        if not names:
            self._plans[key] = plan
            return plan
        kinds = {name: self.dim_kind(name) for name in names}
        plan.kinds = kinds
        start = {
            name: (preferred or {}).get(name) or (REPRESENTATIVE_BATCH if kind == "batch" else REPRESENTATIVE_DIM)
            for name, kind in kinds.items()
        }
        weights = set(self.model.graph.initializers) | {
            out.name for node in self.model.graph if node.op_type == "Constant" for out in node.outputs
        }
        # Held to the budget: the largest tensor at these values, from shape inference alone.
        caps = dict(start)
        for _ in range(16):
            shapes = static_shapes(self.model, {**fixed, **caps})
            largest, size = largest_tensor(shapes, skip=weights)
            plan.largest_tensor, plan.largest_bytes = largest, size or None
            if size <= budget:
                break
            open_dims = [n for n in caps if kinds[n] != "batch" and caps[n] > MIN_HALVED_DIM]
            if not open_dims:
                plan.notes.append(
                    f"tensor {largest!r} takes {size / 2**20:.0f} MiB at the smallest values tried, over the "
                    f"memory budget of {budget / 2**20:.0f} MiB"
                )
                break
            for name in open_dims:
                caps[name] = max(MIN_HALVED_DIM, caps[name] // 2)
        for name in names:
            if caps[name] != start[name]:
                plan.why[name] = (
                    f"lowered from {start[name]} to {caps[name]}: at {start[name]} a tensor would exceed the memory "
                    f"budget of {budget / 2**20:.0f} MiB"
                )
        # Moved until the model runs (a position table caps a sequence, an STFT needs a minimum length).
        chosen, refusal, tried = dict(caps), None, []
        # Batch dims are never moved, so for them alone running the model could only add a note, not change a
        # value: that run (one ONNX Runtime session of the whole model, ~0.04 s on MobileNetV2) is left to
        # validation, which runs the original at these values anyway and fails the job with ONNX Runtime's reason.
        movable = any(kinds[name] != "batch" for name in names)
        # An anonymous dim off axis 0 may be a batch in disguise (a recurrent state's [2, batch, 128]).
        disguised = [n for n in names if kinds[n] == "other" and is_anonymous_dim(n)]
        for candidate in (None, *CANDIDATES["other"]) if movable else ():
            trial = {
                name: caps[name] if candidate is None or kinds[name] == "batch" else candidate for name in names
            }
            if candidate is not None and candidate > max(start.values()) and not self._within(
                {**fixed, **trial}, budget, weights
            ):
                continue  # larger than the start only where the budget allows it
            variants = [trial, *({**trial, name: REPRESENTATIVE_BATCH} for name in disguised)]
            for variant in variants:
                if variant in tried:
                    continue
                tried.append(variant)
                reason = self._refusal({**fixed, **variant})
                if reason is None:
                    chosen = variant
                    break
                refusal = refusal or reason
            else:
                continue
            break
        else:
            if movable:
                plan.notes.append(f"the model runs at none of the values tried: {refusal}")
        for name in names:
            if chosen[name] != caps[name]:
                plan.why[name] = (
                    f"the model does not run at {caps[name]} ({refusal}); it runs at {chosen[name]}"
                )
            plan.why.setdefault(name, f"{kinds[name]} dim: {'1' if kinds[name] == 'batch' else 'the representative size'}")
        plan.dims = chosen
        self._plans[key] = plan
        return plan

    def _within(self, dims: Mapping[str, int], budget: int, skip: set[str]) -> bool:
        return largest_tensor(static_shapes(self.model, dims), skip=skip)[1] <= budget

    def _refusal(self, dims: Mapping[str, int]) -> str | None:
        """Why ONNX Runtime cannot run the model at ``dims`` (None: it runs). Loaded once and run once on
        seeded inputs; above ``_RUN_CHECK_MAX_BYTES`` of weights only shape inference is asked."""
        key = tuple(sorted(dims.items()))
        if key in self._refusals:
            return self._refusals[key]
        import onnxruntime as ort

        from flexdsa_core.in_memory import InMemoryModel
        from flexdsa_core.ort_runs import make_inputs, run

        reason = None
        if weight_bytes(self.model) <= _RUN_CHECK_MAX_BYTES:
            proto = onnx.ModelProto()
            for value in _runtime_inputs(self.model):
                proto.graph.input.append(ir.serde.serialize_value(value))
            try:
                feeds = make_inputs(proto, dims=dict(dims))
                options = ort.SessionOptions()
                options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
                options.intra_op_num_threads = 1
                options.log_severity_level = 4  # a refusal here is an answer, not an error to log
                session = InMemoryModel.from_ir(self.model, finished=False).session(options)
                run(session, feeds, what="a shape check")
            except Exception as error:  # noqa: BLE001 - ORT raises many types; its words are the reason
                reason = re.sub(r"^\[ONNXRuntimeError\] : \d+ : [A-Z_]+ : ", "", str(error).splitlines()[0])[:200]
        self._refusals[key] = reason
        return reason

    def _observed(
        self, observed: Sequence[ObservedShape | Mapping[str, Any]]
    ) -> list[tuple[dict[str, int], int]]:
        """The request's observed_shapes as (dims, count), refused unless every entry names the same dynamic
        dims of the model: a dim one entry leaves out would have no value to pad from."""
        entries = [ObservedShape.model_validate(entry) for entry in observed]
        dynamic = self.infer().dims
        unknown = sorted({name for entry in entries for name in entry.dims} - set(dynamic))
        if unknown:
            raise InvalidOptionsError(
                f"observed_shapes names {', '.join(map(repr, unknown))}, which is not a dynamic dim of the "
                f"model's inputs. Dynamic dims: {', '.join(map(repr, dynamic)) or '(none: the model is static)'}.",
                details={"unknown_dims": unknown, "dynamic_dims": list(dynamic)},
            )
        names = set(entries[0].dims)
        uneven = [i for i, entry in enumerate(entries) if set(entry.dims) != names]
        if uneven:
            raise InvalidOptionsError(
                f"observed_shapes entry {uneven[0]} names dims {sorted(entries[uneven[0]].dims)}, entry 0 names "
                f"{sorted(names)}: every entry must give a value for the same dims.",
                details={"entry": uneven[0]},
            )
        for name in names:
            distinct = len({entry.dims[name] for entry in entries})
            if distinct > MAX_TRAFFIC_VALUES:
                raise InvalidOptionsError(
                    f"observed_shapes has {distinct} distinct values of dim {name!r} (at most "
                    f"{MAX_TRAFFIC_VALUES}): each one is costed on the model. Round them up, e.g. to multiples "
                    "of 8, and add up their counts.",
                    details={"dim": name, "distinct": distinct},
                )
        return [(dict(entry.dims), entry.count) for entry in entries]

    def traffic_cost(self, target: TargetSpec) -> tuple[Callable[[Mapping[str, int]], float], str]:
        """``cost(dims) -> seconds`` of the model specialised at ``dims`` on ``target``, and what it rests on.

        Never measured: a calibrated target (cpu-ort) would time every kernel at every candidate value, so
        there the cost model's FLOPs (its per-op ``work`` formulas) are priced at this host's single-thread
        SGEMM peak, plus the target's launch overhead per kernel. Other targets: the cost model's roofline.
        A batch-like dim the traffic leaves out is costed at 1; any other stays to the cost model's rules.
        """
        cost_model = CostModel(target, calibrate=False)
        peak = _host_sgemm_peak() if target.calibrated else None
        free = {name: REPRESENTATIVE_BATCH for name in self.infer().dims if is_batch_dim(name)}

        def cost(dims: Mapping[str, int]) -> float:
            model, _ = self._specialized_model({**free, **dims})
            total = cost_model.graph_cost(model)
            if peak is not None:
                return total.flops / peak + total.kernels * target.launch_overhead_s
            return total.seconds or 0.0

        if peak is not None:
            basis = (
                f"estimate: cost-model FLOPs at this host's single-thread SGEMM peak ({peak / 1e9:.1f} GFLOP/s) "
                f"plus {target.launch_overhead_s:g} s per kernel; no kernel measured"
            )
        else:
            basis = f"estimate: {cost_model.basis}"
        return cost, basis

    def _new_bucket(self, dims: dict[str, int], *, from_runtime: bool = False) -> Bucket:
        base = name = "_".join(f"{_safe_name(d)}{v}" for d, v in dims.items()) or STATIC_BUCKET
        existing = {b.name for b in self._buckets}
        n = 2
        while name in existing:
            name, n = f"{base}_{n}", n + 1
        return Bucket(name, dims, from_runtime=from_runtime)

    # ---- specialisation --------------------------------------------------------------------------
    def specialize(self, bucket: Bucket) -> ir.Model:
        """A copy of the model with the bucket's dims fixed, shapes re-inferred, shape arithmetic folded.

        A bucket is specialised once; every call returns a fresh copy of that result (weights shared), so
        a caller may rewrite it freely and ask again, e.g. to recompile with some rewrites switched off.
        """
        if bucket.name in self._specialized:
            return self._specialized[bucket.name].clone()
        model, info = self._specialized_model(bucket.dims)
        self._specialized[bucket.name] = model
        self._specialization_info[bucket.name] = info
        return model.clone()

    def specialize_at(self, dims: Mapping[str, int]) -> ir.Model:
        """``specialize`` for dims that are no bucket (a check at other values): not kept."""
        return self._specialized_model(dims)[0]

    def _specialized_model(self, dims: Mapping[str, int]) -> tuple[ir.Model, dict[str, Any]]:
        """``specialize``'s work, uncached: the model with ``dims`` bound, and its node counts."""
        self.infer()
        model = self.model.clone()
        nodes_before = sum(1 for _ in ir.traversal.RecursiveGraphIterator(model.graph))
        for node in model.graph:
            for value in node.outputs:
                if value.name in self._refined:
                    value.shape = None  # a heuristic answer; ONNX recomputes it from the bound inputs
        _bind_model(model, dims)
        # The clone carries what ONNX inferred with the dims as symbols (``infer``): with none bound, or every
        # value left with a type and a static shape by the binding, inferring again would repeat that answer
        # (the refined values it cannot infer get the refined shape below either way).
        if dims and not _all_static(model):
            _infer_shapes(model)
        folded = fold_known_shapes(model, _fold_only_shape_arithmetic)
        if RemoveUnusedNodesPass()(model).modified or folded:  # else the shapes inferred above stand
            _infer_shapes(model)
        # Where dims stay symbolic ONNX may lose them again: fall back on the refined answer, bound.
        input_symbols = set(_input_dims(model))
        for node in model.graph:
            for value in node.outputs:
                refined = self._refined.get(value.name)
                if refined is not None and _unknown_reason(value, input_symbols) is not None:
                    value.shape = _bind_shape(refined, dims)
        nodes_after = sum(1 for _ in ir.traversal.RecursiveGraphIterator(model.graph))
        still_dynamic = [
            v.name for n in model.graph for v in n.outputs if v.shape is None or not v.shape.is_static()
        ]
        return model, {
            "nodes_before": nodes_before,
            "nodes_after": nodes_after,
            "still_dynamic_tensors": still_dynamic,
        }

    def specialization_info(self, bucket_name: str) -> dict[str, Any]:
        """Node counts before/after folding and the tensors still not static, for a specialised bucket."""
        return dict(self._specialization_info[bucket_name])

    # ---- run time --------------------------------------------------------------------------------
    def update(
        self, concrete_input_shapes: Mapping[str, Sequence[int]], *, exact_dims: Collection[str] = ()
    ) -> Selection:
        """The bucket for a runtime shape: the smallest that fits (with padding), or a new exact one.

        ``exact_dims``: dims the model does not tolerate padding on (``padding_check``; the manifest's
        ``runtime.padding``): a bucket fits only at exactly the runtime's value there. ``flexdsa_runtime``
        applies the same policy from the manifest (tests hold the two to the same choices)."""
        from flexdsa_core.memory_planner import plan_memory

        self.infer()
        runtime_dims = self._runtime_dims(concrete_input_shapes)
        exact = set(exact_dims)
        fitting = [
            b
            for b in self._buckets
            if all(
                runtime_dims.get(d, 0) <= v and (d not in exact or runtime_dims.get(d, v) == v)
                for d, v in b.dims.items()
            )
        ]
        if fitting:
            bucket = min(
                fitting,
                key=lambda b: (self._padded_elements(b, concrete_input_shapes), len(b.dims) == 0, b.name),
            )
            return Selection(
                bucket=bucket,
                model=self.specialize(bucket),
                dims=runtime_dims,
                padding=self._padding(bucket, concrete_input_shapes),
                new_bucket=False,
            )
        bucket = self._new_bucket(dict(runtime_dims), from_runtime=True)
        self._buckets.append(bucket)
        model = self.specialize(bucket)
        return Selection(
            bucket=bucket,
            model=model,
            dims=runtime_dims,
            padding=self._padding(bucket, concrete_input_shapes),
            new_bucket=True,
            memory_plan=plan_memory(model),
        )

    def _runtime_dims(self, concrete: Mapping[str, Sequence[int]]) -> dict[str, int]:
        inputs = {v.name: v for v in _runtime_inputs(self.model)}
        unknown = sorted(set(concrete) - set(inputs))
        missing = sorted(set(inputs) - set(concrete))
        if unknown or missing:
            parts = []
            if unknown:
                parts.append(f"unknown input(s) {', '.join(map(repr, unknown))}")
            if missing:
                parts.append(f"missing input(s) {', '.join(map(repr, missing))}")
            raise InvalidOptionsError(
                f"Runtime shapes have {' and '.join(parts)}. Model inputs: {', '.join(map(repr, inputs))}.",
                details={"unknown_inputs": unknown, "missing_inputs": missing},
            )
        bound: dict[str, tuple[int, str]] = {}
        for name, value in inputs.items():
            shape = list(concrete[name])
            if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in shape):
                raise InvalidOptionsError(
                    f"Runtime shape of input {name!r} is {shape}: every dim must be an int >= 0."
                )
            if value.shape is None:
                continue
            if len(shape) != value.shape.rank():
                raise InvalidOptionsError(
                    f"Input {name!r} has rank {value.shape.rank()} ({_shape_out(value.shape)}), but the runtime "
                    f"shape {shape} has rank {len(shape)}.",
                    details={"input": name, "expected": _shape_out(value.shape), "got": shape},
                )
            for axis, (dim, size) in enumerate(zip(value.shape.dims, shape, strict=True)):
                if isinstance(dim, int):
                    if dim != size:
                        raise InvalidOptionsError(
                            f"Input {name!r} axis {axis} is fixed to {dim} in the model; the runtime shape "
                            f"{shape} has {size} there.",
                            details={"input": name, "axis": axis, "expected": dim, "got": size},
                        )
                elif dim.value is not None and dim.value in self._report.dims:
                    previous = bound.get(dim.value)
                    if previous is not None and previous[0] != size:
                        raise InvalidOptionsError(
                            f"Dim {dim.value!r} is {previous[0]} on input {previous[1]!r} but {size} on input "
                            f"{name!r}; inputs sharing a dim name must agree on its size.",
                        )
                    bound[dim.value] = (size, name)
        return {d: bound[d][0] for d in self._report.dims if d in bound}

    def _padded_shape(self, bucket: Bucket, value: ir.Value, runtime: Sequence[int]) -> list[int]:
        if value.shape is None:
            return list(runtime)
        padded = []
        for dim, size in zip(value.shape.dims, runtime, strict=True):
            target = bucket.dims.get(dim.value) if isinstance(dim, ir.SymbolicDim) else None
            padded.append(target if target is not None else size)
        return padded

    def _padding(self, bucket: Bucket, concrete: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
        return {
            v.name: [
                p - s
                for p, s in zip(
                    self._padded_shape(bucket, v, concrete[v.name]), concrete[v.name], strict=True
                )
            ]
            for v in _runtime_inputs(self.model)
        }

    def _padded_elements(self, bucket: Bucket, concrete: Mapping[str, Sequence[int]]) -> int:
        return sum(
            math.prod(self._padded_shape(bucket, v, concrete[v.name])) for v in _runtime_inputs(self.model)
        )

    # ---- manifest --------------------------------------------------------------------------------
    def release_models(self) -> None:
        """Drop the tracker's copy of the model and the buckets' specialised models, once nothing will
        specialise again (the job is packaging): on PP-OCRv4 rec two graphs of 830-860 nodes and, through them,
        the original's weights, held at the bundle's serialisation for nothing. ``manifest`` and the report
        come first; after this, anything that needs the model raises."""
        self.model = None
        self._specialized.clear()
        self._plans.clear()

    def manifest(self) -> dict[str, Any]:
        """How a runtime maps input shapes to buckets; goes into the package's ``manifest.json``."""
        report = self.infer()
        entries = []
        for bucket in self._buckets:
            entry = {
                "name": bucket.name,
                "dims": dict(bucket.dims),
                "input_shapes": bucket.input_shapes(self.model),
                # A runtime dim d fits when 1 <= d <= the bucket's value; dims not listed are dynamic.
                "accepts": {d: [1, v] for d, v in bucket.dims.items()},
                "dynamic_dims": [d for d in report.dims if d not in bucket.dims],
                "from_runtime": bucket.from_runtime,
            }
            info = self._specialization_info.get(bucket.name)
            if info is not None:
                entry["still_dynamic_tensors"] = len(info["still_dynamic_tensors"])
            entries.append(entry)
        return {
            "dims": {
                name: [{"input": i, "axis": a} for i, a in where] for name, where in report.dims.items()
            },
            "policy": (
                "Among the buckets whose every dim is >= the runtime dim, take the one with the fewest padded "
                "input elements; pad each input with zeros at the end of each bucketed axis up to the bucket's "
                "size (the model must tolerate that padding, e.g. through an attention mask). If none fits, "
                "re-specialise for the exact shape."
            ),
            "dim_values": {d: sorted({b.dims[d] for b in self._buckets if d in b.dims}) for d in report.dims},
            # The largest value the model takes per dim, where it has a limit: requests past it are refused.
            "limits": dict(self.limits),
            "buckets": entries,
        }


# ---- buckets from traffic ------------------------------------------------------------------------


@functools.cache
def _host_sgemm_peak() -> float:
    """FLOP/s of one thread of this host (0.2 s of SGEMM, once per process)."""
    return measure_sgemm_peak(0.2, size=512)


def _sample_dims(dims: Mapping[str, list[tuple[str, int]]], samples) -> dict[str, int]:
    """Dim -> the one size every calibration sample gives it, on every input it appears on; axis 0 is where
    samples are stacked, so it says nothing. Dims the samples disagree on (or do not cover) are left out."""
    found: dict[str, int] = {}
    for name, where in dims.items():
        sizes = {
            int(feed[input_name].shape[axis])
            for feed in samples or ()
            for input_name, axis in where
            if axis > 0 and input_name in feed and len(getattr(feed[input_name], "shape", ())) > axis
        }
        if len(sizes) == 1:
            found[name] = sizes.pop()
    return found


def _checked_values(dim_name: str, values: Sequence[int], where: str) -> list[int]:
    if not values:
        raise InvalidOptionsError(f"{where} gives no value for dim {dim_name!r}; give at least one size.")
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, int) or v < 1]
    if bad:
        raise InvalidOptionsError(f"{where}[{dim_name!r}] has {bad}: every bucket size must be an int >= 1.")
    return sorted(set(values))


def _unknown_reason(value: ir.Value, known_symbols: set[str]) -> str | None:
    if value.shape is None:
        return "rank unknown: shape inference gave no shape"
    unresolved = []
    for axis, dim in enumerate(value.shape.dims):
        if isinstance(dim, int):
            continue
        if dim.value is None:
            unresolved.append(f"axis {axis} unknown")
        elif _ONNX_FRESH_DIM.match(dim.value) or not _free_symbols(dim) <= known_symbols:
            unresolved.append(f"axis {axis} is {dim.value!r}, not derived from the input dims")
    return "; ".join(unresolved) if unresolved else None


_SHAPE_DTYPES = frozenset({ir.DataType.INT64, ir.DataType.INT32, ir.DataType.BOOL})


def _fold_only_shape_arithmetic(node: ir.Node) -> bool | None:
    """Evaluate only integer/bool-valued nodes (shape arithmetic); weights are the generic passes' to fold.

    ``ConstantOfShape`` is kept by onnxscript's default rules (it could inflate the model), but an integer
    one is the ``Where(Equal(shape, -1), ones, shape)`` idiom exporters write around Expand: fold it.
    """
    if not all(out.dtype in _SHAPE_DTYPES for out in node.outputs):
        return False
    if node.op_type == "ConstantOfShape" and node.domain in ("", "ai.onnx"):
        return True
    return None
