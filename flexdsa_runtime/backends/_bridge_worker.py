"""The other end of ``bridge``: runs inside a vendor toolchain's own environment and serves one bucket.

    <toolchain venv>/bin/python _bridge_worker.py

Only the standard library, numpy and the vendor's package are imported here (never flexdsa_runtime: the
vendor environment does not have it). Messages on stdin/stdout, each ``len(header) (8 bytes, big-endian)
header (JSON) len(payload) payload`` where a payload is an ``.npz`` of named arrays (numpy's own format, the
same across numpy 1.x and 2.x, unlike pickles). The vendor packages print to stdout, so the protocol keeps a
private copy of it and fd 1 is pointed at stderr.

Ops: ``load`` (``kind`` ``rknn-simulator``: rknn-toolkit2 builds the bucket's ONNX for the RK3588 and
``init_runtime()`` with no target runs its x86 simulator, because the toolkit refuses to simulate a
``.rknn`` loaded from a file; ``kind`` ``qnn``: ONNX Runtime with the onnxruntime-qnn plugin loads the
EPContext model, the HTP emulated on x86), ``run`` (inputs in, outputs out), ``close``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import struct
import sys
import traceback


def _read_exact(stream, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_message(stream) -> tuple[dict, bytes]:
    (size,) = struct.unpack(">Q", _read_exact(stream, 8))
    header = json.loads(_read_exact(stream, size))
    (size,) = struct.unpack(">Q", _read_exact(stream, 8))
    return header, _read_exact(stream, size) if size else b""


def write_message(stream, header: dict, payload: bytes = b"") -> None:
    raw = json.dumps(header).encode()
    stream.write(struct.pack(">Q", len(raw)) + raw + struct.pack(">Q", len(payload)) + payload)
    stream.flush()


def pack(arrays: dict) -> bytes:
    import numpy as np

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def unpack(payload: bytes) -> dict:
    import numpy as np

    with np.load(io.BytesIO(payload), allow_pickle=False) as found:
        return {name: found[name] for name in found.files}


class RknnSimulator:
    def __init__(self, request: dict) -> None:
        from rknn.api import RKNN

        self.rknn = RKNN(verbose=False)
        self.inputs = [i["name"] for i in request["inputs"]]
        self.outputs = request["outputs"]
        config = {
            "target_platform": request.get("target_platform", "rk3588"),
            **(request.get("config") or {}),
        }
        steps = [
            ("config", lambda: self.rknn.config(**config)),
            ("load_onnx", lambda: self.rknn.load_onnx(
                model=request["onnx"], inputs=self.inputs, input_size_list=[i["shape"] for i in request["inputs"]],
                **({"outputs": self.outputs} if request.get("prune_outputs") else {}),
            )),
            ("build", lambda: self.rknn.build(do_quantization=bool(request.get("dataset")),
                                              dataset=request.get("dataset"))),
            ("init_runtime (simulator)", lambda: self.rknn.init_runtime()),
        ]  # fmt: skip
        for name, step in steps:
            if step() != 0:
                raise RuntimeError(f"rknn-toolkit2 {name} failed (see the worker's log)")

    def run(self, feeds: dict) -> dict:
        arrays = [feeds[name] for name in self.inputs]
        found = self.rknn.inference(inputs=arrays, data_format=["nchw"] * len(arrays))
        if found is None:
            raise RuntimeError("rknn-toolkit2 inference (simulator) returned no outputs")
        return dict(zip(self.outputs, found, strict=True))

    def close(self) -> None:
        self.rknn.release()


class QnnContext:
    def __init__(self, request: dict) -> None:
        import onnxruntime as ort
        import onnxruntime_qnn

        with contextlib.suppress(Exception):
            ort.register_execution_provider_library(
                "QNNExecutionProvider", onnxruntime_qnn.get_library_path()
            )
        devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"][:1]
        if not devices:
            raise RuntimeError("onnxruntime lists no QNN device after registering onnxruntime-qnn")
        options = ort.SessionOptions()
        options.log_severity_level = 3
        # The parent sends the EP's options whole (qnn.provider_options: the manifest's allow-listed ones).
        options.add_provider_for_devices(devices, request.get("provider") or {"backend_type": "htp"})
        self.session = ort.InferenceSession(request["context"], options)
        self.outputs = [o.name for o in self.session.get_outputs()]

    def describe(self) -> dict:
        return {
            "inputs": [{"name": i.name, "type": i.type} for i in self.session.get_inputs()],
            "outputs": self.outputs,
        }

    def run(self, feeds: dict) -> dict:
        return dict(zip(self.outputs, self.session.run(self.outputs, feeds), strict=True))

    def close(self) -> None:
        self.session = None


KINDS = {"rknn-simulator": RknnSimulator, "qnn": QnnContext}


def main() -> int:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # vendor packages print to stdout; their words go to the log, not into the protocol
    sys.stdout = sys.stderr
    requests = sys.stdin.buffer
    served = None
    while True:
        try:
            header, payload = read_message(requests)
        except EOFError:
            break
        op = header.get("op")
        try:
            if op == "load":
                if header.get("cwd"):
                    os.chdir(header["cwd"])
                served = KINDS[header["kind"]](header)
                write_message(
                    replies, {"ok": True, **(served.describe() if hasattr(served, "describe") else {})}
                )
            elif op == "run":
                outputs = served.run(unpack(payload))
                write_message(replies, {"ok": True}, pack(outputs))
            elif op == "close":
                break
            else:
                write_message(replies, {"ok": False, "error": f"unknown op {op!r}"})
        except (
            Exception
        ) as err:  # the parent raises it with this text; the worker stays up for the next request
            traceback.print_exc()
            write_message(replies, {"ok": False, "error": f"{type(err).__name__}: {err}"})
    if served is not None:
        with contextlib.suppress(Exception):
            served.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
