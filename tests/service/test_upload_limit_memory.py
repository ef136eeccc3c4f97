"""The upload limit over a real socket to a real uvicorn server: a model of exactly ``max_upload_bytes`` is
accepted, one byte more is 413, however the body is framed (declared length, chunked, a declared length
that lies, an absurd declared length), and the API's memory stays flat while it refuses them: the body is
streamed to a staging file and counted, never held.

Memory is the server process's peak resident set (``VmHWM``), reset before the oversized uploads through
``/proc/PID/clear_refs``, so the figure is the peak while refusing, not a sample between requests.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import onnx
import pytest

from tests.service.conftest import tiny_onnx
from tests.service.live import embedded_server

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

MiB = 1024 * 1024
LIMIT = 48 * MiB
# Refusing 4 x 48 MiB must not cost the API even a third of one upload: it holds none of the bytes.
MAX_GROWTH = 16 * MiB
BOUNDARY = "limitboundary"
CHUNK = 256 * 1024


def model_of_exactly(size: int) -> bytes:
    """A valid ONNX model of exactly ``size`` bytes (a doc string pads it)."""
    model = onnx.load_model_from_string(tiny_onnx(0.5))
    padding = size - len(model.SerializeToString())
    for _ in range(4):  # the doc string's length prefix grows with it: settle in a step or two
        model.doc_string = "x" * padding
        padding += size - len(model.SerializeToString())
    data = model.SerializeToString()
    assert len(data) == size
    return data


def _multipart(model: bytes) -> tuple[bytes, bytes]:
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="spec"\r\n\r\n'
        f"{json.dumps({'target': 'cpu-ort'})}\r\n"
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="model"; filename="m.onnx"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    return head + model, f"\r\n--{BOUNDARY}--\r\n".encode()


def _post(url: str, model: bytes, framing: str) -> bytes:
    """POST /optimize over a plain socket, the body framed as asked; returns the status line. Stops
    sending at the first byte of answer (the server may answer, and close, before the body ends)."""
    parts = urlsplit(url)
    head, tail = _multipart(model)
    body = head + tail
    headers = f"POST /optimize HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n"
    headers += f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
    if framing == "length":
        headers += f"Content-Length: {len(body)}\r\n"
    elif framing == "lying-length":  # declares 1 KiB, sends everything
        headers += "Content-Length: 1024\r\n"
    elif framing == "absurd-length":  # declares 1 TiB, sends everything it can
        headers += f"Content-Length: {1 << 40}\r\n"
    else:
        headers += "Transfer-Encoding: chunked\r\n"
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as connection:
        connection.sendall(headers.encode() + b"\r\n")
        for start in range(0, len(body), CHUNK):
            piece = body[start : start + CHUNK]
            if framing == "chunked":
                piece = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
            if select.select([connection], [], [], 0)[0]:
                break  # answered already
            try:
                connection.sendall(piece)
            except OSError:  # the server answered and closed its side: read what it said
                break
        else:
            if framing == "chunked":
                connection.sendall(b"0\r\n\r\n")
        answer = b""
        deadline = time.monotonic() + 30
        while b"\r\n" not in answer and time.monotonic() < deadline:
            chunk = connection.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


def _status(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
    return fields


def test_413_at_the_limit_plus_one_byte_with_flat_api_memory(tmp_path):
    exact, over = model_of_exactly(LIMIT), model_of_exactly(LIMIT + 1)
    with embedded_server(tmp_path, embedded_worker="false", max_upload_bytes=str(LIMIT)) as server:
        for _ in range(2):  # warm: the first requests import and allocate what every request needs
            assert _post(server.url, tiny_onnx(), "length").startswith(b"HTTP/1.1 202")
        before = _status(server.pid)["VmRSS"]
        Path(f"/proc/{server.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS from here on
        reset = _status(server.pid)
        assert reset["VmHWM"] - reset["VmRSS"] < MiB, reset  # the peak was reset: it measures what follows

        answers = {f: _post(server.url, over, f) for f in ("length", "chunked", "absurd-length")}
        lying = _post(server.url, over, "lying-length")
        peak = _status(server.pid)["VmHWM"]

        assert all(a.startswith(b"HTTP/1.1 413") for a in answers.values()), answers
        # A body longer than its declared 1 KiB is cut at 1 KiB: an incomplete form, refused as such.
        assert lying.startswith(b"HTTP/1.1 4") and not lying.startswith(b"HTTP/1.1 413"), lying
        growth = peak - before
        print(f"API peak RSS growth while refusing 4 x {LIMIT / MiB:.0f} MiB: {growth / MiB:.1f} MiB")
        assert growth < MAX_GROWTH, f"the API's peak memory grew {growth / MiB:.1f} MiB"
        staging_dir = tmp_path / "artifacts" / "tmp"
        assert staging_dir.is_dir() and list(staging_dir.glob("upload-*")) == []  # the refused bodies' staging files are gone

        assert _post(server.url, exact, "length").startswith(b"HTTP/1.1 202")  # the limit itself passes
