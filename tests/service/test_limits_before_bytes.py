"""Limits that depend only on the API key are decided before the body is read: an over-quota client sending
a huge model slowly is answered 429 while it is still sending, over a real socket to a real server."""

from __future__ import annotations

import select
import socket
import time
from urllib.parse import urlsplit

import httpx

from tests.service.conftest import tiny_onnx
from tests.service.live import embedded_server

DECLARED_BYTES = 512 * 1024 * 1024  # under the default upload limit: only the quota can refuse it
CHUNK = 64 * 1024
TIME_LIMIT_S = 20


def _send_slowly_until_answered(url: str) -> tuple[bytes, int]:
    """Declare a 512 MiB multipart body, send it 64 KiB at a time, and stop at the first byte of answer.
    Returns (the answer's first bytes, how many body bytes had been sent)."""
    parts = urlsplit(url)
    boundary = "slowboundary"
    head = (
        f"POST /optimize HTTP/1.1\r\nHost: {parts.netloc}\r\n"
        f"Content-Type: multipart/form-data; boundary={boundary}\r\n"
        f"Content-Length: {DECLARED_BYTES}\r\n\r\n"
    ).encode()
    preamble = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"; filename="big.onnx"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    sent = 0
    deadline = time.monotonic() + TIME_LIMIT_S
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as connection:
        connection.sendall(head + preamble)
        sent = len(preamble)
        while time.monotonic() < deadline and sent < DECLARED_BYTES:
            readable, _, _ = select.select([connection], [], [], 0.02)
            if readable:
                return connection.recv(4096), sent
            try:
                connection.sendall(b"\0" * CHUNK)
            except OSError:  # the server closed its side after answering; read what it said
                break
            sent += CHUNK
        return connection.recv(4096), sent


def test_over_quota_tenant_gets_429_before_its_body_is_sent(tmp_path):
    settings = {"embedded_worker": "false", "max_queued_jobs_per_tenant": "1"}
    with embedded_server(tmp_path, **settings) as server:
        first = httpx.post(
            f"{server.url}/optimize",
            files={"model": ("m.onnx", tiny_onnx(), "application/octet-stream")},
            data={"spec": '{"target": "cpu-ort"}'},
            timeout=30,
        )
        assert first.status_code == 202, first.text  # queued, and no worker: the tenant is at its quota

        answer, sent = _send_slowly_until_answered(server.url)
        assert answer.startswith(b"HTTP/1.1 429"), answer[:200]
        assert b"Retry-After" in answer or b"retry-after" in answer
        # Answered after the first few chunks, not after the declared 512 MiB.
        assert sent < DECLARED_BYTES // 8, sent
