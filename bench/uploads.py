"""Uploads as the ingest benchmarks send them (``bench.ingest``, ``bench.ingest_s3``): distinct ONNX models of
a given size, ``POST /optimize`` encoded once before the clock starts and sent with plain ``sendall``, and the
clients' process that sends them all at one moment."""

from __future__ import annotations

import json
import socket
import threading
import time

SPEC = json.dumps({"target": "cpu-ort", "measure_latency": False})


def onnx_model(seed: int, size_bytes: int) -> bytes:
    """A valid ONNX model (Add of an input and a big initializer) of about ``size_bytes``, distinct per seed."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    count = max(1, size_bytes // 4)
    weight = np.random.default_rng(seed).standard_normal(count, dtype=np.float32)
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"])],
        f"ingest{seed}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [count])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [count])],
        [numpy_helper.from_array(weight, "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9).SerializeToString()


def multipart_request(host: str, body: bytes, name: str) -> tuple[bytes, bytes, bytes]:
    """A whole ``POST /optimize`` (request line and headers, the form up to the model's bytes, the closing
    boundary), encoded once before the clock starts: the model bytes themselves go out as they are."""
    boundary = f"flexdsa-bench-{name}".replace(".", "-").encode()
    head = (
        b"--" + boundary + b'\r\nContent-Disposition: form-data; name="spec"\r\n\r\n' + SPEC.encode()
        + b"\r\n--" + boundary + b'\r\nContent-Disposition: form-data; name="model"; filename="' + name.encode()
        + b'"\r\nContent-Type: application/octet-stream\r\n\r\n'
    )
    tail = b"\r\n--" + boundary + b"--\r\n"
    request = (
        b"POST /optimize HTTP/1.1\r\nHost: " + host.encode() + b"\r\nContent-Type: multipart/form-data; boundary="
        + boundary + b"\r\nContent-Length: " + str(len(head) + len(body) + len(tail)).encode()
        + b"\r\nConnection: close\r\n\r\n"
    )
    return request + head, body, tail


def send_upload(address: tuple[str, int], parts: tuple[bytes, bytes, bytes]) -> float:
    """Send one pre-encoded upload on its own connection; seconds until the whole answer is in. Raises
    unless the answer is 202."""
    start = time.perf_counter()
    with socket.create_connection(address) as connection:
        for part in parts:
            connection.sendall(part)
        answer = bytearray()
        while chunk := connection.recv(65536):
            answer += chunk
    elapsed = time.perf_counter() - start
    status = answer.split(b" ", 2)[1] if answer.count(b" ") >= 2 else b"?"
    if status != b"202":
        raise RuntimeError(f"submit answered {bytes(answer[:300])!r}")
    return elapsed


def load(base_url: str, clients: int, model_bytes: int, seed: int, start_at: float, queue) -> None:
    """Runs in its own process: the clients' uploads, all started at ``start_at`` (time.time()).

    The twenty clients stand in for twenty machines, so they must cost this one as little as possible: each
    request is encoded once before the clock starts and sent with plain ``sendall`` (no HTTP client library
    per byte). httpx's multipart encoder, twenty threads in one process, tops out at about 280 MB/s here
    against a server that throws the bytes away, below what the service takes; the run measures and prints
    this sender's own ceiling (the same uploads into a discarding socket) beside the service's rate."""
    host, port = base_url.rsplit("//", 1)[1].rsplit(":", 1)
    address = (host, int(port))
    requests = [
        multipart_request(host, onnx_model(seed + i, model_bytes), f"big{i}.onnx") for i in range(clients)
    ]
    upload_times: list[float] = [0.0] * clients

    def upload(index: int) -> None:
        upload_times[index] = send_upload(address, requests[index])

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(clients)]
    time.sleep(max(0.0, start_at - time.time()))
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    queue.put({
        "upload_s": upload_times,
        "wall_s": time.perf_counter() - start,
        "bytes": sum(len(body) for _, body, _ in requests),
    })
