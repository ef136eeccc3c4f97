"""Running a target's vendor toolchain on the bundle, and holding its answers against ours.

For each bucket the target-ready ONNX and seeded sample inputs go to the toolchain's driver (in its own
environment, ``flexdsa_core.toolchains``). What comes back is checked here:

* numerics: the vendor simulator's/emulator's outputs (or, for a quantiser such as AMD Quark, ONNX Runtime's
  on the quantised model: the driver names what ran in ``runner`` and what it did in ``verb``) against the
  *original* model's on the same inputs,
  by cosine similarity and max abs error per output (vendor compilers run float graphs in fp16, so
  the bar is the accuracy target, ``cosine >= MIN_COSINE``, not fp32 tolerances);
* placement: the vendor's accelerator/CPU decision per node against the Subgraph Mapper's prediction,
  as the share of nodes both name on which they agree;
* artifacts: the compiled files join the bundle; outputs the vendor's model left to the runtime (rknn: inputs
  passed through, ``served_by_runtime``) come back computed from the inputs, as the runtime will make them;
* precision: at a precision other than fp32 the request carries each bucket's calibration samples
  (``dataset``: the very samples our precision stage calibrated on, so the vendor's quantiser calibrates on the
  user's data) and the adapter's options say which format to make (``toolchain_options`` reads
  ``report["precision"]``); the driver runs the compiled model on up to ``EVAL_SAMPLES`` of the samples held
  out from calibration (``held_out``: the ones our precision stage judged on; the calibration samples where
  none were held out), and those outputs are scored against the original's by the accuracy target
  (``precision.score``): ``buckets.<name>.accuracy``, with ``measured_on`` saying which samples.

A toolchain that is not installed, or fails, never fails the job: the bundle ships without the compiled
artifact, the report says why, and the README carries the command to finish on the user's side.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx_ir as ir

from flexdsa_core.targets.spec import TargetSpec
from flexdsa_core.toolchains import ToolchainError, get_toolchain
from flexdsa_core.toolchains.base import MIN_COSINE

# Held-out samples the vendor's simulator/emulator runs to judge the quantised model (they are slow); where
# vendor exploration confirmed its precision on more (``judged_samples``), as many as it did.
EVAL_SAMPLES = 8


def run_toolchain(
    target: TargetSpec, adapter, buckets, partition: dict, original_source, *, root, seed: int, workdir,
    precision: dict | None = None, calibration: dict[str, list[dict]] | None = None, accuracy=None,
    held_out: dict[str, list[dict]] | None = None, bucket_options: dict[str, dict] | None = None,
    judged_samples: dict[str, int] | None = None,
) -> tuple[dict, dict[str, Path]]:
    from flexdsa_core.ort_runs import make_inputs, proto_without_weights, run

    if not target.toolchain:
        return {"name": None, "ran": False, "detail": "no vendor toolchain installs on this machine"}, {}
    toolchain = get_toolchain(target.toolchain)
    if root is None:
        return _not_run(toolchain.name, "no toolchain folder configured", toolchain.install_command()), {}
    status = toolchain.status(root)
    if not status.ready:
        return _not_run(toolchain.name, status.detail, toolchain.install_command()), {}

    folder = Path(tempfile.mkdtemp(prefix="toolchain-", dir=workdir))
    out_dir = folder / "out"
    out_dir.mkdir()
    request_buckets, references, sample_references, judged_on = [], {}, {}, {}
    for bucket in buckets:
        model_path = folder / adapter.model_filename(bucket)
        ir.save(bucket.model, model_path)
        feeds = make_inputs(proto_without_weights(bucket.model), seed=seed, dims=bucket_dims(bucket))
        references[bucket.name] = run(original_source, feeds)
        inputs = {}
        for name, array in feeds.items():
            path = folder / f"{bucket.name}.{file_safe(name)}.npy"
            np.save(path, array)
            inputs[name] = str(path)
        entry = {"name": bucket.name, "onnx": str(model_path), "inputs": inputs}
        if (bucket_options or {}).get(bucket.name):  # what vendor exploration chose for this bucket
            entry["options"] = bucket_options[bucket.name]
        samples = (calibration or {}).get(bucket.name)
        if samples:
            entry["dataset"] = write_samples(folder, f"{bucket.name}.calibration", samples)
            decided = adapter.calibrated_options(bucket, samples)
            if decided:
                entry["options"] = {**decided, **entry.get("options", {})}
            count = (judged_samples or {}).get(bucket.name, EVAL_SAMPLES)
            judged = ((held_out or {}).get(bucket.name) or [])[:count]
            if judged:
                entry["samples"] = write_samples(folder, f"{bucket.name}.held_out.calibration", judged)
                judged_on[bucket.name] = f"{len(judged)} held-out samples, not in the vendor quantiser's dataset"
            else:
                judged = samples[:EVAL_SAMPLES]
                entry["samples"] = entry["dataset"][:EVAL_SAMPLES]
                judged_on[bucket.name] = f"{len(judged)} calibration samples (none were held out)"
            sample_references[bucket.name] = [run(original_source, s) for s in judged]
        request_buckets.append(entry)
    request = {
        "action": "compile",
        "target": target.model_dump(mode="json"),
        "out_dir": str(out_dir),
        "buckets": request_buckets,
        "options": adapter.toolchain_options(target, {"partition": partition, "precision": precision or {}}),
    }
    try:
        result = toolchain.run(root, request, workdir=folder)
    except ToolchainError as err:
        reason = one_line_reason(err.message)
        return {
            "name": toolchain.name,
            "ran": False,
            "failed": err.message,  # whole, with the vendor's traceback or log tail
            "reason": reason,
            "detail": f"the {toolchain.name} toolchain failed: {reason}",
            "warnings": [
                f"vendor toolchain {toolchain.name} failed; the bundle ships uncompiled: {reason} "
                "(its log: report.json, toolchain.failed)"
            ],
            "summary": f"{toolchain.name}: failed",
        }, {}

    per_bucket, files, warnings = {}, {}, []
    verb, runner = result.get("verb", "compiled"), result.get("runner", "simulator")
    for entry in result.get("buckets", []):
        name = entry["name"]
        numerics = _compare(references.get(name, {}), entry.get("outputs", {}))
        agreement = _agreement(partition.get(name, {}).get("placement", {}), entry.get("placement", {}))
        per_bucket[name] = {
            "artifacts": entry.get("artifacts", []),
            "numerics": numerics,
            "placement_agreement": agreement,
            "vendor_placement": entry.get("placement", {}),
            **{k: entry[k] for k in ("reasons", "layers", "notes", "seconds", "quantization", "packed_uint16", "served_by_runtime",
                                     "layer_accuracy") if k in entry},
        }
        if name in sample_references and accuracy is not None:
            per_bucket[name]["accuracy"] = _sample_accuracy(
                sample_references[name], entry.get("sample_outputs") or [], accuracy
            )
            per_bucket[name]["accuracy"]["measured_on"] = judged_on[name]
        for artifact in entry.get("artifacts", []):
            files[artifact] = out_dir / artifact
        bad = [o for o in numerics if o["cosine"] is not None and o["cosine"] < MIN_COSINE]
        if bad:
            warnings.append(
                f"[{name}] the {toolchain.name} {runner}'s output {bad[0]['name']!r} has cosine "
                f"{bad[0]['cosine']:.4f} to the original (below {MIN_COSINE})"
            )
    agreements = [b["placement_agreement"]["share"] for b in per_bucket.values()
                  if b["placement_agreement"]["share"] is not None]  # fmt: skip
    cosines = [o["cosine"] for b in per_bucket.values() for o in b["numerics"] if o["cosine"] is not None]
    summary = f"{toolchain.name} {verb} {len(per_bucket)} bucket(s)"
    if cosines:
        summary += f", {runner} cosine to the original >= {min(cosines):.5f}"
    if agreements:
        summary += f", placement agreement {min(agreements) * 100:.1f}%"
    return {
        "name": toolchain.name,
        "ran": True,
        "versions": result.get("versions", {}),
        "buckets": per_bucket,
        "artifacts": sorted(files),
        "warnings": warnings,
        "summary": summary,
    }, files


def bucket_dims(bucket) -> dict[str, int]:
    """The bucket's value of every symbolic dim its model's inputs still name: the one shape a model kept
    dynamic (the original, shipped where the vendor alone built it better) is compiled and checked at."""
    dims = dict(bucket.at)
    for value in bucket.model.graph.inputs:
        given = bucket.input_shapes.get(value.name)
        if value.shape is None or given is None or len(given) != value.shape.rank():
            continue
        for dim, size in zip(value.shape, given, strict=True):
            if not isinstance(dim, int) and getattr(dim, "value", None) and isinstance(size, int):
                dims[str(dim.value)] = size
    return dims


def write_samples(folder: Path, prefix: str, samples: list[dict]) -> list[dict[str, str]]:
    """Each sample's inputs as .npy files (``<prefix>.<index>.<input>.npy``); per sample, input name -> path (what
    the drivers' ``dataset`` and ``samples`` take)."""
    written = []
    for index, sample in enumerate(samples):
        paths = {}
        for name, array in sample.items():
            path = folder / f"{prefix}.{index:03d}.{file_safe(name)}.npy"
            np.save(path, array)
            paths[name] = str(path)
        written.append(paths)
    return written


