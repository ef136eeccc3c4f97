"""Vendor runtimes that live in their own environment, reached through a subprocess (for testing here).

rknn-toolkit2 and onnxruntime-qnn pin numpy/onnx/protobuf versions the project cannot take, so they sit in
the toolchains' virtual environments (``flexdsa toolchains install``, under ``~/.cache/flexdsa/toolchains``
or ``FLEXDSA_TOOLCHAINS_DIR``). A bridge starts ``_bridge_worker.py`` with that environment's Python, loads
the bucket once, and sends each request's arrays over a pipe (``.npz`` frames, see the worker). It costs a
process per bucket and a copy of the arrays per request: a way to run the vendor's own runtime on this
machine (rknn's simulator, QNN's HTP emulation), not the way to deploy; on the device the runtime imports
the vendor package directly (``rknn_lite``, ``qnn``).

* ``rknn-simulator``: rknn-toolkit2 cannot simulate a ``.rknn`` loaded from a file (its ``init_runtime``
  refuses: "use load_xxx & build instead"), so the worker rebuilds the bucket's target-ready ONNX with the
  toolkit as the shipped ``.rknn`` was built (``rknn_build``: its build record's switches, precision, calibration
  samples and float16 subgraphs), exports the rebuild to compare its size with the shipped file's, and runs it
  in the simulator. The ``.rknn`` itself is verified by checksum and runs only on the board.
* ``qnn-emulator``: the bucket's EPContext model and its context binary, loaded as they are.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np

from flexdsa_runtime.backends._bridge_worker import pack, read_message, unpack, write_message
from flexdsa_runtime.backends.base import ORT_DTYPES
from flexdsa_runtime.errors import BackendUnavailable

WORKER = Path(__file__).with_name("_bridge_worker.py")
TOOLCHAIN_OF = {"rknn-simulator": "rockchip", "qnn-emulator": "qualcomm"}
KIND_OF = {"rknn-simulator": "rknn-simulator", "qnn-emulator": "qnn"}


def toolchains_root() -> Path:
    return Path(os.environ.get("FLEXDSA_TOOLCHAINS_DIR") or Path.home() / ".cache" / "flexdsa" / "toolchains")


def toolchain_python(name: str, root: Path | None = None) -> Path | None:
    """The toolchain environment's Python when ``flexdsa toolchains install <name>`` finished, else None."""
    home = (root or toolchains_root()) / name
    python = home / "venv" / "bin" / "python"
    return python if (home / "ready.json").is_file() and python.exists() else None


def rebuilt_note(rebuilt: dict) -> str:
    """The rknn simulator's rebuild against the shipped .rknn, in words. Its bytes cannot be compared: two exports
    of one build differ (the toolkit writes host memory addresses into the file, seen with rknn-toolkit2 2.5.0), but
    their size does not, and another precision or layer choice changes it (int8 19459 bytes, float16 19113, for a
    3x3 Conv)."""
    size, shipped = rebuilt.get("size"), rebuilt.get("shipped_size")
    if size == shipped:
        return f"the rebuild has the shipped file's size ({size} bytes)"
    return (
        f"the rebuild has {size} bytes, the shipped file {shipped}: it was not built as its build record says "
        f"(rknn-toolkit2 {rebuilt.get('toolkit')} here)"
    )


class BridgeBackend:
    """One bucket served by a worker process in a vendor environment."""

    def __init__(
        self, backend: str, request: dict, *, root: Path | None = None, input_dtypes=None, notes=()
    ) -> None:
        toolchain = TOOLCHAIN_OF[backend]
        python = toolchain_python(toolchain, root)
        if python is None:
            raise BackendUnavailable(
                f"backend {backend!r} needs the {toolchain} toolchain: run `flexdsa toolchains install {toolchain}`.",
                details={"toolchain": toolchain},
            )
        self.name = backend
        self._log = tempfile.TemporaryFile()
        self._lock = threading.Lock()
        self._process = subprocess.Popen(
            [str(python), str(WORKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log
        )
        reply, _ = self._call({"op": "load", "kind": KIND_OF[backend], **request})
        # What was loaded, in words (the rknn rebuild's precision and samples), and the rebuild against the shipped
        # file (``rebuilt``: the sizes of both and the toolkit's version; see ``rebuilt_note``).
        self.notes = list(notes)
        self.rebuilt = reply.get("rebuilt")
        if self.rebuilt:
            self.notes.append(rebuilt_note(self.rebuilt))
        self.output_names = reply.get("outputs") or list(request.get("outputs", []))
        described = {i["name"]: ORT_DTYPES.get(i["type"]) for i in reply.get("inputs", [])}
        self.input_dtypes = {n: np.dtype(t) for n, t in described.items() if t is not None} or {
            n: np.dtype(t) for n, t in (input_dtypes or {}).items()
        }

    def _call(self, header: dict, payload: bytes = b"") -> tuple[dict, bytes]:
        with self._lock:
            try:
                write_message(self._process.stdin, header, payload)
                reply, data = read_message(self._process.stdout)
            except (EOFError, BrokenPipeError, OSError):
                tail = self.log_tail()
                raise BackendUnavailable(f"the {self.name} worker died: {tail}", details={"log_tail": tail}) from None
        if not reply.get("ok"):
            raise BackendUnavailable(
                f"{self.name}: {reply.get('error')}", details={"log_tail": self.log_tail()}
            )
        return reply, data

    def log_tail(self, size: int = 2000) -> str:
        self._log.seek(0, os.SEEK_END)
        end = self._log.tell()
        self._log.seek(max(0, end - size))
        return self._log.read().decode(errors="replace")

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        _, data = self._call({"op": "run"}, pack(feeds))
        return unpack(data)

    def close(self) -> None:
        with self._lock:  # after any request in flight
            if self._process.poll() is None:
                try:
                    write_message(self._process.stdin, {"op": "close"})
                    self._process.wait(timeout=30)
                except (OSError, subprocess.TimeoutExpired):
                    self._process.kill()
                    self._process.wait()
            self._log.close()
