"""Qualcomm QNN: the bucket's EPContext model (``.qnn_ctx.onnx`` + its ``_qnn.bin`` context binary) on the
Hexagon HTP through ONNX Runtime's QNN execution provider, in this process.

Needs ``onnxruntime`` and the ``onnxruntime-qnn`` plugin in the interpreter running the runtime (on the
phone: arm64 wheels; on x86 the HTP backend runs in emulation). Where they are not (the project's own
environment never has them), ``qnn-emulator`` runs the same session through ``bridge`` in the qualcomm
toolchain's environment.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from flexdsa_runtime.backends.base import SessionBackend
from flexdsa_runtime.errors import BackendUnavailable

EP_NAME = "QNNExecutionProvider"
DEFAULT_PROVIDER = {"backend_type": "htp"}


def qnn_session(path: str, provider: dict):
    """An ONNX Runtime session on the QNN EP (the plugin registered once per process)."""
    import onnxruntime as ort
    import onnxruntime_qnn

    with contextlib.suppress(Exception):  # already registered in this process
        ort.register_execution_provider_library(EP_NAME, onnxruntime_qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME][:1]
    if not devices:
        raise RuntimeError("onnxruntime lists no QNN device after registering onnxruntime-qnn")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.add_provider_for_devices(devices, {**DEFAULT_PROVIDER, **provider})
    return ort.InferenceSession(path, options)


def available() -> bool:
    try:
        import onnxruntime_qnn  # noqa: F401
    except ImportError:
        return False
    return True


class QnnBackend(SessionBackend):
    name = "qnn"

    def __init__(self, path: Path, provider: dict | None = None) -> None:
        if not available():
            raise BackendUnavailable(
                "onnxruntime-qnn is not installed in this interpreter: install onnxruntime-qnn on the device, or "
                "use backend 'qnn-emulator' (the qualcomm toolchain, `flexdsa toolchains install qualcomm`)."
            )
        self._serve(qnn_session(str(path), provider or {}))
