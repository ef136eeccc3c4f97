"""Per-op int8 against fp32 timings in the kernel cache: a layer measured once on a machine is not profiled again.

``costing.profile_int8_vs_fp32`` times every quantisable layer of a model in interleaved rounds; what
``decide`` needs of one layer is its per-round seconds ``(t_fp32[i], t_int8[i])``. Those are stored in the
kernel cache, as the Fusion Switcher's kernel measurements are, under a key made of:

* the layer's signature (``layer_signature``): op type, domain, opset, attributes, input and output shapes
  (at the profiled inputs' shapes) and dtypes, which inputs are weights (their shapes, never their values);
* how it is quantised in the QDQ model: per input, the dequantised type, scale shape and axis (per-channel or
  not); per output, whether it is quantised again and to what type;
* its neighbours in both graphs (the producers of its inputs, the readers of its outputs, whether they are
  int8 too): they decide which QuantizeLinear/DequantizeLinear kernels are charged to it (``attribute``) and
  which activations ONNX Runtime fuses into its kernel, so a layer's figure is only comparable with another
  taken in the same surroundings;
* the whole format (``Int8Format``), the profile's rounds and warm-up runs (a cached figure feeds
  ``significance.paired`` with as many rounds as a fresh one), ONNX Runtime's version, the target and this
  compiler's version, and ``machine_fingerprint`` (the CPU with the vector extensions its kernels choose
  code paths by).

Layers of one model with one key share one figure, the first measured (graph order): within a compile and
across compiles identical layers are decided alike. A compile whose every layer hits skips the profile; a
partial hit profiles the whole model (a layer cannot be profiled alone in its surroundings) and stores the
misses, the hits keeping their cached figures. ``sources`` says per layer where its figures came from.

A figure is a layer's kernel time inside a whole-model run: the same layer in another model with the same
surroundings ran after different work (what sits in the CPU caches differs), a difference the key cannot
see and the 10% ``KERNEL_MIN_EFFECT`` of ``decide`` is meant to absorb.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from flexdsa_core.cache import KernelCache, TargetIdentity, kernel_key
from flexdsa_core.kernel_timing import machine_fingerprint

__all__ = ["CostingScope", "cached_profile", "layer_signatures", "timing_keys"]

# Bumped when what a figure means changes (attribution, units): older entries then simply miss.
FIGURE_VERSION = 1
MEASURED, CACHED = "measured", "kernel cache"
# How far a layer's surroundings are part of its key: its neighbours and theirs.
NEIGHBOUR_DEPTH = 2
# Initializers up to this many elements stay constants for shape inference (Reshape's shape, Slice's ends).
_INFERENCE_CONSTANT_ELEMENTS = 64

Timings = dict[str, tuple[list[float], list[float]]]


@dataclass(frozen=True)
class CostingScope:
    """What a per-op figure is valid for besides the layer itself: the int8 format, the profile's rounds and
    warm-up, the target, this compiler and this machine."""

    quant_format: Mapping
    rounds: int
    warmup: int
    target: TargetIdentity  # the spec (its whole content is in the key, not only its name)
    compiler_version: str
    machine: str = field(default_factory=machine_fingerprint)

    def key(self, signature: Mapping) -> str:
        canonical = {
            "int8_vs_fp32": FIGURE_VERSION,
            "layer": signature,
            "format": dict(sorted(self.quant_format.items())),
            "profile": {"rounds": self.rounds, "warmup": self.warmup, "level": "all", "threads": 1},
            "runtime": {"ort": ort.__version__},
            "machine": self.machine,
        }
        return kernel_key(canonical, self.target, self.compiler_version)


def _dims(value: onnx.ValueInfoProto, bound: Mapping[str, int]) -> list[int] | None:
    """Concrete dims of ``value`` (its named dims bound by the profiled inputs); None if any is unknown."""
    if not value.type.HasField("tensor_type") or not value.type.tensor_type.HasField("shape"):
        return None
    dims = []
    for dim in value.type.tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(dim.dim_value)
        elif dim.dim_param in bound:
            dims.append(bound[dim.dim_param])
        else:
            return None
    return dims


def _tensor_types(model: onnx.ModelProto, feed: Mapping[str, np.ndarray]) -> dict[str, tuple[list[int], str]]:
    """(shape, dtype) of every tensor of ``model`` at the shapes of ``feed``: ONNX shape inference with the
    inputs fixed to them; tensors it cannot infer (ops of other domains) from the model's own value_info,
    its named dims bound by the inputs."""
    bound: dict[str, int] = {}
    for value in model.graph.input:
        if value.name in feed:
            for dim, size in zip(value.type.tensor_type.shape.dim, np.shape(feed[value.name]), strict=False):
                if dim.dim_param:
                    bound.setdefault(dim.dim_param, int(size))
    declared = {v.name: v for v in [*model.graph.value_info, *model.graph.output]}
    concrete = onnx.ModelProto()  # the graph without its large weights: they become typed inputs
    concrete.ir_version = model.ir_version
    concrete.opset_import.extend(model.opset_import)
    concrete.graph.node.extend(model.graph.node)
    concrete.graph.output.extend(model.graph.output)
    for value in model.graph.input:
        added = concrete.graph.input.add()
        added.CopyFrom(value)
        if value.name in feed:  # fixed to the profiled input's shape
            shape = added.type.tensor_type.shape
            del shape.dim[:]
            for size in np.shape(feed[value.name]):
                shape.dim.add().dim_value = int(size)
    listed = {value.name for value in model.graph.input}
    for init in model.graph.initializer:
        if (
            math.prod(init.dims) <= _INFERENCE_CONSTANT_ELEMENTS
        ):  # shape arguments: data propagation reads them
            concrete.graph.initializer.append(init)
        elif init.name not in listed:
            concrete.graph.input.append(
                onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            )
    try:
        inferred = onnx.shape_inference.infer_shapes(concrete, strict_mode=False, data_prop=True)
    except Exception:  # noqa: BLE001 - inference failing leaves the declared shapes
        inferred = concrete
    found: dict[str, tuple[list[int], str]] = {}
    for init in model.graph.initializer:
        found[init.name] = (list(init.dims), onnx.helper.tensor_dtype_to_np_dtype(init.data_type).name)
    for value in [
        *declared.values(),
        *inferred.graph.input,
        *inferred.graph.value_info,
        *inferred.graph.output,
    ]:
        elem = value.type.tensor_type.elem_type
        dims = _dims(value, bound)
        if dims is not None and elem:
            found[value.name] = (dims, onnx.helper.tensor_dtype_to_np_dtype(elem).name)
    return found


def _attribute(attr: onnx.AttributeProto) -> object:
    value = onnx.helper.get_attribute_value(attr)
    if isinstance(value, onnx.GraphProto) or (
        isinstance(value, list) and value and isinstance(value[0], onnx.GraphProto)
    ):
        raise ValueError(f"attribute {attr.name!r} holds a subgraph")
    if isinstance(value, onnx.TensorProto):
        return {"tensor": hashlib.sha256(value.SerializeToString()).hexdigest()}
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, list):
        return [v.decode(errors="replace") if isinstance(v, bytes) else v for v in value]
    return value


def _op(node: onnx.NodeProto) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain else node.op_type


class _Tensors:
    """Producer, readers and initializer of each tensor of a graph."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self.nodes = {node.name: node for node in model.graph.node}
        self.producer: dict[str, onnx.NodeProto] = {}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in model.graph.node:
            for name in node.output:
                self.producer[name] = node
            for name in node.input:
                if name:
                    self.readers.setdefault(name, []).append(node)
        self.initializers = {init.name: init for init in model.graph.initializer}
        self.outputs = {value.name for value in model.graph.output}

    def int_type(self, name: str) -> str | None:
        """The element type of an initializer (a zero point or a quantised weight), numpy's name."""
        init = self.initializers.get(name)
        return None if init is None else onnx.helper.tensor_dtype_to_np_dtype(init.data_type).name


