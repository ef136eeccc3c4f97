"""The protobuf wire format, read and written a field at a time: what the service's upload check walks
without parsing (``service.upload.check_onnx_structure``) and what ``serialized.serialize`` splices a
model's weights into. Every read is bounds-checked: a malformed buffer raises ``WireFormatError`` with the
reason, never an ``IndexError``."""

from __future__ import annotations

from collections.abc import Iterator

WIRE_VARINT, WIRE_I64, WIRE_LEN, WIRE_I32 = 0, 1, 2, 5


class WireFormatError(ValueError):
    """The bytes are not (complete) protobuf, or not a field ONNX uses."""


def read_varint(buf, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end:
            raise WireFormatError("the file ends inside a varint (truncated)")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise WireFormatError("malformed varint: not protobuf")


def fields(buf, pos: int, end: int, where: str) -> Iterator[tuple[int, int, int, int]]:
    """Yield (field number, wire type, value start, value end) for one message, checking bounds."""
    while pos < end:
        tag, pos = read_varint(buf, pos, end)
        number, wire = tag >> 3, tag & 7
        if number == 0:
            raise WireFormatError(f"{where}: field number 0 is not valid protobuf")
        if wire == WIRE_VARINT:
            start = pos
            _, pos = read_varint(buf, pos, end)
        elif wire == WIRE_I64 or wire == WIRE_I32:
            start, pos = pos, pos + (8 if wire == WIRE_I64 else 4)
        elif wire == WIRE_LEN:
            length, start = read_varint(buf, pos, end)
            pos = start + length
        else:
            raise WireFormatError(
                f"{where}: wire type {wire} (field {number}) is not used by ONNX: not an ONNX model"
            )
        if pos > end:
            raise WireFormatError(
                f"{where}: field {number} runs {pos - end} bytes past the end: the file is truncated"
            )
        yield number, wire, start, pos


def varint(value: int) -> bytes:
    """``value`` (non-negative) as a protobuf varint."""
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def length_delimited_key(number: int) -> bytes:
    """The tag of field ``number`` holding bytes or a message."""
    return varint(number << 3 | WIRE_LEN)


# --- a model without its weights ------------------------------------------------------------------------

MODEL_GRAPH, GRAPH_INITIALIZER = 7, 5
# TensorProto: where a tensor's values may lie, and the fields that say it lies elsewhere.
TENSOR_DATA_FIELDS = frozenset({4, 5, 6, 7, 9, 10, 11})  # float, int32, string, int64, raw, double, uint64
TENSOR_EXTERNAL_DATA, TENSOR_DATA_LOCATION, EXTERNAL = 13, 14, 1


def _field_bytes(number: int, value: bytes) -> bytes:
    return length_delimited_key(number) + varint(len(value)) + value


def declared_tensor(buf, start: int, end: int, location: str) -> bytes:
    """The TensorProto at ``buf[start:end]`` with its values left out and declared external at ``location``
    (name, type, dims and the rest kept)."""
    kept = bytearray()
    previous = start
    for number, _wire, _value_start, value_end in fields(buf, start, end, "TensorProto"):
        if number not in TENSOR_DATA_FIELDS and number not in (TENSOR_EXTERNAL_DATA, TENSOR_DATA_LOCATION):
            kept += buf[previous:value_end]
        previous = value_end
    entry = _field_bytes(1, b"location") + _field_bytes(2, location.encode())
    kept += _field_bytes(TENSOR_EXTERNAL_DATA, entry)
    kept += varint(TENSOR_DATA_LOCATION << 3 | WIRE_VARINT) + varint(EXTERNAL)
    return bytes(kept)


def _data_bytes(buf, start: int, end: int) -> int:
    return sum(
        value_end - value_start
        for number, _wire, value_start, value_end in fields(buf, start, end, "TensorProto")
        if number in TENSOR_DATA_FIELDS
    )


def weightless_model(buf, max_inline: int, location: str) -> tuple[bytes, list[str]]:
    """ModelProto bytes ``buf`` (bytes or an mmap) rewritten with every main-graph initializer whose values
    take more than ``max_inline`` bytes declared external at ``location`` (``declared_tensor``), and the names
    of those initializers. Only the graph's structure and small tensors are copied: a 256 MiB model's
    weightless form is a few hundred KB, and its weights are never read into memory."""
    out = bytearray()
    previous = 0
    declared: list[str] = []
    for number, wire, start, end in fields(buf, 0, len(buf), "ModelProto"):
        if number != MODEL_GRAPH or wire != WIRE_LEN:
            out += buf[previous:end]
        else:
            out += _field_bytes(MODEL_GRAPH, _weightless_graph(buf, start, end, max_inline, location, declared))
        previous = end
    return bytes(out), declared


def _weightless_graph(buf, start: int, end: int, max_inline: int, location: str, declared: list[str]) -> bytes:
    out = bytearray()
    previous = start
    for number, wire, value_start, value_end in fields(buf, start, end, "GraphProto"):
        if (
            number == GRAPH_INITIALIZER
            and wire == WIRE_LEN
            and _data_bytes(buf, value_start, value_end) > max_inline
        ):
            tensor = declared_tensor(buf, value_start, value_end, location)
            out += _field_bytes(GRAPH_INITIALIZER, tensor)
            declared.append(_tensor_name(tensor))
        else:
            out += buf[previous:value_end]
        previous = value_end
    return bytes(out)


def _tensor_name(tensor: bytes) -> str:
    name = ""
    for number, wire, start, end in fields(tensor, 0, len(tensor), "TensorProto"):
        if number == 8 and wire == WIRE_LEN:
            name = bytes(tensor[start:end]).decode("utf-8", "replace")
    return name
