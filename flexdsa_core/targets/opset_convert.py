"""Moving a model's ai.onnx opset into the range a vendor parser takes (ATC: 11-15 [H7], TensorRT: 9-20 [N5]).

Up (below the range) is onnx's version converter, whose upgrade adapters cover every op. Down it is not:
it has no adapter from Identity-16, If-16, Split-18, ConstantOfShape-20 and more, and none at all for ops
that did not exist yet. So going down is done here, on the onnx_ir graph, in three kinds of step:

1. Ops newer than the range are decomposed into ops the range has, each a named rewrite (so a user or
   the accuracy bisection can switch it off; the node then stays, and the adapter says why it falls back):

   * ``LayerNormalization`` (17): y = (x - mean) / sqrt(var + epsilon) * scale + bias, mean and var over
     the axes [axis, rank), in float32 when ``stash_type`` = 1 and x is a narrower float
   * ``Gelu`` (20): 0.5 x (1 + erf(x / sqrt 2)); with approximate="tanh" 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
   * ``GroupNormalization`` (18/21): InstanceNormalization over x reshaped to [N, G, -1], reshaped back, then
     the per-channel scale and bias (opset 18 gives them per group: repeated over each group's channels)
   * ``Mish`` (18): x tanh(softplus(x));  ``RMSNormalization`` (23): x / sqrt(mean(x^2) + epsilon) * scale;
     ``Swish`` (24): x sigmoid(alpha x)

2. Ops whose signature changed inside the gap are adapted where the newer form means what the older one
   does (Reduce* axes from a constant input back to an attribute at 18, Split's ``num_outputs``, Pad's
   ``axes`` input, attributes added with a default that keeps the old behaviour); anything else (Pad
   mode "wrap", RoiAlign's new default coordinate mode...) is refused with the reason.

3. Versions that only widened the types (Identity-16/19/21, Reshape-19/21, Cast-19...) keep their node:
   onnx's checker, run at the new opset, holds the model to the older schemas.

The conversion works on a copy and either succeeds whole or leaves the model as it was, with the reason.

Over 500 lines because each decomposition and each downgrade of a changed op (the steps above) is its own
rewrite; they share the walk, the checker run and the all-or-nothing copy, so they stay together.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_ir as ir
import onnx_ir.passes.common

from flexdsa_core.rewrites import Legalisation
from flexdsa_core.serialized import weightless_proto

OPSET_UPGRADE = "opset_upgrade"
OPSET_DOWNGRADE = "opset_downgrade"

_DEFAULT_DOMAINS = ("", "ai.onnx")


@dataclass
class OpsetConversion:
    model: ir.Model
    applied: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    refused: str | None = None  # why the model stays at its opset


def default_opset(model: ir.Model) -> int | None:
    for domain in _DEFAULT_DOMAINS:
        if domain in model.opset_imports:
            return model.opset_imports[domain]
    return None


def since_version(op_type: str, opset: int) -> int | None:
    """The version of ai.onnx ``op_type`` a model at ``opset`` uses; None when the op does not exist yet."""
    try:
        return onnx.defs.get_schema(op_type, max_inclusive_version=opset, domain="").since_version
    except onnx.defs.SchemaError:
        return None


# ---- decompositions: op -> (rewrite name, function) -----------------------------------------------------

Decompose = Callable[["Emitter", ir.Node, int], "list[ir.Value | None] | str"]
_DECOMPOSITIONS: dict[str, tuple[str, Decompose]] = {}


def decomposition(op_type: str, rewrite: str):
    def register(function: Decompose) -> Decompose:
        _DECOMPOSITIONS[op_type] = (rewrite, function)
        return function

    return register


def rewrite_names() -> tuple[str, ...]:
    """Every name a user may switch off, in a stable order."""
    return (OPSET_UPGRADE, OPSET_DOWNGRADE, *sorted({name for name, _ in _DECOMPOSITIONS.values()}))


def opset_legalisations() -> tuple[Legalisation, ...]:
    """The converter's switchable steps as declared legalisations (``rewrites.Legalisation``). They have no
    ``apply`` of their own: ``convert_opset`` honours them together, in one walk over the graph."""
    ops: dict[str, list[str]] = {}
    for op_type, (name, _) in _DECOMPOSITIONS.items():
        ops.setdefault(name, []).append(op_type)
    return (
        Legalisation(name=OPSET_UPGRADE, summary="The ai.onnx opset raised into the target's range."),
        Legalisation(name=OPSET_DOWNGRADE, summary="The ai.onnx opset lowered into the target's range."),
        *(Legalisation(name=name, summary=f"{', '.join(sorted(ops[name]))} decomposed where the target's opset "
                       "lacks it.") for name in rewrite_names()[2:]),
    )  # fmt: skip


class Emitter:
    """Builds replacement nodes in front of ``node`` at the target opset; constants become initializers."""

    def __init__(self, model: ir.Model, node: ir.Node, opset: int) -> None:
        self.model, self.node, self.opset = model, node, opset
        self._count = 0

    def _name(self, what: str) -> str:
        self._count += 1
        return f"{self.node.name or self.node.op_type}/{what}_{self._count}"

    def op(self, op_type: str, *inputs: ir.Value | None, **attributes) -> ir.Value:
        name = self._name(op_type)
        new = ir.node(op_type, list(inputs), attributes=attributes or None, name=name)
        new.outputs[0].name = name
        self.node.graph.insert_before(self.node, new)
        return new.outputs[0]

    def const(self, array: np.ndarray) -> ir.Value:
        name = self._name("const")
        value = ir.val(
            name,
            ir.DataType.from_numpy(array.dtype),
            list(array.shape),
            const_value=ir.tensor(array, name=name),
        )
        self.model.graph.register_initializer(value)
        return value

    def scalar(self, number: float, like: ir.Value | None) -> ir.Value:
        return self.const(np.array(number, dtype=_np_dtype(like)))

    def reduce(self, op_type: str, x: ir.Value, axes: list[int]) -> ir.Value:
        if self.opset >= 18 or (op_type == "ReduceSum" and self.opset >= 13):
            return self.op(op_type, x, self.const(np.array(axes, dtype=np.int64)), keepdims=1)
        return self.op(op_type, x, axes=axes, keepdims=1)


def _np_dtype(value: ir.Value | None) -> np.dtype:
    if value is None or value.dtype is None:
        return np.dtype(np.float32)
    return np.dtype(value.dtype.numpy())


def _attr(node: ir.Node, name: str, default=None):
    attr = node.attributes.get(name)
    if attr is None:
        return default
    value = attr.value
    return value.decode() if isinstance(value, bytes) else value


def _rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


def _norm_axes(node: ir.Node, x: ir.Value, axis: int) -> list[int] | str:
    """The axes [axis, rank) of a normalisation; negative ones need no rank."""
    if axis < 0:
        return list(range(axis, 0))
    rank = _rank(x)
    if rank is None:
        return f"{_label(node)}: the rank of {x.name!r} is unknown and axis={axis} is not negative"
    return list(range(axis, rank))


def _stash(e: Emitter, x: ir.Value, stash_type: int) -> ir.Value:
    """x in float32 when the op asks for float32 statistics and x is a narrower float."""
    if stash_type == 1 and x.dtype in (ir.DataType.FLOAT16, ir.DataType.BFLOAT16):
        return e.op("Cast", x, to=ir.DataType.FLOAT.value)
    return x


def _unstash(e: Emitter, y: ir.Value, x: ir.Value, computed: ir.Value) -> ir.Value:
    if computed is x or x.dtype is None:
        return y
    return e.op("Cast", y, to=x.dtype.value)


@decomposition("LayerNormalization", "layer_norm_decompose")
def _layer_norm(e: Emitter, node: ir.Node, version: int):
    x, scale = node.inputs[0], node.inputs[1]
    bias = node.inputs[2] if len(node.inputs) > 2 else None
    axes = _norm_axes(node, x, int(_attr(node, "axis", -1)))
    if isinstance(axes, str):
        return axes
    epsilon = float(_attr(node, "epsilon", 1e-5))
    computed = _stash(e, x, int(_attr(node, "stash_type", 1)))
    mean = e.reduce("ReduceMean", computed, axes)
    centred = e.op("Sub", computed, mean)
    variance = e.reduce("ReduceMean", e.op("Mul", centred, centred), axes)
    std = e.op("Sqrt", e.op("Add", variance, e.scalar(epsilon, computed)))
    y = _unstash(e, e.op("Div", centred, std), x, computed)
    y = e.op("Mul", y, scale)
    if bias is not None:
        y = e.op("Add", y, bias)
    outputs: list[ir.Value | None] = [y, None, None]
    if len(node.outputs) > 1 and is_used(node.outputs[1]):
        outputs[1] = mean
    if len(node.outputs) > 2 and is_used(node.outputs[2]):
        outputs[2] = e.op("Reciprocal", std)
    return outputs[: len(node.outputs)]


@decomposition("Gelu", "gelu_decompose")
def _gelu(e: Emitter, node: ir.Node, version: int):
    x = node.inputs[0]
    if _attr(node, "approximate", "none") == "tanh":
        cubed = e.op("Mul", e.op("Mul", x, x), x)
        inner = e.op("Add", x, e.op("Mul", cubed, e.scalar(0.044715, x)))
        gate = e.op("Tanh", e.op("Mul", inner, e.scalar(math.sqrt(2.0 / math.pi), x)))
    else:
        gate = e.op("Erf", e.op("Div", x, e.scalar(math.sqrt(2.0), x)))
    half_x = e.op("Mul", x, e.scalar(0.5, x))
    return [e.op("Mul", half_x, e.op("Add", gate, e.scalar(1.0, x)))]


@decomposition("GroupNormalization", "group_norm_decompose")
def _group_norm(e: Emitter, node: ir.Node, version: int):
    x, scale, bias = node.inputs[0], node.inputs[1], node.inputs[2]
    rank = _rank(x)
    groups = int(_attr(node, "num_groups"))
    if rank is None or rank < 3:
        return f"{_label(node)}: GroupNormalization needs an input of known rank >= 3"
    channels = x.shape[1]
    per_channel_shape = np.array([-1] + [1] * (rank - 2), dtype=np.int64)
    if version < 21:  # scale and bias per group: repeat each over its group's channels
        if not isinstance(channels, int) or scale.const_value is None or bias.const_value is None:
            return f"{_label(node)}: opset-18 GroupNormalization needs constant scale/bias and a known channel count"
        repeat = channels // groups
        scale = e.const(np.repeat(scale.const_value.numpy(), repeat).reshape(per_channel_shape))
        bias = e.const(np.repeat(bias.const_value.numpy(), repeat).reshape(per_channel_shape))
    else:
        scale = e.op("Reshape", scale, e.const(per_channel_shape))
        bias = e.op("Reshape", bias, e.const(per_channel_shape))
    computed = _stash(e, x, int(_attr(node, "stash_type", 1)))
    grouped = e.op("Reshape", computed, e.const(np.array([0, groups, -1], dtype=np.int64)))
    ones = e.const(np.ones(groups, dtype=_np_dtype(computed)))
    zeros = e.const(np.zeros(groups, dtype=_np_dtype(computed)))
    epsilon = float(_attr(node, "epsilon", 1e-5))
    normalized = e.op("InstanceNormalization", grouped, ones, zeros, epsilon=epsilon)
    if x.shape is not None and x.shape.is_static():
        target_shape = e.const(np.array(list(x.shape), dtype=np.int64))
    else:
        target_shape = e.op("Shape", x)
    y = _unstash(e, e.op("Reshape", normalized, target_shape), x, computed)
    return [e.op("Add", e.op("Mul", y, scale), bias)]


@decomposition("Mish", "mish_decompose")
def _mish(e: Emitter, node: ir.Node, version: int):
    x = node.inputs[0]
    return [e.op("Mul", x, e.op("Tanh", e.op("Softplus", x)))]


@decomposition("RMSNormalization", "rms_norm_decompose")
def _rms_norm(e: Emitter, node: ir.Node, version: int):
    x, scale = node.inputs[0], node.inputs[1]
    axes = _norm_axes(node, x, int(_attr(node, "axis", -1)))
    if isinstance(axes, str):
        return axes
    computed = _stash(e, x, int(_attr(node, "stash_type", 1)))
    mean_square = e.reduce("ReduceMean", e.op("Mul", computed, computed), axes)
    epsilon = float(_attr(node, "epsilon", 1e-5))
    rms = e.op("Sqrt", e.op("Add", mean_square, e.scalar(epsilon, computed)))
    y = _unstash(e, e.op("Div", computed, rms), x, computed)
    return [e.op("Mul", y, scale)]


@decomposition("Swish", "swish_decompose")
def _swish(e: Emitter, node: ir.Node, version: int):
    x = node.inputs[0]
    alpha = float(_attr(node, "alpha", 1.0))
    scaled = x if alpha == 1.0 else e.op("Mul", x, e.scalar(alpha, x))
    return [e.op("Mul", x, e.op("Sigmoid", scaled))]


# ---- signature adapters: op -> [(version that changed it, adapter)] -------------------------------------

Adapter = Callable[["Emitter", ir.Node], str | None]
_ADAPTERS: dict[str, list[tuple[int, Adapter]]] = {}

# Attributes added at a version, with the values that keep the older behaviour (and the new default,
# which is what a missing attribute means): drop them when they hold such a value, refuse otherwise.
_ADDED_ATTRIBUTES: dict[str, list[tuple[int, str, tuple, object]]] = {
    "Cast": [(19, "saturate", (0, 1), 1)],
    "CastLike": [(19, "saturate", (0, 1), 1)],
    "QuantizeLinear": [
        (19, "saturate", (0, 1), 1),
        (21, "block_size", (0,), 0),
        (21, "output_dtype", (0,), 0),
    ],
    "DequantizeLinear": [(21, "block_size", (0,), 0)],
    "Resize": [(18, "antialias", (0,), 0), (18, "keep_aspect_ratio_policy", ("stretch",), "stretch")],
    "ScatterElements": [(16, "reduction", ("none",), "none")],
    "ScatterND": [(16, "reduction", ("none",), "none")],
    "LpPool": [(18, "ceil_mode", (0,), 0)],
    "RoiAlign": [(16, "coordinate_transformation_mode", ("output_half_pixel",), "half_pixel")],
}
# Attributes whose new values the older versions do not have.
_NEW_VALUES: dict[str, list[tuple[int, str, tuple]]] = {
    "Pad": [(19, "mode", ("wrap",))],
    "Resize": [(19, "coordinate_transformation_mode", ("half_pixel_symmetric",))],
}
_REDUCE_AXES_AT_18 = ("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean")
_REDUCE_AXES_AT_18 += ("ReduceMin", "ReduceProd", "ReduceSumSquare")


def adapter(op_types: str | tuple[str, ...], version: int):
    def register(function: Adapter) -> Adapter:
        for op_type in (op_types,) if isinstance(op_types, str) else op_types:
            _ADAPTERS.setdefault(op_type, []).append((version, function))
        return function

    return register


def const_ints(value: ir.Value | None) -> list[int] | None:
    if value is None:
        return None
    tensor = value.const_value
    if tensor is None:
        producer = value.producer()
        if producer is not None and producer.op_type == "Constant" and "value" in producer.attributes:
            tensor = producer.attributes["value"].value
    return None if tensor is None else [int(v) for v in np.asarray(tensor.numpy()).reshape(-1)]


def _set_attr(node: ir.Node, name: str, value) -> None:
    if isinstance(value, list):
        node.attributes[name] = ir.Attr(name, ir.AttributeType.INTS, value)
    else:
        node.attributes[name] = ir.Attr(name, ir.AttributeType.INT, int(value))


@adapter(_REDUCE_AXES_AT_18, 18)
def _reduce_axes_to_attribute(e: Emitter, node: ir.Node) -> str | None:
    noop = int(_attr(node, "noop_with_empty_axes", 0))
    axes_input = node.inputs[1] if len(node.inputs) > 1 else None
    if axes_input is None:
        if noop:
            return f"{_label(node)}: noop_with_empty_axes=1 without axes has no opset-17 form"
        node.attributes.pop("noop_with_empty_axes", None)
        return None
    axes = const_ints(axes_input)
    if axes is None:
        return f"{_label(node)}: {node.op_type} axes are not constant, so they cannot become an attribute"
    if not axes and noop:
        return f"{_label(node)}: empty axes with noop_with_empty_axes=1 has no opset-17 form"
    node.resize_inputs(1)
    node.attributes.pop("noop_with_empty_axes", None)
    if axes:  # empty axes without noop reduce every axis, as a missing attribute does before 18
        _set_attr(node, "axes", axes)
    return None


@adapter("Split", 18)
def _split_num_outputs(e: Emitter, node: ir.Node) -> str | None:
    count = _attr(node, "num_outputs")
    if count is None:
        return None
    node.attributes.pop("num_outputs")
    x = node.inputs[0]
    axis = int(_attr(node, "axis", 0))
    dim = x.shape[axis] if x.shape is not None and -len(x.shape) <= axis < len(x.shape) else None
    if isinstance(dim, int) and dim % int(count) == 0:
        return None  # opset 13-17 split evenly over the outputs, as num_outputs did
    if not isinstance(dim, int):
        return f"{_label(node)}: Split num_outputs over an unknown or uneven dim has no opset-17 form"
    chunk = math.ceil(dim / int(count))
    sizes = [chunk] * (int(count) - 1) + [dim - chunk * (int(count) - 1)]
    node.resize_inputs(2)
    node.replace_input_with(1, e.const(np.array(sizes, dtype=np.int64)))
    return None


@adapter("Pad", 18)
def _pad_axes(e: Emitter, node: ir.Node) -> str | None:
    if len(node.inputs) < 4 or node.inputs[3] is None:
        return None
    axes, pads, rank = const_ints(node.inputs[3]), const_ints(node.inputs[1]), _rank(node.inputs[0])
    if axes is None or pads is None or rank is None:
        return f"{_label(node)}: Pad axes need constant axes and pads and a known rank for the opset-17 form"
    full = [0] * (2 * rank)
    for index, axis in enumerate(axes):
        axis %= rank
        full[axis], full[rank + axis] = pads[index], pads[len(axes) + index]
    node.replace_input_with(1, e.const(np.array(full, dtype=np.int64)))
    node.resize_inputs(3)
    return None


@adapter("AveragePool", 19)
def _average_pool_dilations(e: Emitter, node: ir.Node) -> str | None:
    dilations = _attr(node, "dilations")
    if dilations is not None and any(int(d) != 1 for d in dilations):
        return f"{_label(node)}: AveragePool dilations {list(dilations)} have no form before opset 19"
    node.attributes.pop("dilations", None)
    return None


@adapter("LpPool", 18)
def _lp_pool_dilations(e: Emitter, node: ir.Node) -> str | None:
    return _average_pool_dilations(e, node)


@adapter("Resize", 18)
def _resize_axes(e: Emitter, node: ir.Node) -> str | None:
    axes = _attr(node, "axes")
    if axes is None:
        return None
    rank = _rank(node.inputs[0])
    if rank is None or sorted(int(a) % rank for a in axes) != list(range(rank)):
        return f"{_label(node)}: Resize over a subset of axes has no form before opset 18"
    node.attributes.pop("axes")
    return None


@adapter("GridSample", 20)
def _grid_sample_modes(e: Emitter, node: ir.Node) -> str | None:
    mode = _attr(node, "mode", "linear")
    old = {"linear": "bilinear", "cubic": "bicubic", "nearest": "nearest"}.get(mode)
    if old is None:
        return f"{_label(node)}: GridSample mode {mode!r} has no form before opset 20"
    if _rank(node.inputs[0]) not in (None, 4):
        return f"{_label(node)}: GridSample before opset 20 takes 4-D input only"
    node.attributes["mode"] = ir.Attr("mode", ir.AttributeType.STRING, old)
    return None


def _added_attributes(node: ir.Node, crossed: Callable[[int], bool]) -> str | None:
    for version, name, keeps_old, new_default in _ADDED_ATTRIBUTES.get(node.op_type, ()):
        if not crossed(version):
            continue
        value = _attr(node, name, new_default)
        if value not in keeps_old:
            return f"{_label(node)}: {node.op_type} {name}={value!r} (opset {version}) has no older form"
        node.attributes.pop(name, None)
    for version, name, new_values in _NEW_VALUES.get(node.op_type, ()):
        if crossed(version) and _attr(node, name) in new_values:
            return f"{_label(node)}: {node.op_type} {name}={_attr(node, name)!r} (opset {version}) has no older form"
    return None


# ---- the conversion ---------------------------------------------------------------------------------


def convert_opset(
    model: ir.Model, low: int, high: int, disabled: frozenset[str] = frozenset()
) -> OpsetConversion:
    """``model`` with its ai.onnx opset inside [low, high], or unchanged with the reason."""
    current = default_opset(model)
    if current is None or low <= current <= high:
        return OpsetConversion(model)
    if current < low:
        return _upgrade(model, current, low, disabled)
    return _downgrade(model, current, high, disabled)


def _upgrade(model: ir.Model, current: int, target: int, disabled: frozenset[str]) -> OpsetConversion:
    if OPSET_UPGRADE in disabled:
        return OpsetConversion(model, refused=f"opset {current} is below {target} and {OPSET_UPGRADE} is off")
    try:
        converted = onnx.version_converter.convert_version(ir.to_proto(model), target)
    except Exception as error:  # the converter raises bare RuntimeErrors from C++
        return OpsetConversion(
            model, refused=f"onnx's version converter could not lift opset {current}: {error}"
        )
    result = ir.from_proto(converted)
    return OpsetConversion(
        result, [OPSET_UPGRADE], [f"ai.onnx opset {current} -> {target} (onnx version converter)"]
    )


def _downgrade(model: ir.Model, current: int, target: int, disabled: frozenset[str]) -> OpsetConversion:
    if OPSET_DOWNGRADE in disabled:
        return OpsetConversion(
            model, refused=f"opset {current} is above {target} and {OPSET_DOWNGRADE} is off"
        )
    work = model.clone()
    infer_shapes(work)  # decompositions and adapters read ranks and dims
    applied: list[str] = []
    counts: dict[str, int] = {}
    for node in list(ir.traversal.RecursiveGraphIterator(work.graph)):
        if node.domain not in _DEFAULT_DOMAINS:
            continue
        now, then = since_version(node.op_type, current), since_version(node.op_type, target)
        if now == then:
            continue
        emitter = Emitter(work, node, target)
        reason = None
        if node.op_type in _DECOMPOSITIONS and (then is None or _semantics_changed(node.op_type, then, now)):
            name, function = _DECOMPOSITIONS[node.op_type]
            if name in disabled:
                reason = f"{_label(node)}: {node.op_type} has no opset-{target} form and {name} is off"
            else:
                outputs = function(emitter, node, now)
                if isinstance(outputs, str):
                    reason = outputs
                else:
                    replace_node(node, outputs)
                    counts[name] = counts.get(name, 0) + 1
                    if name not in applied:
                        applied.append(name)
        elif then is None:
            reason = (
                f"{_label(node)}: {node.op_type} exists only from opset {now}, and no decomposition is known"
            )
        else:
            reason = _added_attributes(node, lambda v, t=then, n=now: t < v <= n)
            for version, function in _ADAPTERS.get(node.op_type, ()):
                if reason is None and then < version <= now:
                    reason = function(emitter, node)
        if reason is not None:
            return OpsetConversion(model, refused=f"cannot lower opset {current} to {target}: {reason}")
    work.opset_imports[""] = target
    work.opset_imports.pop("ai.onnx", None)
    # Inputs the adapters turned into attributes (Reduce axes, Pad axes) leave their constants unused.
    onnx_ir.passes.common.RemoveUnusedNodesPass()(work)
    infer_shapes(work)  # the values the decompositions created, for the mapper and the memory plan
    problem = _check(work)
    if problem is not None:
        return OpsetConversion(model, refused=f"cannot lower opset {current} to {target}: {problem}")
    notes = [f"ai.onnx opset {current} -> {target}"]
    notes += [f"{name}: {count} node(s)" for name, count in counts.items()]
    return OpsetConversion(work, [OPSET_DOWNGRADE, *applied], notes)


def infer_shapes(model: ir.Model) -> None:
    try:
        ir.passes.common.ShapeInferencePass(strict_mode=False)(model)
    except Exception:  # noqa: BLE001 - inference is a help here, never a requirement
        pass


def _semantics_changed(op_type: str, then: int, now: int) -> bool:
    """GroupNormalization-21 means something else than -18 (per-channel scale): decompose that too."""
    return op_type == "GroupNormalization" and then < 21 <= now


def _label(node: ir.Node) -> str:
    return node.name or node.op_type


def is_used(value: ir.Value) -> bool:
    return bool(value.uses()) or value.is_graph_output()


def replace_node(node: ir.Node, outputs: list[ir.Value | None]) -> None:
    graph = node.graph
    for old, new in zip(node.outputs, outputs, strict=False):
        if new is None:
            continue
        name = old.name
        new.shape, new.type = old.shape, old.type
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        old.name = None
        new.name = name
    graph.remove(node, safe=True)


def _check(model: ir.Model) -> str | None:
    """onnx's checker at the new opset: the older schemas' attributes, inputs and types (on the model with its
    weights as typed inputs: neither reads their values)."""
    proto = weightless_proto(model)
    try:
        onnx.checker.check_model(proto)
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        return str(error).splitlines()[0]
    return None
