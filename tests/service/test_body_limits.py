"""Every request body is bounded before it is read, and the key is checked first (service/core/body_limit.py).

The attack: an unauthenticated client POSTs a body of hundreds of MB to a JSON route (a made-up job's
``/respecialise``); FastAPI read it whole before the key check answered 401, and the API's memory grew by
the body's size. Over a real socket to a real server: the answer must come while the client is still sending,
and the server's memory must not grow by the body.
"""

from __future__ import annotations

import select
import socket
import time
from urllib.parse import urlsplit

import httpx
import psutil
import pytest

from tests.service.live import embedded_server

DECLARED_BYTES = 400 * 1024 * 1024
CHUNK = 64 * 1024
SEND_LIMIT_S = 30


def _send_until_answered(url: str, request_line: str, *, chunked: bool) -> tuple[bytes, int]:
    """Send a request declaring (or, chunked, streaming) a 400 MB JSON body, 64 KiB at a time, and stop at the
    first byte of the answer. Returns (the answer's first bytes, body bytes sent)."""
    parts = urlsplit(url)
    length = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {DECLARED_BYTES}"
    head = f"{request_line}\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n{length}\r\n\r\n"
    piece = b"[" + b"0," * (CHUNK // 2 - 1) + b"0"
    if chunked:
        piece = f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
    sent = 0
    deadline = time.monotonic() + SEND_LIMIT_S
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as connection:
        connection.sendall(head.encode())
        while time.monotonic() < deadline and sent < DECLARED_BYTES:
            readable, _, _ = select.select([connection], [], [], 0.01)
            if readable:
                return connection.recv(4096), sent
            try:
                connection.sendall(piece)
            except OSError:  # the server answered and closed its side: read what it said
                break
            sent += len(piece)
        return connection.recv(4096), sent


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with embedded_server(tmp_path_factory.mktemp("limits"), embedded_worker="false", auth="required") as live:
        yield live


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize(
    "request_line",
    ["POST /jobs/made-up/respecialise HTTP/1.1", "PUT /jobs/made-up/traffic/policy HTTP/1.1",
     "POST /jobs/made-up/traffic HTTP/1.1", "POST /ui/login HTTP/1.1", "POST /nowhere HTTP/1.1"],
)  # fmt: skip
def test_an_unauthenticated_huge_body_is_refused_while_it_is_sent(server, request_line, chunked):
    process = psutil.Process(server.pid)
    before = process.memory_info().rss
    answer, sent = _send_until_answered(server.url, request_line, chunked=chunked)
    status = answer.split(b" ", 2)[1] if answer.startswith(b"HTTP/1.1 ") else answer[:60]
    # 413 by the limit, or 401/404 before the body is read: never after reading it.
    assert status in (b"413", b"401", b"404", b"405"), answer[:300]
    assert sent < 8 * 1024 * 1024, f"answered only after {sent} bytes of the body"
    grown = process.memory_info().rss - before
    assert grown < 64 * 1024 * 1024, f"the API's memory grew by {grown / 2**20:.0f} MiB"


def test_the_key_is_checked_before_the_body_is_read(server):
    """No key and a body that is not even JSON: the answer is about the key (401), so the body was never parsed."""
    for method, path in (("POST", "/jobs/made-up/respecialise"), ("PUT", "/jobs/made-up/traffic/policy")):
        response = httpx.request(method, f"{server.url}{path}", content=b"{not json", timeout=10,
                                 headers={"Content-Type": "application/json"})  # fmt: skip
        assert response.status_code == 401, response.text
        assert response.json()["error"]["code"] == "missing_api_key"


def test_a_body_over_the_limit_with_a_key_is_413_in_the_error_shape(server):
    from service.core.body_limit import DEFAULT_LIMIT

    response = httpx.put(
        f"{server.url}/jobs/made-up/traffic/policy", content=b" " * (DEFAULT_LIMIT + 1), timeout=10,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    assert response.status_code == 413
    assert response.json()["error"] == {
        "code": "payload_too_large",
        "message": f"The request body is larger than the {DEFAULT_LIMIT} bytes this endpoint accepts.",
        "details": {"limit": DEFAULT_LIMIT},
    }
