"""The other end of ``bridge``: runs inside a vendor toolchain's own environment and serves one bucket.

    <toolchain venv>/bin/python _bridge_worker.py

Only the standard library, numpy and the vendor's package are imported here (never flexdsa_runtime: the
vendor environment does not have it). Messages on stdin/stdout, each ``len(header) (8 bytes, big-endian)
header (JSON) len(payload) payload`` where a payload is an ``.npz`` of named arrays (numpy's own format, the
same across numpy 1.x and 2.x, unlike pickles). The vendor packages print to stdout, so the protocol keeps a
private copy of it and fd 1 is pointed at stderr.

Ops: ``load`` (``kind`` ``rknn-simulator``: rknn-toolkit2 builds the bucket's ONNX for the RK3588 as the
shipped ``.rknn`` was built, and ``init_runtime()`` with no target runs its x86 simulator, because the toolkit
refuses to simulate a ``.rknn`` loaded from a file; ``kind`` ``qnn``: ONNX Runtime with the onnxruntime-qnn plugin loads the
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
    """rknn-toolkit2 rebuilds the bucket's ONNX as the request says (``rknn_build.simulator_request``: the shipped
    ``.rknn``'s switches, precision, calibration files and float16 subgraphs), exports the rebuild to compare its
    size with the shipped file's, and runs it in its simulator. The toolkit writes its snapshots and hybrid step
    files into the working directory: a scratch folder of its own, never the bundle's."""

    def __init__(self, request: dict) -> None:
        import tempfile

        from rknn.api import RKNN

        self.scratch = tempfile.mkdtemp(prefix="rknn-simulator-")
        os.chdir(self.scratch)
        self.rknn = RKNN(verbose=False)
        self.inputs = [i["name"] for i in request["inputs"]]
        self.outputs = request["outputs"]
        config = {
            "target_platform": request.get("target_platform", "rk3588"),
            **(request.get("config") or {}),
        }
        load = {"model": request["onnx"], "inputs": self.inputs,
                "input_size_list": [i["shape"] for i in request["inputs"]],
                **({"outputs": self.outputs} if request.get("prune_outputs") else {})}  # fmt: skip
        quantize = request.get("precision") == "int8"
        dataset = self._dataset(request.get("dataset")) if quantize else None
        if quantize and dataset is None:
            raise RuntimeError("an int8 rebuild needs its calibration samples (request 'dataset')")
        self._step("config", self.rknn.config(**config))
        self._step("load_onnx", self.rknn.load_onnx(**load))
        if quantize and request.get("hybrid_steps"):
            pairs = request.get("hybrid") or []
            self._step("hybrid_quantization_step1", self.rknn.hybrid_quantization_step1(
                dataset=dataset, **({"custom_hybrid": pairs} if pairs else {})))  # fmt: skip
            model, data, cfg = (self._written(suffix) for suffix in (".model", ".data", ".quantization.cfg"))
            self.rknn.release()
            self.rknn = RKNN(verbose=False)
            self._step("hybrid_quantization_step2", self.rknn.hybrid_quantization_step2(
                model_input=model, data_input=data, model_quantization_cfg=cfg))  # fmt: skip
        else:
            self._step("build", self.rknn.build(do_quantization=quantize, dataset=dataset,
                                                auto_hybrid=bool(quantize and request.get("auto_hybrid"))))  # fmt: skip
        self.rebuilt = None
        if request.get("shipped"):  # its bytes differ run to run (the export holds host memory addresses); its size not
            from importlib import metadata

            self._step("export_rknn", self.rknn.export_rknn("rebuilt.rknn"))
            self.rebuilt = {"size": os.path.getsize("rebuilt.rknn"), "shipped_size": os.path.getsize(request["shipped"]),
                            "toolkit": metadata.version("rknn-toolkit2")}  # fmt: skip
        self._step("init_runtime (simulator)", self.rknn.init_runtime())

    @staticmethod
    def _step(name: str, status: int) -> None:
        if status != 0:
            raise RuntimeError(f"rknn-toolkit2 {name} failed (see the worker's log)")

    @staticmethod
    def _dataset(rows) -> str | None:
        """The toolkit's dataset file: one sample a line, its inputs' .npy paths (absolute) in input order."""
        if not rows:
            return None
        with open("dataset.txt", "w") as handle:
            handle.writelines(" ".join(row) + "\n" for row in rows)
        return "dataset.txt"

    @staticmethod
    def _written(suffix: str) -> str:
        import glob

        found = sorted(glob.glob("*" + suffix))
        if not found:
            raise RuntimeError(f"hybrid_quantization_step1 wrote no *{suffix} file")
        return found[0]

    def describe(self) -> dict:
        return {"rebuilt": self.rebuilt} if self.rebuilt else {}

    def run(self, feeds: dict) -> dict:
        arrays = [feeds[name] for name in self.inputs]
        found = self.rknn.inference(inputs=arrays, data_format=["nchw"] * len(arrays))
        if found is None:
            raise RuntimeError("rknn-toolkit2 inference (simulator) returned no outputs")
        return dict(zip(self.outputs, found, strict=True))

    def close(self) -> None:
        import shutil

        self.rknn.release()
        shutil.rmtree(self.scratch, ignore_errors=True)


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