def _sample_accuracy(reference: list[dict], outputs: list[dict[str, str]], accuracy) -> dict:
    """``precision.score`` of the vendor's outputs on the judged samples against the original's."""
    from flexdsa_core.accuracy import score

    if len(outputs) != len(reference):
        return {"ok": False, "loss": 1.0, "outputs": {},
                "detail": f"the toolchain returned outputs for {len(outputs)} of {len(reference)} samples"}  # fmt: skip
    got = []
    for want, paths in zip(reference, outputs, strict=True):
        sample = {}
        for name, value in want.items():
            if name not in paths:
                return {"ok": False, "loss": 1.0, "outputs": {}, "detail": f"output {name!r} not returned"}
            sample[name] = np.load(paths[name]).reshape(value.shape).astype(value.dtype)
        got.append(sample)
    found = score(reference, got, accuracy)
    found["samples"] = len(reference)
    return found


def _not_run(name: str, detail: str, command: str) -> dict:
    return {
        "name": name,
        "ran": False,
        "detail": detail,
        "install": command,
        "summary": f"{name}: not run ({detail})",
    }


def _compare(reference: dict[str, np.ndarray], outputs: dict[str, str]) -> list[dict]:
    found = []
    for name, want in reference.items():
        path = outputs.get(name)
        if path is None:
            found.append({"name": name, "cosine": None, "max_abs": None, "note": "not returned by the toolchain"})
            continue
        got = np.load(path)
        if got.size != want.size:
            found.append({"name": name, "cosine": None, "max_abs": None,
                          "note": f"shape {list(got.shape)} vs original {list(want.shape)}"})  # fmt: skip
            continue
        a = want.astype(np.float64).ravel()
        b = got.astype(np.float64).reshape(-1)
        norm = float(np.linalg.norm(a) * np.linalg.norm(b))
        cosine = float(a @ b / norm) if norm else (1.0 if np.allclose(a, b) else 0.0)
        found.append({"name": name, "cosine": cosine, "max_abs": float(np.max(np.abs(a - b))) if a.size else 0.0})
    return found


