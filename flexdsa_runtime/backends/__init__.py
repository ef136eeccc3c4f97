"""Backends by name, and the choice ``auto`` makes per bucket.

``auto`` takes, in the bucket's artifact order (the compiled artifact first), the first whose runtime is
importable in this process: ``rknn-lite`` for a ``.rknn`` (on the RK3588), ``qnn`` for a QNN context binary
(onnxruntime-qnn present), ONNX Runtime with the Vitis AI EP for an AMD ``.qdq.onnx`` (where that EP is), else
ONNX Runtime on the CPU with the bucket's target-ready ONNX, which every bundle has. The bridges
(``rknn-simulator``, ``qnn-emulator``: the vendor runtime in its toolchain environment, a subprocess per
bucket) are only used when named: they are for checking a bundle here, not for serving. ``qnn-emulator`` loads the
shipped context binary; ``rknn-simulator`` rebuilds the shipped ``.rknn`` from its build record (``rknn_build``:
same precision, calibration samples and float16 subgraphs), since the toolkit simulates only what it builds.
"""

from __future__ import annotations

from flexdsa_runtime.backends.base import Backend
from flexdsa_runtime.bundle import BucketSpec, Bundle
from flexdsa_runtime.errors import BackendUnavailable
from flexdsa_runtime.samples import runtime_inputs

BACKENDS = ("auto", "onnxruntime", "rknn-lite", "rknn-simulator", "qnn", "qnn-emulator")

__all__ = ["BACKENDS", "Backend", "load_backend"]


def _need(bucket: BucketSpec, role: str, backend: str) -> dict:
    artifact = bucket.artifact(role)
    if artifact is None:
        raise BackendUnavailable(
            f"backend {backend!r} runs a {role!r} artifact and bucket {bucket.name!r} has none (the vendor toolchain "
            "did not run when this bundle was compiled, or the bundle is for another target).",
            details={"bucket": bucket.name, "role": role},
        )
    return artifact


def _vitis_ai_present() -> bool:
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return "VitisAIExecutionProvider" in ort.get_available_providers()


def load_backend(
    bundle: Bundle,
    bucket: BucketSpec,
    backend: str = "auto",
    *,
    threads: int | None = None,
    provider_options: dict[str, str] | None = None,
) -> Backend:
    """The bucket loaded on ``backend`` (one of ``BACKENDS``). ``provider_options``, from the caller's code, go
    to the QNN EP on top of the manifest's, which are allow-listed (``qnn.provider_options``)."""
    from flexdsa_runtime.backends import qnn, rknn_lite
    from flexdsa_runtime.backends.onnxruntime_cpu import OnnxRuntimeBackend

    if backend not in BACKENDS:
        raise BackendUnavailable(f"unknown backend {backend!r}; known: {', '.join(BACKENDS)}")
    path = bundle.path
    if backend == "auto":
        for artifact in bucket.artifacts:
            role = artifact["role"]
            if role == "rknn" and rknn_lite.available():
                return load_backend(bundle, bucket, "rknn-lite")
            if role == "qnn-context" and qnn.available():
                return load_backend(bundle, bucket, "qnn", provider_options=provider_options)
            if role == "qdq-onnx" and artifact.get("runtime") == "onnxruntime" and _vitis_ai_present():
                return OnnxRuntimeBackend(
                    path(artifact["file"]), providers=["VitisAIExecutionProvider"],
                    disabled_optimizers=bundle.disabled_optimizers,
                )  # fmt: skip
        backend = "onnxruntime"
    if backend == "onnxruntime":
        artifact = bucket.artifact("onnx", "onnx-portable")
        if artifact is None:
            raise BackendUnavailable(f"bucket {bucket.name!r} has no ONNX model for ONNX Runtime.")
        return OnnxRuntimeBackend(path(artifact["file"]), threads=threads, disabled_optimizers=bundle.disabled_optimizers)
    if backend == "rknn-lite":
        artifact = _need(bucket, "rknn", backend)
        inputs = runtime_inputs(bundle, bucket)
        return rknn_lite.RknnLiteBackend(path(artifact["file"]), inputs, _outputs(bundle, bucket))
    if backend == "qnn":
        artifact = _need(bucket, "qnn-context", backend)
        options = qnn.provider_options(artifact.get("provider_options"), provider_options)
        return qnn.QnnBackend(path(artifact["file"]), options)
    from flexdsa_runtime.backends.bridge import BridgeBackend

    if backend == "qnn-emulator":
        artifact = _need(bucket, "qnn-context", backend)
        options = qnn.provider_options(artifact.get("provider_options"), provider_options)
        request = {"context": str(path(artifact["file"]).resolve()), "provider": options}
        return BridgeBackend(backend, request, notes=[f"the shipped {artifact['file']} loaded as it is"])
    # rknn-simulator: the toolkit rebuilds the bucket's ONNX as its .rknn was built (it cannot simulate a .rknn
    # read from a file): the same switches, precision, calibration samples and float16 subgraphs (rknn_build).
    from flexdsa_runtime.backends.rknn_build import simulator_request

    _need(bucket, "rknn", backend)
    request, notes = simulator_request(bundle, bucket, [o["name"] for o in _outputs(bundle, bucket)])
    dtypes = {i["name"]: i["dtype"] for i in runtime_inputs(bundle, bucket) if i.get("dtype")}
    return BridgeBackend(backend, request, input_dtypes=dtypes, notes=notes)


def _outputs(bundle: Bundle, bucket: BucketSpec) -> list[dict]:
    """The outputs the bucket's compiled artifact produces, in order: all but those served by the runtime."""
    entry = next(b for b in bundle.manifest["buckets"] if b["name"] == bucket.name)
    served = {s["output"] for s in bucket.served}
    return [o for o in entry.get("outputs", []) if o["name"] not in served]
