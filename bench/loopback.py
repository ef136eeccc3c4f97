"""Helpers the service benchmarks share: a free loopback port, and waiting for a URL to answer 200."""

from __future__ import annotations

import socket
import time


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout_s: float, where: str = "") -> None:
    """Poll ``url`` until it answers 200; ``RuntimeError`` after ``timeout_s`` (``where``: where the logs are)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"{url} did not answer in {timeout_s} s{'; see ' + where if where else ''}")