def _quantised_input(qdq: _Tensors, name: str) -> dict | None:
    """How the QDQ graph feeds one input of a layer: None when float, else the dequantised type, the
    scale's shape and axis (per-channel or per-tensor), and whether the int8 tensor is a weight."""
    dq = qdq.producer.get(name)
    if dq is None or dq.op_type != "DequantizeLinear":
        return None
    source = dq.input[0]
    int_type = qdq.int_type(dq.input[2]) if len(dq.input) > 2 and dq.input[2] else None
    if int_type is None:
        int_type = qdq.int_type(source)
    if int_type is None and source in qdq.producer and qdq.producer[source].op_type == "QuantizeLinear":
        q = qdq.producer[source]
        int_type = qdq.int_type(q.input[2]) if len(q.input) > 2 and q.input[2] else "uint8"
    scale = qdq.initializers.get(dq.input[1])
    axis = next((a.i for a in dq.attribute if a.name == "axis"), None)
    return {
        "type": int_type,
        "scale_shape": None if scale is None else list(scale.dims),
        "axis": axis,
        "weight": source in qdq.initializers,
    }


def _quantised_output(qdq: _Tensors, name: str) -> list[str]:
    """The types a layer's output is quantised to in the QDQ graph (empty: it stays float)."""
    types = []
    for reader in qdq.readers.get(name, []):
        if reader.op_type == "QuantizeLinear":
            types.append(
                qdq.int_type(reader.input[2]) if len(reader.input) > 2 and reader.input[2] else "uint8"
            )
    return sorted(types)


