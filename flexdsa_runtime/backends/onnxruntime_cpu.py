"""ONNX Runtime on the CPU: the bucket's target-ready ONNX (``role: onnx``), or another ONNX artifact.

Every bundle carries one ONNX per bucket that runs in ONNX Runtime (it is what the compiler validated), so this
backend serves any bundle on any machine: the ``cpu-ort`` target's output, and an accelerator bundle's models
where its vendor runtime is not installed.
"""

from __future__ import annotations

from pathlib import Path

from flexdsa_runtime.backends.base import SessionBackend
from flexdsa_runtime.errors import BackendUnavailable


class OnnxRuntimeBackend(SessionBackend):
    name = "onnxruntime"

    def __init__(
        self, path: Path, *, threads: int | None = None, providers: list | None = None,
        disabled_optimizers: list[str] | None = None,
    ) -> None:
        """``disabled_optimizers``: ONNX Runtime graph optimizers not to run at load (``Bundle.disabled_optimizers``)."""
        try:
            import onnxruntime as ort
        except ImportError:
            raise BackendUnavailable(
                "onnxruntime is not installed: `pip install onnxruntime` to run the bundle's ONNX models."
            ) from None
        self.disabled_optimizers = list(disabled_optimizers or [])
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        self._serve(
            ort.InferenceSession(
                str(path), options, providers=providers or ["CPUExecutionProvider"],
                disabled_optimizers=self.disabled_optimizers or None,
            )
        )  # fmt: skip
