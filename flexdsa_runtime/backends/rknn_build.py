"""What the ``rknn-simulator`` bridge builds: the bucket's ``.rknn`` again, as it shipped.

rknn-toolkit2 simulates only a model it built itself (``init_runtime`` refuses a ``.rknn`` loaded from a file), so
the bridge rebuilds the bucket's target-ready ONNX in the toolkit. To check what shipped it must build what
shipped: the compiler's toolchain run wrote beside each ``.rknn`` its build record (``<file>.rknn.build.json``:
the ``rknn.config`` switches, ``int8`` or ``float16``, the hybrid pairs in the toolkit's own tensor names, and per
calibration sample the sha256 of each input's ``.npy``). The request repeats that: the same switches and precision,
calibrated on the very samples the shipped file was, found among the bundle's calibration files by those digests
(``samples.bucket_samples``), with the same float16 subgraphs. ``notes`` say what was rebuilt, and anything that
could not be repeated (a bundle older than build records: float16; calibration samples it lacks).
"""

from __future__ import annotations

import json
from typing import Any

from flexdsa_runtime.bundle import BucketSpec, Bundle
from flexdsa_runtime.errors import BackendUnavailable, BundleError
from flexdsa_runtime.samples import BucketSamples, bucket_samples, runtime_inputs

RECORD_SUFFIX = ".build.json"
RECORD_FORMAT = "flexdsa-rknn-build/1"


def build_record(bundle: Bundle, bucket: BucketSpec) -> dict[str, Any] | None:
    """The build record of the bucket's ``.rknn`` (listed in the manifest beside it), or None."""
    rknn = bucket.artifact("rknn")
    if rknn is None:
        return None
    name = rknn["file"] + RECORD_SUFFIX
    if name not in bundle.manifest["files"]:
        return None
    try:
        record = json.loads(bundle.path(name).read_text())
    except ValueError as err:
        raise BundleError(f"{name} is not valid JSON ({err}).", details={"file": name}) from None
    if not isinstance(record, dict) or record.get("format") != RECORD_FORMAT:
        raise BundleError(
            f"{name} is not a {RECORD_FORMAT} build record (format {record.get('format') if isinstance(record, dict) else None!r}).",
            details={"file": name},
        )
    return record


def simulator_request(bundle: Bundle, bucket: BucketSpec, outputs: list[str]) -> tuple[dict, list[str]]:
    """The bridge's ``load`` request rebuilding the bucket's ``.rknn`` as it shipped, and notes saying how."""
    rknn = bucket.artifact("rknn")
    onnx_file = bucket.artifact("onnx")
    inputs = runtime_inputs(bundle, bucket)
    if rknn is None or onnx_file is None or not bucket.inputs:
        raise BackendUnavailable(
            f"bucket {bucket.name!r} lacks the .rknn, the static ONNX or the input shapes the simulator needs."
        )
    request = {
        "onnx": str(bundle.path(onnx_file["file"]).resolve()),
        "inputs": [{"name": i["name"], "shape": i["shape"]} for i in inputs],
        "outputs": outputs,
        # The compiler left these out of the .rknn; the simulator's build leaves them out the same way.
        "prune_outputs": bool(bucket.served),
        "shipped": str(bundle.path(rknn["file"]).resolve()),
        "precision": "float16",
    }
    record = build_record(bundle, bucket)
    if record is None:
        return request, [
            f"{rknn['file']} has no build record (a bundle made before they were kept): rebuilt float16, which "
            "may not be the precision that shipped (report.json → toolchain → buckets says what did)"
        ]
    request.update(
        config=record.get("config") or {},
        precision=record.get("precision", "float16"),
        hybrid_steps=bool(record.get("hybrid_steps")),
        hybrid=record.get("hybrid") or [],
        auto_hybrid=bool(record.get("auto_hybrid")),
    )
    if request["precision"] != "int8":
        return request, [f"rebuilt float16 as {rknn['file']} was ({rknn['file']}{RECORD_SUFFIX})"]
    found = bucket_samples(bundle, bucket, record)
    rows, how = _calibration(found, record, rknn["file"], bucket)
    names = record.get("inputs") or [i["name"] for i in inputs]
    request["dataset"] = [[str(bundle.path(row[name]).resolve()) for name in names] for row in rows]
    config = request["config"]
    scheme = ", ".join(
        str(config[k]) for k in ("quantized_dtype", "quantized_algorithm", "quantized_method") if k in config
    )
    notes = [f"rebuilt int8 ({scheme or 'the toolkit default'}) as {rknn['file']} was: {how}"]
    if request["hybrid"] or request["auto_hybrid"]:
        kept = (
            f"{len(request['hybrid'])} subgraph(s)" if request["hybrid"] else "the toolkit's automatic choice"
        )
        notes.append(f"hybrid quantisation as shipped: {kept} kept float16")
    return request, notes


def _calibration(found: BucketSamples, record: dict, rknn: str, bucket: BucketSpec) -> tuple[list[dict], str]:
    """The calibration rows to build with, and how they were chosen."""
    wanted = len(record.get("calibration") or [])
    if not found.samples:
        raise BackendUnavailable(
            f"{rknn} was built int8 on {wanted} calibration sample(s) and bucket {bucket.name!r} ships none: the "
            "simulator cannot rebuild what shipped (the toolkit simulates only a model it builds itself).",
            details={"bucket": bucket.name},
        )
    if found.calibrated is not None:
        rows = [found.samples[i] for i in found.calibrated]
        return rows, (
            f"calibrated on the {len(rows)} sample(s) of {found.listing} it was calibrated on "
            f"({len(found.held_out)} held out)"
        )
    return found.samples, (
        f"the {wanted} sample(s) it was calibrated on are not all in {found.listing}: calibrated on all "
        f"{len(found.samples)} sample(s) there instead, so the rebuilt model may differ slightly from the shipped one"
    )
