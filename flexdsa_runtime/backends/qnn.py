"""Qualcomm QNN: the bucket's EPContext model (``.qnn_ctx.onnx`` + its ``_qnn.bin`` context binary) on the
Hexagon HTP through ONNX Runtime's QNN execution provider, in this process.

Needs ``onnxruntime`` and the ``onnxruntime-qnn`` plugin in the interpreter running the runtime (on the
phone: arm64 wheels; on x86 the HTP backend runs in emulation). Where they are not (the project's own
environment never has them), ``qnn-emulator`` runs the same session through ``bridge`` in the qualcomm
toolchain's environment.

The manifest's ``provider_options`` are data about the compiled context (the HTP it was made for, how to run
it), so only the options in ``MANIFEST_OPTIONS`` are taken from it, with string values; any other key refuses
the bundle. Options that name a library to load (``backend_path``, ``op_packages``, ...) or a file to write
(``qnn_saver_path``, ``profiling_file_path``, ...) come only from the caller's code (``provider_options=``).
Without ``backend_path`` the EP loads its own backend library for ``backend_type`` (``libQnnHtp.so``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from flexdsa_runtime.backends.base import SessionBackend
from flexdsa_runtime.errors import BackendUnavailable, BundleError

EP_NAME = "QNNExecutionProvider"
DEFAULT_PROVIDER = {"backend_type": "htp"}
# ONNX Runtime's QNN EP options that are plain values (no path, no library), which a manifest may set.
MANIFEST_OPTIONS = frozenset({
    "backend_type",  # restricted to BACKEND_TYPES below
    "htp_arch", "soc_model", "device_id",  # the part the context binary was compiled for
    "htp_performance_mode", "htp_graph_finalization_optimization_mode", "enable_htp_fp16_precision",
    "vtcm_mb", "rpc_control_latency", "qnn_context_priority", "offload_graph_io_quantization",
    "enable_htp_spill_fill_buffer", "enable_htp_shared_memory_allocator",
})  # fmt: skip
# The backends that run a graph; "saver" and "ir" write it to files instead.
BACKEND_TYPES = frozenset({"htp", "cpu", "gpu"})


def provider_options(from_manifest, from_caller: dict | None = None) -> dict[str, str]:
    """The QNN EP's options: its default, the manifest's (refused with ``BundleError`` naming every key that is
    not in ``MANIFEST_OPTIONS``, or a value that is not a string), then the caller's, trusted, on top. A
    caller's ``backend_path`` replaces ``backend_type`` (the EP takes one or the other)."""
    if from_manifest is not None and not isinstance(from_manifest, dict):
        raise BundleError(f"provider_options in the manifest is {from_manifest!r}, not a table of options.")
    manifest = dict(from_manifest or {})
    unknown = sorted(str(key) for key in manifest if key not in MANIFEST_OPTIONS)
    if unknown:
        raise BundleError(
            f"the manifest sets QNN provider options {', '.join(unknown)}, which a bundle may not set (a library "
            f"to load or a file to write): refused. A manifest may set {', '.join(sorted(MANIFEST_OPTIONS))}; "
            "pass anything else in code (Runtime.open(..., provider_options=...)).",
            details={"refused": unknown},
        )
    for key, value in manifest.items():
        if not isinstance(value, str):
            raise BundleError(
                f"the manifest's QNN provider option {key} is {value!r}, not a string: refused."
            )
    if manifest.get("backend_type", "htp") not in BACKEND_TYPES:
        raise BundleError(
            f"the manifest's QNN backend_type {manifest['backend_type']!r} is not one that runs the model "
            f"({', '.join(sorted(BACKEND_TYPES))}): refused.",
            details={"refused": ["backend_type"]},
        )
    options = {**DEFAULT_PROVIDER, **manifest, **(from_caller or {})}
    if from_caller and "backend_path" in from_caller and "backend_type" not in from_caller:
        options.pop("backend_type", None)
    return options


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
    options.add_provider_for_devices(devices, provider)
    return ort.InferenceSession(path, options)


def available() -> bool:
    try:
        import onnxruntime_qnn  # noqa: F401
    except ImportError:
        return False
    return True


class QnnBackend(SessionBackend):
    name = "qnn"

    def __init__(self, path: Path, provider: dict[str, str]) -> None:
        """``provider``: the EP's options as ``provider_options`` gives them (checked there)."""
        if not available():
            raise BackendUnavailable(
                "onnxruntime-qnn is not installed in this interpreter: install onnxruntime-qnn on the device, or "
                "use backend 'qnn-emulator' (the qualcomm toolchain, `flexdsa toolchains install qualcomm`)."
            )
        self._serve(qnn_session(str(path), provider))
