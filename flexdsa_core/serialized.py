"""One serialisation per model: the bytes of a finished model, made once and shared by everything that
reads them (validation, the never-slower timing, the artifacts, ``OptimizeResult.model_bytes``).

Serialising a transformer of a few hundred MB costs about as much as loading it, and the pipeline used to
do it three to five times for the same model. Each serialisation is ``serialize``: the same bytes as
``ir.to_proto(model).SerializeToString()``, with the weights copied once instead of twice. Within ``serialization_scope()`` ``model_bytes(model)`` is
remembered for the models given to it (at most ``KEPT`` at a time, the latest; the bisections compile
several variants). The scope is opened where models are finished: nothing inside it may change a model
after it was serialised. Outside a scope every call serialises afresh.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import sys
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir

from flexdsa_core.wire import fields, length_delimited_key, varint

KEPT = 4

_scope: contextvars.ContextVar[OrderedDict[int, tuple[ir.Model, bytes]] | None] = contextvars.ContextVar(
    "serialization_scope", default=None
)


@contextlib.contextmanager
def serialization_scope() -> Iterator[None]:
    """Within this block ``model_bytes`` serialises each model once."""
    token = _scope.set(OrderedDict())
    try:
        yield
    finally:
        _scope.reset(token)


def model_bytes(model: ir.Model) -> bytes:
    """``model`` as ONNX protobuf bytes (models that fit protobuf's 2 GB; see ``ingest.needs_external_data``)."""
    kept = _scope.get()
    if kept is None:
        return serialize(model)
    entry = kept.get(id(model))
    if entry is not None and entry[0] is model:  # the model is held, so its id cannot have been reused
        kept.move_to_end(id(model))
        return entry[1]
    data = serialize(model)
    kept[id(model)] = (model, data)
    while len(kept) > KEPT:
        kept.popitem(last=False)
    return data


def kept_bytes(model: ir.Model) -> bytes | None:
    """The bytes ``model_bytes`` already made for ``model`` in this scope, or None (never serialises)."""
    entry = (_scope.get() or {}).get(id(model))
    return entry[1] if entry is not None and entry[0] is model else None


# -- serialising without a second copy of the weights ---------------------------------------------------------
# ``ir.to_proto(model).SerializeToString()`` holds every weight twice at its end: in the protobuf message and in
# the bytes made from it (BERT-base, 415 MiB of weights: the job's peak, 830 MiB above what it held). ``serialize``
# makes the same bytes from the message without its large initializers and each of those written on its own,
# read in place from its array where it can be: the weights are copied once, into the result. Protobuf writes
# a message's fields in field-number order, so the pieces go where the whole message would put them.

_MODEL_GRAPH = 7  # ModelProto.graph
_GRAPH_INITIALIZER = 5  # GraphProto.initializer
_TENSOR_RAW_DATA = 9  # TensorProto.raw_data
STREAM_MIN_BYTES = 1 << 16  # smaller initializers stay in the message


def serialize(model: ir.Model) -> bytes:
    """The bytes of ``ir.to_proto(model).SerializeToString()``, made without holding the weights twice."""
    return b"".join(_pieces(model))


def write(model: ir.Model, path: Path) -> None:
    """``serialize(model)`` written to ``path`` piece by piece: the large weights go from their arrays to the
    file, and the whole serialisation is never in memory (BERT-base: 415 MiB less at the bundle's packaging,
    where the job's memory peaked)."""
    with open(path, "wb") as handle:
        for piece in _pieces(model):
            handle.write(piece)


def _pieces(model: ir.Model) -> list[bytes | memoryview]:
    """``serialize``'s bytes as pieces in order, each large weight's raw data read in place where it can be."""
    large = {
        name: value.const_value
        for name, value in model.graph.initializers.items()
        if _streamed(value.const_value)
    }
    for name, tensor in large.items():
        tensor.name = name  # as ``ir.to_proto`` does to every initializer
    if not large:
        return [ir.to_proto(model).SerializeToString()]
    proto = _stubbed_proto(model, large)
    initializers = [
        _tensor_pieces(large[init.name]) if init.name in large else [init.SerializeToString()]
        for init in proto.graph.initializer
    ]
    proto.graph.ClearField("initializer")
    graph = proto.graph.SerializeToString()
    proto.ClearField("graph")
    outer = proto.SerializeToString()
    del proto
    graph_pieces = _spliced(graph, _GRAPH_INITIALIZER, [
        piece for pieces in initializers for piece in _field(_GRAPH_INITIALIZER, pieces)
    ])  # fmt: skip
    return _spliced(outer, _MODEL_GRAPH, _field(_MODEL_GRAPH, graph_pieces))


def weightless_proto(model: ir.Model, *, constants: bool = False) -> onnx.ModelProto:
    """``model``'s protobuf with its large main-graph initializers as graph inputs of the same type and shape:
    what onnx's checker and shape inference check, without a copy of the weights (BERT-base: the protobuf,
    the checker's and the inference's parses of it held 415 MiB each). ``constants``: large ``Constant``
    nodes of the main graph too (exporters such as paddle2onnx write every weight as one), for a load that
    needs only shapes: ppocr_rec's 10 MiB of them made each of ``preflight.model_limits``'s loads hold
    37-54 MiB."""
    large = {name: value.const_value for name, value in model.graph.initializers.items() if _streamed(value.const_value)}
    proto = _stubbed_proto(model, large)
    if constants:
        _constants_as_inputs(proto)
    if not large:
        return proto
    inputs = {value.name for value in proto.graph.input}
    kept = [init for init in proto.graph.initializer if init.name not in large]
    stubs = [init for init in proto.graph.initializer if init.name in large]
    proto.graph.ClearField("initializer")
    proto.graph.initializer.extend(kept)
    for init in stubs:
        if init.name not in inputs:
            proto.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    return proto


def _constants_as_inputs(proto: onnx.ModelProto) -> None:
    """Each main-graph ``Constant`` node holding a tensor of ``STREAM_MIN_BYTES`` or more becomes a graph input
    of its type and shape (one that is also a graph output stays)."""
    outputs = {value.name for value in proto.graph.output}
    kept, lifted = [], []
    for node in proto.graph.node:
        value = next((a.t for a in node.attribute if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)
        big = value is not None and value.data_type != onnx.TensorProto.STRING and (
            math.prod(value.dims) * onnx.helper.tensor_dtype_to_np_dtype(value.data_type).itemsize >= STREAM_MIN_BYTES
        )
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and big and node.output[0] not in outputs:
            lifted.append(onnx.helper.make_tensor_value_info(node.output[0], value.data_type, list(value.dims)))
        else:
            kept.append(node)
    if lifted:
        proto.graph.ClearField("node")
        proto.graph.node.extend(kept)
        proto.graph.input.extend(lifted)


def _stubbed_proto(model: ir.Model, large: dict[str, ir.TensorProtocol]) -> onnx.ModelProto:
    """``ir.to_proto(model)`` with ``large``'s initializers as data-less stand-ins (put back before this
    returns)."""
    from flexdsa_core.in_memory import IN_MEMORY_LOCATION

    try:
        for name, tensor in large.items():
            stub = ir.ExternalTensor(IN_MEMORY_LOCATION, None, None, tensor.dtype, shape=tensor.shape, name=name)
            model.graph.initializers[name].const_value = stub
        return ir.to_proto(model)
    finally:
        for name, tensor in large.items():
            model.graph.initializers[name].const_value = tensor


def _streamed(tensor: ir.TensorProtocol | None) -> bool:
    return (
        tensor is not None
        and not isinstance(tensor, (ir.ExternalTensor, ir.StringTensor))
        and tensor.dtype not in (ir.DataType.STRING, ir.DataType.UNDEFINED)
        and tensor.nbytes >= STREAM_MIN_BYTES
    )


def _tensor_pieces(tensor: ir.TensorProtocol) -> list[bytes | memoryview]:
    """The serialised TensorProto of ``tensor`` (as ``ir.serde.serialize_tensor_into`` writes it), as pieces:
    its raw bytes read in place where the tensor is a plain array."""
    if isinstance(tensor, ir.serde.TensorProtoTensor):
        return [_whole(tensor)]  # copied verbatim by onnx_ir, whatever its form
    header = onnx.TensorProto()
    ir.serde.serialize_tensor_into(header, _Header(tensor))
    header.ClearField("raw_data")
    data = _raw(tensor)
    return _spliced(header.SerializeToString(), _TENSOR_RAW_DATA, [*_key_and_length(_TENSOR_RAW_DATA, len(data)), data])


def _whole(tensor: ir.TensorProtocol) -> bytes:
    message = onnx.TensorProto()
    ir.serde.serialize_tensor_into(message, tensor)
    return message.SerializeToString()


def _raw(tensor: ir.TensorProtocol) -> bytes | memoryview:
    """``tensor.tobytes()``, without the copy where it is an ``ir.Tensor`` over a little-endian array of whole
    bytes laid out in C order (what ``tobytes`` would copy out)."""
    if isinstance(tensor, ir.Tensor) and tensor.dtype.bitwidth % 8 == 0:
        array = tensor.raw
        if isinstance(array, np.ndarray) and array.flags.c_contiguous and array.dtype.byteorder in ("=", "<", "|"):
            if sys.byteorder == "little" and array.dtype.itemsize * 8 == tensor.dtype.bitwidth:
                return memoryview(array.reshape(-1).view(np.uint8))
    return tensor.tobytes()


class _Header:
    """A tensor's fields without its data: ``serialize_tensor_into`` writes the header as for the tensor, with
    empty raw data (removed after)."""

    def __init__(self, tensor: ir.TensorProtocol) -> None:
        self.name, self.doc_string, self.dtype = tensor.name, tensor.doc_string, tensor.dtype
        self.shape, self.metadata_props = tensor.shape, tensor.metadata_props

    def tobytes(self) -> bytes:
        return b""


def _key_and_length(number: int, length: int) -> list[bytes]:
    return [length_delimited_key(number), varint(length)]


def _field(number: int, pieces: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """One length-delimited field whose content is ``pieces``."""
    return [*_key_and_length(number, sum(len(piece) for piece in pieces)), *pieces]


def _spliced(message: bytes, number: int, pieces: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """``message`` (which has no field ``number``) with ``pieces`` where field ``number`` goes: before its first
    field of a higher number (which starts where the field before it ends)."""
    at = 0
    for field, _, _, end in fields(message, 0, len(message), "message"):
        if field > number:
            break
        at = end
    return [message[:at], *pieces, message[at:]]