def _neighbours(
    graph: _Tensors, node: onnx.NodeProto, layers: set[str], depth: int = NEIGHBOUR_DEPTH
) -> dict:
    """The producers of ``node``'s inputs and the readers of its outputs, whether each is a layer, and theirs
    in turn to ``depth`` steps (``attribute`` charges a Q/DQ up to two producers away to a layer)."""

    def described(other: onnx.NodeProto) -> list:
        near = [_op(other), other.name in layers]
        return near + ([_neighbours(graph, other, layers, depth - 1)] if depth > 1 else [])

    producers = []
    for name in node.input:
        if not name or name in graph.initializers:
            producers.append(None)
        else:
            producer = graph.producer.get(name)
            producers.append("input" if producer is None else described(producer))
    readers = [
        sorted((described(reader) for reader in graph.readers.get(name, [])), key=json.dumps)
        for name in node.output
    ]
    return {
        "producers": producers,
        "readers": readers,
        "graph_outputs": [name in graph.outputs for name in node.output],
    }


def _layer_signature(fp32: _Tensors, qdq: _Tensors, node: onnx.NodeProto, types: Mapping, layers: set[str],
                     opsets: Mapping[str, int]) -> dict:  # fmt: skip
    def tensor(name: str) -> dict | None:
        if not name:
            return None
        if name not in types:
            raise ValueError(f"the shape of {name!r} is not known at the profiled inputs")
        shape, dtype = types[name]
        return {"shape": shape, "dtype": dtype, "weight": name in fp32.initializers}

    qdq_node = qdq.nodes.get(node.name)
    if qdq_node is None:
        raise ValueError("not in the quantised model")
    return {
        "op": node.op_type,
        "domain": node.domain,
        "opset": opsets.get(node.domain, 1),
        "attrs": {attr.name: _attribute(attr) for attr in sorted(node.attribute, key=lambda a: a.name)},
        "inputs": [tensor(name) for name in node.input],
        "outputs": [tensor(name) for name in node.output],
        "int8_inputs": [_quantised_input(qdq, name) if name else None for name in qdq_node.input],
        "int8_outputs": [_quantised_output(qdq, name) for name in qdq_node.output],
        # Every layer is int8 in the profiled model: the Q/DQ pairs between two of them are fused away, between
        # a layer and a float neighbour they run and are charged to the layer.
        "neighbours": _neighbours(fp32, node, layers),
    }


