"""ONNX Runtime sessions that read large weights where they already are in memory.

ONNX Runtime takes an initializer either inside the model's protobuf or, declared as external data, from an
``OrtValue`` handed to it (``SessionOptions.add_external_initializers``), which it then reads in place.
Inside the protobuf a weight is copied several times before the first run: into a TensorProto, into the
graph and model messages, into the serialised bytes, and into ONNX Runtime's own buffer. Timing GPT-2's
tied 154 MB LM head alone took 1.1-1.3 s per single-node session that way, and a BERT-base-width model's
validation session 0.37 s against 0.13 s. Here the protobuf carries the graph with each large initializer
declared external (name, type, shape; no data), and the arrays go to the session beside it, each copied
once onto a 64-byte boundary: what ONNX Runtime's own allocator gives its copy, so kernels read a weight at
the alignment they would read it at anyway.

An ``InMemoryModel`` is such a pair: ``from_ir`` makes one of an onnx_ir model (a finished model: nothing may
change it while a session made from it lives), ``from_proto`` of a parsed upload as it was read, and
``session`` opens it. Within ``arrays_scope`` each tensor becomes an array once: the original and the
optimised model share most of their weights, and each is loaded at two optimisation levels (validation at
ORT_DISABLE_ALL, then the never-slower check at ORT_ENABLE_ALL).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

# Tensors under this many bytes stay inside the protobuf: copying them costs less than an OrtValue.
EXTERNAL_MIN_BYTES = 4096
ALIGNMENT = 64  # bytes: a cache line, and what ONNX Runtime's own allocator gives its tensors
# Where an in-memory initializer is declared to live; ONNX Runtime never opens it (the OrtValue stands in).
IN_MEMORY_LOCATION = "flexdsa-in-memory"

# Arrays a scope keeps at most (bytes): past it, an array is made for each session and not kept.
SCOPE_MAX_BYTES = 1 << 30
_KEPT_MODELS = 4  # the bisections compile several variants; the latest few are kept (as ``serialized`` does)


class _Kept(dict):
    """id(tensor) -> (tensor, its array); the tensor is held so that its id stays its own. ``models``:
    id(model) -> (model, its ``InMemoryModel``), the latest few."""

    def __init__(self) -> None:
        super().__init__()
        self.nbytes = 0
        self.models: dict[int, tuple[ir.Model, InMemoryModel]] = {}


_arrays: contextvars.ContextVar[_Kept | None] = contextvars.ContextVar("in_memory_arrays", default=None)


@contextlib.contextmanager
def arrays_scope() -> Iterator[None]:
    """Within this block each tensor handed to ONNX Runtime from memory becomes an array once (up to
    ``SCOPE_MAX_BYTES`` of them; tensors in external data files are never kept: they are memory-mapped)."""
    token = _arrays.set(_Kept())
    try:
        yield
    finally:
        _arrays.reset(token)


def release_arrays() -> None:
    """Forget what the current ``arrays_scope`` kept (the job's sessions are done): the arrays go with the
    last session that reads them, before the artifacts are serialised (on PP-OCRv4 rec, 22 MiB of copies
    of its 10 MiB of weights, of the models validated, legalised and probed on the way)."""
    kept = _arrays.get()
    if kept is not None:
        kept.clear()
        kept.models.clear()
        kept.nbytes = 0


def aligned(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of ``array`` starting on an ``ALIGNMENT``-byte boundary."""
    buffer = np.empty(array.nbytes + ALIGNMENT, dtype=np.uint8)
    offset = (-buffer.ctypes.data) % ALIGNMENT
    copy = buffer[offset : offset + array.nbytes].view(array.dtype).reshape(array.shape)
    copy[...] = array
    return copy


def _array_of(tensor: ir.TensorProtocol | np.ndarray) -> np.ndarray:
    kept = _arrays.get()
    if kept is not None:
        entry = kept.get(id(tensor))
        if entry is not None and entry[0] is tensor:  # held, so the id is still this tensor's
            return entry[1]
    array = np.asarray(tensor if isinstance(tensor, np.ndarray) else tensor.numpy())
    if not _in_place(tensor, array):
        array = aligned(array)
    if kept is not None and not isinstance(tensor, ir.ExternalTensor) and kept.nbytes + array.nbytes <= SCOPE_MAX_BYTES:
        kept[id(tensor)] = (tensor, array)
        kept.nbytes += array.nbytes
    return array


def _in_place(tensor: ir.TensorProtocol | np.ndarray, array: np.ndarray) -> bool:
    """Whether ONNX Runtime may read ``tensor``'s own array: an ``ir.Tensor`` over an array already laid out as
    ``aligned`` makes it (a finished model's tensors are not written to while a session reads them)."""
    return (
        isinstance(tensor, ir.Tensor)
        and tensor.raw is array
        and array.flags.c_contiguous
        and array.ctypes.data % ALIGNMENT == 0
    )


def owned_arrays(model: ir.Model, *, share_with: ir.Model | None = None) -> None:
    """Make ``model``'s in-memory initializers ``ir.Tensor``s over aligned arrays of their own (same values,
    dtype, name), which sessions then read in place: for a model just parsed from a file, whose tensors would
    otherwise keep the parsed protobuf alive beside the arrays the sessions read (a second copy of every
    weight). Tensors of other kinds (strings, external data) stay as they are.

    ``share_with``: the model this one was made from. A weight that has the same name there and the same
    bytes (dtype, shape, every bit) takes that model's array instead of a copy: ONNX Runtime's offline layout
    (cpu-ort, on models with convolutions) reorders the convolutions' filters and leaves the other weights as
    they were (PP-OCRv4 rec: 4 of its 10 MiB), and each bucket held its own copy of those for the whole job."""
    sources = share_with.graph.initializers if share_with is not None else {}
    for name, value in model.graph.initializers.items():
        tensor = value.const_value
        if tensor is None or isinstance(tensor, (ir.Tensor, ir.ExternalTensor)):
            continue
        if tensor.dtype in _NOT_ARRAYS:
            continue
        array = np.asarray(tensor.numpy())
        source = sources[name].const_value if name in sources else None
        shared = _same_array(source, array) if source is not None else None
        value.const_value = _over(tensor, shared if shared is not None else aligned(array))


def share_weights(model: ir.Model, earlier: Sequence[ir.Model]) -> int:
    """Give ``model`` the tensors of ``earlier`` models' weights of the same name, dtype, fields and bits, so
    that one tensor serves them all (and ONNX Runtime's sessions of each get one array: ``arrays_scope`` keeps
    one per tensor); returns the bytes no longer held twice. A job's buckets are one model specialised at
    different shapes, and the passes and fusions make the same new weights in each (BERT-base: 81 MiB per
    bucket)."""
    saved = 0
    for name, value in model.graph.initializers.items():
        tensor = value.const_value
        if not isinstance(tensor, ir.Tensor) or not isinstance(tensor.raw, np.ndarray):
            continue
        for other in earlier:
            source = other.graph.initializers.get(name)
            found = source.const_value if source is not None else None
            if found is tensor:
                break
            if (
                isinstance(found, ir.Tensor)
                and found.dtype == tensor.dtype
                and found.name == tensor.name
                and found.doc_string == tensor.doc_string
                and dict(found.metadata_props) == dict(tensor.metadata_props)
                and _same_array(found, tensor.raw, in_place=False) is not None
            ):
                value.const_value = found
                saved += tensor.nbytes
                break
    return saved


def align_weights(model: ir.Model) -> None:
    """Give ``model``'s in-memory weights that ONNX Runtime could not read in place (arrays the passes made,
    not on an ``ALIGNMENT`` boundary or not contiguous) an aligned array of their own, once. Otherwise every
    session of the model made its own aligned copy of them (BERT-base: 81 MiB per bucket per session, more
    than ``arrays_scope`` keeps)."""
    for value in model.graph.initializers.values():
        tensor = value.const_value
        if not isinstance(tensor, ir.Tensor) or not isinstance(tensor.raw, np.ndarray):
            continue
        if tensor.dtype not in _NOT_ARRAYS and not _in_place(tensor, tensor.raw):
            value.const_value = _over(tensor, aligned(tensor.raw))


def _over(tensor: ir.TensorProtocol, array: np.ndarray) -> ir.Tensor:
    """``tensor`` (dtype, name, doc string, metadata) over ``array``, which holds its values."""
    return ir.Tensor(
        array, dtype=tensor.dtype, name=tensor.name, doc_string=tensor.doc_string,
        metadata_props=dict(tensor.metadata_props),
    )  # fmt: skip


def _same_array(source: ir.TensorProtocol | None, array: np.ndarray, *, in_place: bool = True) -> np.ndarray | None:
    """``source``'s own array where it holds exactly ``array``'s bits (and, ``in_place``, sessions may read it
    in place)."""
    if not isinstance(source, ir.Tensor) or source.dtype in _NOT_ARRAYS:
        return None
    own = source.raw
    if not isinstance(own, np.ndarray) or (in_place and not _in_place(source, own)):
        return None
    if own is array:
        return own
    if own.dtype != array.dtype or own.shape != array.shape or not _same_bits(own, array):
        return None
    return own


_COMPARE_CHUNK = 1 << 20


def _same_bits(first: np.ndarray, second: np.ndarray) -> bool:
    """Every byte equal (``-0.0`` is not ``0.0``, a NaN equals itself), compared a chunk at a time: no
    temporary the size of the weight, and the first difference ends it."""
    first = np.ascontiguousarray(first).reshape(-1).view(np.uint8)
    second = np.ascontiguousarray(second).reshape(-1).view(np.uint8)
    return all(
        np.array_equal(first[at : at + _COMPARE_CHUNK], second[at : at + _COMPARE_CHUNK])
        for at in range(0, first.size, _COMPARE_CHUNK)
    )


# Fields a TensorProto may have for an ``ir.Tensor`` of its values to serialise to the same bytes.
_PLAIN_FIELDS = frozenset({"name", "doc_string", "data_type", "dims", "raw_data"})
_NOT_ARRAYS = (ir.DataType.STRING, ir.DataType.UNDEFINED)


def detach_from_proto(model: ir.Model) -> None:
    """Make every tensor of ``model`` that reads the protobuf it was parsed from (``ir.serde``'s
    ``TensorProtoTensor``: initializers, Constant values, any tensor attribute, in subgraphs and functions too)
    independent of that protobuf, so that the parsed upload can go once nothing else holds it: a tensor of it
    keeps the whole message alive. Large tensors stored as raw bytes become ``ir.Tensor``s over aligned arrays
    of their own, which serialise to the same bytes and which sessions read in place; the others keep their
    exact representation in a TensorProto of their own. On PP-OCRv4 rec (its 10.8 MB of weights in Constant
    nodes) this replaces the parsed upload and the aligned copies its sessions made of it by one copy."""
    for graph in model.graphs():
        for value in graph.initializers.values():
            if value.const_value is not None:
                value.const_value = _detached(value.const_value)
    nodes = [node for graph in model.graphs() for node in graph]
    for function in model.functions.values():
        nodes.extend(ir.traversal.RecursiveGraphIterator(function))
    for node in nodes:
        for name, attribute in list(node.attributes.items()):
            if attribute.type == ir.AttributeType.TENSOR:
                node.attributes[name] = ir.AttrTensor(name, _detached(attribute.value), doc_string=attribute.doc_string)
            elif attribute.type == ir.AttributeType.TENSORS:
                tensors = [_detached(tensor) for tensor in attribute.value]
                node.attributes[name] = ir.AttrTensors(name, tensors, doc_string=attribute.doc_string)


def _detached(tensor: ir.TensorProtocol) -> ir.TensorProtocol:
    if not isinstance(tensor, ir.serde.TensorProtoTensor):
        return tensor
    proto = tensor.raw
    fields = {field.name for field, _ in proto.ListFields()}
    plain = "raw_data" in fields and fields <= _PLAIN_FIELDS and tensor.dtype not in _NOT_ARRAYS
    if plain and tensor.dtype.bitwidth % 8 == 0 and tensor.nbytes >= EXTERNAL_MIN_BYTES:
        array = aligned(np.asarray(tensor.numpy()))
        if array.nbytes == len(proto.raw_data):
            return ir.Tensor(array, dtype=tensor.dtype, name=tensor.name, doc_string=tensor.doc_string)
    copy = onnx.TensorProto()
    copy.CopyFrom(proto)
    return ir.serde.TensorProtoTensor(copy)


def _declared(name: str, data_type: int, dims) -> onnx.TensorProto:
    """A TensorProto naming an initializer whose data ONNX Runtime gets as an OrtValue."""
    tensor = onnx.TensorProto(name=name, data_type=data_type, dims=[int(d) for d in dims])
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", IN_MEMORY_LOCATION
    return tensor


def _in_memory(tensor: ir.TensorProtocol | None) -> bool:
    """Large enough to hand over as an array, and in memory (not a tensor in an external data file)."""
    return (
        tensor is not None
        and not isinstance(tensor, ir.ExternalTensor)
        and tensor.dtype not in (ir.DataType.STRING, ir.DataType.UNDEFINED)
        and tensor.nbytes >= EXTERNAL_MIN_BYTES
    )


# A model's metadata key naming ONNX Runtime graph optimizers that must not run when it is loaded (comma-
# separated): they would make again a fusion the compiler was told not to make (``targets/cpu_ort``).
ORT_DISABLED_OPTIMIZERS = "flexdsa.onnxruntime.disabled_optimizers"


def disabled_optimizers(metadata: Mapping[str, str]) -> tuple[str, ...]:
    """The ONNX Runtime optimizers a model's metadata (``ORT_DISABLED_OPTIMIZERS``) switches off."""
    return tuple(name for name in metadata.get(ORT_DISABLED_OPTIMIZERS, "").split(",") if name)


@dataclass(frozen=True)
class InMemoryModel:
    """A model as ONNX Runtime loads it here: the protobuf without its large initializers' data, and those
    initializers' tensors by name; ``disabled_optimizers``, what its metadata switches off at load."""

    proto: bytes
    weights: Mapping[str, ir.TensorProtocol | np.ndarray]
    disabled_optimizers: tuple[str, ...] = ()

    @staticmethod
    def from_ir(model: ir.Model, *, finished: bool = True) -> InMemoryModel:
        """``model`` with its large main-graph initializers in memory. While it is serialised those
        initializers stand as external declarations (put back before this returns). A ``finished`` model
        (nothing changes it any more) is made once within ``arrays_scope``: validation and the latency check
        load the same one."""
        kept = _arrays.get() if finished else None
        entry = kept.models.get(id(model)) if kept is not None else None
        if entry is not None and entry[0] is model:
            return entry[1]
        made = InMemoryModel._from_ir(model)
        if kept is not None:
            kept.models[id(model)] = (model, made)
            while len(kept.models) > _KEPT_MODELS:
                kept.models.pop(next(iter(kept.models)))
        return made

    @staticmethod
    def _from_ir(model: ir.Model) -> InMemoryModel:
        weights = {
            name: value.const_value for name, value in model.graph.initializers.items() if _in_memory(value.const_value)
        }
        values = {name: model.graph.initializers[name] for name in weights}
        constants = _weight_constants(model)  # output name -> (node, tensor)
        try:
            for name, value in values.items():
                tensor = value.const_value
                value.const_value = ir.ExternalTensor(
                    IN_MEMORY_LOCATION, None, None, tensor.dtype, shape=tensor.shape, name=name
                )
            for name, (node, tensor) in constants.items():  # serialised without their bytes, then lifted below
                stub = ir.ExternalTensor(IN_MEMORY_LOCATION, None, None, tensor.dtype, shape=tensor.shape, name=name)
                node.attributes["value"] = ir.AttrTensor("value", stub)
            proto = ir.to_proto(model)
        finally:
            for name, value in values.items():
                value.const_value = weights[name]
            for node, tensor in constants.values():
                node.attributes["value"] = ir.AttrTensor("value", tensor)
        if constants:
            proto.graph.CopyFrom(_lifted(proto.graph, constants, weights))
        return InMemoryModel(proto.SerializeToString(), weights, disabled_optimizers(model.metadata_props))

    @staticmethod
    def from_proto(proto: onnx.ModelProto, model: ir.Model) -> InMemoryModel:
        """``proto`` as parsed, its large main-graph initializers in memory; their tensors are ``model``'s (the
        onnx_ir model deserialised from ``proto``, whose tensors read the same messages). Every other field is
        copied as it is: this is the upload, not a re-serialisation of it."""
        light = onnx.ModelProto()
        _copy_fields(light, proto, skip="graph")
        constants = _weight_constants(model)
        _copy_fields(light.graph, proto.graph, skip="initializer", also="node" if constants else "")
        weights = {}
        if constants:
            light.graph.CopyFrom(_lifted(proto.graph, constants, weights, into=light.graph))
        for initializer in proto.graph.initializer:
            value = model.graph.initializers.get(initializer.name)
            tensor = value.const_value if value is not None else None
            if _in_memory(tensor) and initializer.data_location != onnx.TensorProto.EXTERNAL:
                light.graph.initializer.append(_declared(initializer.name, initializer.data_type, initializer.dims))
                weights[initializer.name] = tensor
            else:
                light.graph.initializer.append(initializer)
        metadata = {entry.key: entry.value for entry in proto.metadata_props}
        return InMemoryModel(light.SerializeToString(), weights, disabled_optimizers(metadata))

    def digest(self) -> str:
        """sha256 of the model as ONNX Runtime gets it (the protobuf, then each in-memory weight's name, dtype,
        shape and bytes): the same model gives the same digest, and no full serialisation is made for it (on
        PP-OCRv4 rec those bytes, 10.5 MB, were held through the never-slower check only to be hashed). The
        arrays hashed are the ones a session then reads (kept within ``arrays_scope``)."""
        digest = hashlib.sha256(self.proto)
        for name in sorted(self.weights):
            array = _array_of(self.weights[name])
            digest.update(f"\0{name}\0{array.dtype.str}\0{array.shape}\0".encode())
            digest.update(memoryview(np.ascontiguousarray(array)).cast("B"))
        return digest.hexdigest()

    def session(self, options: ort.SessionOptions) -> ort.InferenceSession:
        """A CPU session of this model. The arrays stay referenced by the session: ONNX Runtime reads them in
        place for as long as it lives."""
        names = list(self.weights)
        arrays = [_array_of(self.weights[name]) for name in names]
        values = [ort.OrtValue.ortvalue_from_numpy(array) for array in arrays]
        if names:
            options.add_external_initializers(names, values)
        session = ort.InferenceSession(
            self.proto, options, providers=["CPUExecutionProvider"], disabled_optimizers=list(self.disabled_optimizers)
        )
        session.flexdsa_weights = (arrays, values)
        return session


def session_with(proto: onnx.ModelProto, weights: Mapping[str, np.ndarray], options: ort.SessionOptions):
    """A session of ``proto`` whose initializers ``weights`` (already declared with ``declare``) come from
    memory: the single-node models of the cost model."""
    return InMemoryModel(proto.SerializeToString(), weights).session(options)


def declare(name: str, dtype: np.dtype, shape) -> onnx.TensorProto:
    """The declaration of an in-memory initializer named ``name`` (its data goes to ``session_with``)."""
    return _declared(name, onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape)


def _weight_constants(model: ir.Model) -> dict[str, tuple[ir.Node, ir.TensorProtocol]]:
    """The main graph's ``Constant`` nodes that hold a weight (paddle2onnx writes every weight so), by output
    name: ONNX Runtime makes every Constant an initializer when it loads a graph, so such a node goes to it
    as an in-memory initializer of the same name and tensor, like a large initializer, rather than as bytes
    in the protobuf that it parses and copies again (PP-OCRv4 rec: all of its 10.8 MB)."""
    found = {}
    for node in model.graph:
        tensor = weight_constant(node)
        if tensor is not None and node.outputs[0].name is not None and not node.outputs[0].is_graph_output():
            found[node.outputs[0].name] = (node, tensor)
    return found


def weight_constant(node: ir.Node) -> ir.TensorProtocol | None:
    """The weight a ``Constant`` node holds, when it is large enough to go to ONNX Runtime from memory."""
    if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or set(node.attributes) != {"value"}:
        return None
    tensor = node.attributes["value"].value
    return tensor if len(node.outputs) == 1 and _in_memory(tensor) else None


def _lifted(graph: onnx.GraphProto, constants, weights: dict, *, into: onnx.GraphProto | None = None):
    """``graph`` (or ``into``, which has its other fields already) with the nodes of ``constants`` replaced by
    in-memory initializer declarations; their tensors go to ``weights``."""
    lifted = onnx.GraphProto()
    if into is not None:
        lifted.CopyFrom(into)
    else:
        _copy_fields(lifted, graph, skip="node")
    for node in graph.node:
        name = node.output[0] if node.op_type == "Constant" and len(node.output) == 1 else None
        if name in constants:
            tensor = constants[name][1]
            lifted.initializer.append(_declared(name, int(tensor.dtype), [int(d) for d in tensor.shape]))
            weights[name] = tensor
        else:
            lifted.node.append(node)
    return lifted


def _copy_fields(target, source, *, skip: str, also: str = "") -> None:
    for field, content in source.ListFields():
        if field.name in (skip, also):
            continue
        if field.is_repeated:
            getattr(target, field.name).extend(content)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(content)
        else:
            setattr(target, field.name, content)
