"""The manifest as the deploy contract: every file of the bundle, per bucket, with its role, how to load it and
its checksum, plus what a runtime needs to serve requests of any shape (``runtime``).

The adapter writes ``manifest.json`` first (buckets, shapes, vendor files); the vendor toolchain's artifacts,
the calibration sets, ``report.json`` and ``fusion_plan.json`` join the bundle after it. So the optimiser
calls ``complete_manifest`` last, on the whole bundle, and the manifest then lists:

* ``files``: every other file of the bundle -> ``{"sha256", "size", "role", "bucket"?}``;
* ``buckets[i].dims`` (the dim values the bucket fixes) and ``buckets[i].artifacts``: the bucket's files,
  each with its ``role``, the ``runtime`` that loads it and ``load`` (how, in one sentence), preferred first;
* ``runtime``: the bucket policy (``fewest_padded_elements``), where each dim sits on the inputs, which dims
  may be padded (the compiler's padding check, ``padding_check``), the pad value per input, and the output axes
  to crop back per padded dim. ``flexdsa_runtime`` reads exactly this.

Roles are told by file name (the names the adapters and vendor drivers write): ``model.<bucket>.onnx``,
``.portable.onnx``, ``.rknn``, ``.qnn_ctx.onnx`` + ``.qnn_ctx_qnn.bin``, ``.qdq.onnx``, ``*.data`` (external
weights), ``calibration*`` / ``dataset*.txt``; the adapter's ``vendor_files`` are scripts or configs.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flexdsa_core.targets import get_adapter
from flexdsa_core.targets.spec import TargetSpec

__all__ = ["FORMAT", "POLICY", "complete_manifest", "file_role"]

FORMAT = "flexdsa-bundle/1"
POLICY = "fewest_padded_elements"

# Per role: the runtime that loads the file, and how (one sentence, for the person deploying it). A vendor's own
# artifacts (``rknn``, ``qnn-context``, its ``qdq-onnx``) are declared by its adapter (``artifact_loads``).
_LOAD: dict[str, tuple[str | None, str]] = {
    "onnx": (
        "onnxruntime",
        "onnxruntime.InferenceSession(file, providers=['CPUExecutionProvider']) (or any ONNX Runtime provider)",
    ),
    "onnx-portable": (
        "onnxruntime",
        "the same model without this machine's ONNX Runtime layout tuning: for another CPU",
    ),
    "onnx-external-data": (None, "the weights of the ONNX model of the same name; keep it beside that file"),
    "calibration": (
        None,
        "calibration samples (the job's), for recompiling or re-quantising with the scripts",
    ),
    "script": (None, "a generated conversion/compile/run script or config for this target (see README.md)"),
    "readme": (None, "how to deploy this bundle"),
    "report": (None, "what the compiler did and measured; not needed at run time"),
}
# Preferred first when a bucket has several loadable artifacts (the compiled one before the ONNX).
_PREFERENCE = ("rknn", "qnn-context", "qdq-onnx", "onnx", "onnx-portable")


def file_role(name: str, vendor_files: frozenset[str] = frozenset()) -> str:
    """The role of a bundle file, told by its name."""
    base = name.rsplit("/", 1)[-1]
    if name in vendor_files:
        return "script"
    if name.startswith("calibration") or re.fullmatch(r"dataset(\..+)?\.txt", base):
        return "calibration"
    if base.endswith(".data"):
        return "onnx-external-data"
    if base.endswith(".rknn"):
        return "rknn"
    if base.endswith(".qnn_ctx.onnx"):
        return "qnn-context"
    if base.endswith("_qnn.bin"):
        return "qnn-context-binary"
    if base.endswith(".qdq.onnx"):
        return "qdq-onnx"
    if base.endswith(".portable.onnx"):
        return "onnx-portable"
    if base.endswith(".onnx"):
        return "onnx"
    if base == "README.md":
        return "readme"
    if base in ("report.json", "fusion_plan.json"):
        return "report"
    return "script"


def _bucket_of(name: str, buckets: list[str]) -> str | None:
    """Which bucket a file belongs to: ``model.<bucket>.*``, ``calibration.<bucket>.npz``,
    ``calibration/<bucket>/``, ``dataset.<bucket>.txt``; the unnamed single bucket owns ``model.onnx*``;
    the first bucket owns the unnamed calibration set (``calibration.npz``, ``calibration/NNN_x.npy``)."""
    for bucket in sorted(buckets, key=len, reverse=True):
        if (
            name.startswith((f"model.{bucket}.", f"calibration.{bucket}.", f"calibration/{bucket}/"))
            or name == f"dataset.{bucket}.txt"
        ):
            return bucket
    single = [b for b in buckets if b in ("dynamic", "static")]
    if single and name.startswith("model.onnx"):
        return single[0]
    if buckets and (
        name in ("calibration.npz", "dataset.txt") or re.fullmatch(r"calibration/[^/]+\.npy", name)
    ):
        return buckets[0]
    return None


def _digest(data: bytes | Path) -> tuple[str, int]:
    digest = hashlib.sha256()
    if isinstance(data, Path):
        size = 0
        with data.open("rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
        return digest.hexdigest(), size
    digest.update(data)
    return digest.hexdigest(), len(data)


def complete_manifest(
    artifacts: Mapping[str, bytes | Path], report: Mapping[str, Any], target: TargetSpec
) -> bytes:
    """``manifest.json`` of ``artifacts`` with every other file listed (role, load, checksum) and ``runtime``."""
    manifest = json.loads(artifacts["manifest.json"])
    names = [b["name"] for b in manifest["buckets"]]
    vendor_files = frozenset(manifest.get("vendor_files", []))
    files: dict[str, dict[str, Any]] = {}
    per_bucket: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for name in sorted(artifacts):
        if name == "manifest.json":
            continue
        sha256, size = _digest(artifacts[name])
        role = file_role(name, vendor_files)
        bucket = _bucket_of(name, names)
        entry: dict[str, Any] = {"sha256": sha256, "size": size, "role": role}
        if bucket is not None:
            entry["bucket"] = bucket
        files[name] = entry
        if bucket is not None:
            runtime, load = _load(role, target)
            artifact = {"file": name, "role": role, "runtime": runtime, "load": load}
            if role == "qnn-context":
                artifact["provider_options"] = _provider_options(target)
            per_bucket[bucket].append(artifact)
    shape_buckets = {
        b["name"]: b for b in ((report.get("shapes") or {}).get("manifest") or {}).get("buckets", [])
    }
    for entry in manifest["buckets"]:
        entry["dims"] = dict((shape_buckets.get(entry["name"]) or {}).get("dims", {}))
        entry["artifacts"] = sorted(
            per_bucket[entry["name"]],
            key=lambda a: (
                _PREFERENCE.index(a["role"]) if a["role"] in _PREFERENCE else len(_PREFERENCE),
                a["file"],
            ),
        )
    manifest["format"] = FORMAT
    manifest["files"] = files
    manifest["runtime"] = _runtime_section(report, target)
    return json.dumps(manifest, indent=2).encode()


def _load(role: str, target: TargetSpec) -> tuple[str | None, str]:
    """The runtime that loads a file of ``role`` and how: as the target's adapter declares its own artifacts
    (``artifact_loads``: the vendor's runtime, compiler or execution provider), else as this module's table says;
    a QDQ model no adapter speaks for loads as any ONNX model."""
    declared = get_adapter(target).artifact_loads
    if role in declared:
        return declared[role]
    return _LOAD.get(role) or _LOAD["onnx"]


def _provider_options(target: TargetSpec) -> dict[str, str]:
    """The execution provider options the target's compiled models were made with (QNN: the HTP of the part),
    as its adapter declares them."""
    return dict(get_adapter(target).provider_options)


def _runtime_section(report: Mapping[str, Any], target: TargetSpec) -> dict[str, Any]:
    shapes = report.get("shapes") or {}
    padding = shapes.get("padding") or {}
    return {
        "policy": POLICY,
        "policy_text": (
            "Among the buckets whose every dim is >= the request's, take the one with the fewest padded input "
            "elements (ties: the earlier bucket); pad each bucketed input axis at its end with the input's pad "
            "value up to the bucket's size, run, and crop each output axis listed in 'crop' back to the "
            "request's size. A dim whose padding is not tolerated is served only at a bucket's exact size. A "
            "request past a dim's entry in 'limits' (the model's own largest value) is refused as such; one "
            "larger than every bucket but within the limits needs a new compile (re-specialise with its shape)."
        ),
        "static_shapes": target.static_shapes,
        "dims": (shapes.get("manifest") or {}).get("dims", {}),
        "limits": (shapes.get("manifest") or {}).get("limits", {}),
        "inputs": shapes.get("inputs", {}),
        "outputs": shapes.get("outputs", {}),
        "padding": padding.get("dims", {}),
        "pad_values": padding.get("pad_values", {}),
        "crop": padding.get("crop", {}),
    }