def layer_signatures(fp32: onnx.ModelProto, quantized: onnx.ModelProto, layers: Sequence[str],
                     feed: Mapping[str, np.ndarray]) -> dict[str, dict | str]:  # fmt: skip
    """Per layer, its signature (what its figure depends on, no weight values), or why it has none (a
    sentence): a shape unknown at the profiled inputs, a subgraph attribute."""
    fp32_graph, qdq_graph, wanted = _Tensors(fp32), _Tensors(quantized), set(layers)
    types = _tensor_types(fp32, feed)
    opsets = {opset.domain: opset.version for opset in fp32.opset_import}
    signatures: dict[str, dict | str] = {}
    for layer in layers:
        node = fp32_graph.nodes.get(layer)
        try:
            if node is None:
                raise ValueError("not a node of the fp32 model")
            signatures[layer] = _layer_signature(fp32_graph, qdq_graph, node, types, wanted, opsets)
        except ValueError as err:
            signatures[layer] = str(err)
    return signatures


def timing_keys(signatures: Mapping[str, dict | str], scope: CostingScope) -> dict[str, str | None]:
    """Per layer, the kernel-cache key of its figure (None where it has no signature)."""
    return {layer: scope.key(sig) if isinstance(sig, dict) else None for layer, sig in signatures.items()}


def _read(cache: KernelCache, key: str, rounds: int) -> dict | None:
    try:
        raw = cache.get(key)
        entry = json.loads(raw) if raw is not None else None
    except Exception:  # noqa: BLE001 - a broken cache (or entry) is a cache that misses
        return None
    if not isinstance(entry, dict):
        return None
    fp32, int8 = entry.get("fp32_s"), entry.get("int8_s")
    if not (isinstance(fp32, list) and isinstance(int8, list) and len(fp32) == len(int8) == rounds):
        return None
    return entry


def cached_profile(
    fp32: Path, int8: Path, layers: Sequence[str], feed: Mapping, workdir: Path, *,
    cache: KernelCache | None, scope: CostingScope, profile: Callable[..., Timings],
) -> tuple[Timings, dict[str, str]]:  # fmt: skip
    """Per layer its per-round (fp32, int8) seconds, from the kernel cache where every layer's figure is
    there, else from one ``profile`` of the whole model (hits keep their cached figures, misses are stored);
    and per layer where its figures came from: ``"kernel cache"``, ``"measured"``, ``"measured: identical
    to <layer>"`` or ``"measured (not cached: <why>)"``."""
    source = onnx.load(str(fp32), load_external_data=False)
    signatures = layer_signatures(source, onnx.load(str(int8), load_external_data=False), layers, feed)
    keys = timing_keys(signatures, scope)
    first_of: dict[str, str] = {}  # key -> the first layer (graph order) with it: whose figure the key holds
    for layer in layers:
        if keys[layer] is not None:
            first_of.setdefault(keys[layer], layer)
    hits = {
        key: entry for key in first_of if cache is not None and (entry := _read(cache, key, scope.rounds))
    }

    measured: Timings = {}
    if any(key is None or key not in hits for key in keys.values()):
        started = time.perf_counter()
        measured = profile(fp32, int8, list(layers), feed, workdir, rounds=scope.rounds, warmup=scope.warmup)
        share = (time.perf_counter() - started) / max(1, len(first_of) - len(hits))
        for key, layer in first_of.items():
            if key not in hits and cache is not None:
                fp32_s, int8_s = measured[layer]
                entry = {"fp32_s": list(fp32_s), "int8_s": list(int8_s), "layer": layer, "measure_s": share}
                try:
                    cache.put(key, json.dumps(entry).encode())
                except Exception:  # noqa: BLE001 - a cache that cannot write is a cache that misses next time
                    pass

    saved = getattr(cache, "saved", None)
    timings: Timings = {}
    sources: dict[str, str] = {}
    for layer in layers:
        key = keys[layer]
        if key is None:
            timings[layer], sources[layer] = measured[layer], f"{MEASURED} (not cached: {signatures[layer]})"
        elif key in hits:
            entry = hits[key]
            timings[layer], sources[layer] = (list(entry["fp32_s"]), list(entry["int8_s"])), CACHED
        else:
            first = first_of[key]
            timings[layer] = measured[first]
            sources[layer] = MEASURED if first == layer else f"{MEASURED}: identical to {first}"
    if callable(saved) and not measured:
        saved(sum(float(entry.get("measure_s", 0.0)) for entry in hits.values()))
    return timings, sources