def _agreement(ours: dict[str, str], theirs: dict[str, str]) -> dict:
    common = sorted(set(ours) & set(theirs))
    if not theirs:  # a quantiser (AMD Quark) places nothing: there is nothing to hold ours against
        return {"share": None, "compared": 0, "note": "the vendor toolchain reports no placement"}
    if not common:
        return {"share": None, "compared": 0, "note": "no node names in common with the vendor's placement"}
    differ = [n for n in common if ours[n] != theirs[n]]
    return {
        "share": 1 - len(differ) / len(common),
        "compared": len(common),
        "differ": [{"node": n, "ours": ours[n], "vendor": theirs[n]} for n in differ[:50]],
    }


def file_safe(name: str) -> str:
    """``name`` as a file-name part: letters, digits, - and _ (others become _), at most 64 characters."""
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:64]


def one_line_reason(message: str) -> str:
    """One line saying why a vendor tool failed: the text before any traceback or log, and the exception a
    traceback ends with (``RuntimeError: Unsupported op 'X'``), never the traceback itself."""
    lines = [line.rstrip() for line in message.splitlines() if line.strip()]
    if not lines:
        return "no reason given"
    head = lines[0].removesuffix("Last lines of its log:").strip()
    if "Traceback (most recent call last):" in message:
        tail = message.split("Traceback (most recent call last):")[-1]
        raised = [line.strip() for line in tail.splitlines() if line.strip() and not line.startswith((" ", "\t"))]
        if raised:
            head = head.removesuffix("Traceback (most recent call last):").strip().rstrip(":.")
            return f"{head}: {raised[-1]}" if head and head != raised[-1] else raised[-1]
    return head if len(lines) == 1 else f"{head} ..."

