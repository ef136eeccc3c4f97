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
