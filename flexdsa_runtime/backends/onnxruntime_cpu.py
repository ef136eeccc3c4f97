"""ONNX Runtime on the CPU: the bucket's target-ready ONNX (``role: onnx``), or another ONNX artifact.

Every bundle carries one ONNX per bucket that runs in ONNX Runtime (it is what the compiler validated), so this
backend serves any bundle on any machine: the ``cpu-ort`` target's output, and an accelerator bundle's models
where its vendor runtime is not installed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from flexdsa_runtime.backends.base import ORT_DTYPES
from flexdsa_runtime.errors import BackendUnavailable


class OnnxRuntimeBackend:
    name = "onnxruntime"

    def __init__(self, path: Path, *, threads: int | None = None, providers: list | None = None) -> None:
        try:
            import onnxruntime as ort
        except ImportError:
            raise BackendUnavailable(
                "onnxruntime is not installed: `pip install onnxruntime` to run the bundle's ONNX models."
            ) from None
        options = ort.SessionOptions()
        options.log_severity_level = 3
        if threads:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(
            str(path), options, providers=providers or ["CPUExecutionProvider"]
        )
        self.input_dtypes = {
            i.name: np.dtype(ORT_DTYPES.get(i.type, np.float32)) for i in self.session.get_inputs()
        }
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.output_names, self.session.run(self.output_names, feeds), strict=True))

    def close(self) -> None:
        self.session = None
