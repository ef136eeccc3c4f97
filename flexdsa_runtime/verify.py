"""A bundle checks itself: ``python -m flexdsa_runtime verify BUNDLE`` (``flexdsa verify-bundle BUNDLE`` runs it).

For every bucket, each artifact a runtime loads (``manifest.json``: the ``.rknn``, the QNN context, the ONNX
models) runs through that runtime where it is present here: ONNX Runtime for the ONNX models; for a ``.rknn``,
rknn-toolkit-lite2 on the board, else rknn-toolkit2's simulator where the rockchip toolchain is installed
(``rknn-simulator``: the shipped ``.rknn`` rebuilt as its build record says, its size compared with the shipped
file's); for a QNN context, the QNN EP, else its HTP emulation where the qualcomm toolchain is. An artifact whose
runtime is not here is skipped, with what would run it.

* **Inputs**: the samples the bundle ships for the bucket (its calibration set): the held-out ones where the
  build record says which were calibrated on (the very samples the job judged the artifact on), else all of them;
  at most ``--samples``. A bucket without shipped samples gets one seeded synthetic input (normal floats, ones
  for masks, 0/1 for other integers), said: synthetic inputs check numerics, never an accuracy claim.
* **Reference**: the original model where ``--original`` gives it (a bundle does not keep it); else, for a
  compiled or quantised artifact, the bucket's float ONNX, which the compiler validated against the original
  within the tolerances report.json states (``validation``).
* **Claim**: what ``report.json`` says of that artifact. A vendor binary: its toolchain's accuracy on the judged
  samples (``toolchain.buckets.<b>.accuracy``, per-output cosine) when checked on shipped samples, its cosine to
  the original on random inputs (``numerics``) when checked on synthetic ones; a lower-precision ONNX: the
  precision stage's held-out accuracy; the float ONNX: the validation's tolerances per output (``atol``,
  ``rtol``), held against the original only (it is its own float reference).

Verdict per artifact: **PASS**, **FAIL**, **RAN** (it ran, but there is nothing comparable to hold it against:
no reference, or a claim on samples the bundle does not ship) or **SKIP** (its runtime is not here, or cannot
rebuild it). A cosine claim holds when the measured deficit ``1 - cos`` is at most twice the claimed one plus
``COSINE_SLACK``: on the job's own held-out samples a faithful artifact gives the claimed figure (the rebuild and
the simulator are deterministic; seen equal to 6 digits), and on other samples of the same data the deficit moves
by a fraction of itself (a pooled cosine over a few samples), while a wrong artifact (another precision, changed
weights, a lost calibration) multiplies it many times over; ``COSINE_SLACK`` covers float rounding across
machines and thread counts (summation order: ~1e-7 on a float32 cosine). A tolerance claim holds as the
validation decided it: ``|got - want| <= atol + rtol * |want|`` everywhere.

Exit status: 0 every checked artifact passed; 1 one fell below its claim (or failed to run); 2 the bundle is
missing or unusable (no manifest, a checksum that does not match, an unreadable zip); 3 nothing could be checked.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from flexdsa_runtime.backends import qnn, rknn_lite
from flexdsa_runtime.backends.bridge import toolchain_python
from flexdsa_runtime.bundle import BucketSpec, Bundle, open_bundle, unpack
from flexdsa_runtime.errors import BackendUnavailable, BundleError, RuntimeRefusal
from flexdsa_runtime.samples import bucket_samples, input_names, load, runtime_inputs
from flexdsa_runtime.served import serve

# A cosine claim holds while the measured deficit (1 - cos) is at most DEFICIT_FACTOR times the claimed one plus
# COSINE_SLACK (module docstring).
DEFICIT_FACTOR = 2.0
COSINE_SLACK = 1e-5
# Shipped samples run per artifact by default: as many as the job's vendor check judged on
# (flexdsa_core.vendor_runs.toolchain_run.EVAL_SAMPLES).
DEFAULT_SAMPLES = 8
EXIT_PASS, EXIT_FAIL, EXIT_UNUSABLE, EXIT_NOTHING_CHECKED = 0, 1, 2, 3
# Roles a runtime loads, and the backends that run each here, in order of preference.
_RUNNERS = {
    "rknn": ("rknn-lite", "rknn-simulator"),
    "qnn-context": ("qnn", "qnn-emulator"),
    "qdq-onnx": ("onnxruntime",),
    "onnx": ("onnxruntime",),
    "onnx-portable": ("onnxruntime",),
}
_VENDOR_ROLES = ("rknn", "qnn-context", "qdq-onnx")


@dataclass
class Check:
    """One artifact's check."""

    bucket: str
    artifact: str
    role: str
    status: str  # PASS, FAIL, RAN or SKIP
    backend: str | None = None
    reason: str = ""
    inputs: str = ""
    reference: str = ""
    claimed: str = ""
    measured: dict[str, dict[str, float]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Claim:
    text: str
    cosines: dict[str, float] | None = None  # per output
    tolerances: dict[str, tuple[float, float]] | None = None  # per output: atol, rtol


@dataclass
class _Inputs:
    feeds: list[dict[str, np.ndarray]]
    text: str
    synthetic: bool


def verify_bundle(path: Path, *, original: Path | None = None, samples: int = DEFAULT_SAMPLES) -> list[Check]:
    """Every loadable artifact of the bundle at ``path`` (a folder or a zip) checked against its claim. The vendor
    toolchains are looked for where the bridges look (``FLEXDSA_TOOLCHAINS_DIR``, else ~/.cache/flexdsa/toolchains)."""
    path = Path(path)
    if not path.exists():
        raise BundleError(
            f"{path} does not exist: give a bundle folder (`flexdsa optimize -o`) or a bundle.zip."
        )
    scratch = None
    try:
        if path.is_file():
            scratch = Path(tempfile.mkdtemp(prefix="flexdsa-verify-"))
            unpack(path, scratch)
            path = scratch
        bundle = open_bundle(path)
        report = _report(bundle)
        reference_session = _session(original) if original is not None else None
        checks = []
        for bucket in bundle.buckets:
            checks += _bucket_checks(bundle, bucket, report, reference_session, original, samples)
        return checks
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def exit_status(checks: list[Check]) -> int:
    if any(check.status == "FAIL" for check in checks):
        return EXIT_FAIL
    return EXIT_PASS if any(check.status == "PASS" for check in checks) else EXIT_NOTHING_CHECKED


# ---- per bucket -------------------------------------------------------------------------------------


def _bucket_checks(bundle, bucket, report, reference_session, original, samples) -> list[Check]:
    from flexdsa_runtime.backends.rknn_build import build_record

    record = build_record(bundle, bucket)
    inputs: _Inputs | None = None
    float_onnx = _float_onnx(bucket, report)
    checks = []
    for artifact in bucket.artifacts:
        role = artifact["role"]
        if role not in _RUNNERS or (role == "qdq-onnx" and artifact.get("runtime") != "onnxruntime"):
            continue  # not loaded by a runtime (a script, a calibration file, a QDQ model a vendor compiles)
        check = Check(bucket.name, artifact["file"], role, "SKIP")
        checks.append(check)
        backend_name, why = _runner(role)
        if backend_name is None:
            check.reason = why
            continue
        try:
            backend = _load(bundle, bucket, artifact, backend_name)
        except BackendUnavailable as err:
            check.backend, check.reason = backend_name, err.message
            if err.details.get("log_tail") is not None:  # the vendor runtime itself failed on it: no skip
                check.status = "FAIL"
                tail = err.details["log_tail"][-300:]
                check.reason = f"the vendor runtime failed on it: {err.message} (its log ends: {tail!r})"
            continue
        except (RuntimeRefusal, RuntimeError, OSError, ValueError) as err:
            check.backend, check.status = backend_name, "FAIL"
            check.reason = f"could not load it: {getattr(err, 'message', None) or err}"
            continue
        check.backend = getattr(backend, "name", backend_name)
        check.notes = list(getattr(backend, "notes", []))
        if role == "qdq-onnx" and backend_name == "onnxruntime" and not _vitis_ai():
            check.notes.append(
                "the QDQ model on ONNX Runtime's CPU provider: the quantised numerics, not the NPU's"
            )
        try:
            if inputs is None:
                inputs = _inputs(bundle, bucket, report, record, samples, backend)
            check.inputs = inputs.text
            got = [_run(backend, bucket, feeds) for feeds in inputs.feeds]
        except (RuntimeRefusal, RuntimeError, OSError, ValueError, KeyError) as err:
            check.status, check.reason = "FAIL", f"did not run: {getattr(err, 'message', None) or err}"
            continue
        finally:
            backend.close()
        reference, check.reference = _reference(
            bundle, bucket, artifact, float_onnx, reference_session, original, inputs
        )
        claim, why_not = _claim(report, bucket.name, artifact, role, inputs, float_onnx, reference_session)
        check.claimed = claim.text if claim else why_not
        if reference is None:
            check.status, check.reason = "RAN", check.reference
            continue
        check.measured = _measure(reference, got)
        if claim is None:
            check.status, check.reason = "RAN", why_not
            continue
        check.status, check.reason = _judge(claim, check.measured, reference, got)
        if check.status == "PASS" and _not_as_shipped(backend, record):
            check.status = "FAIL"
            check.reason = (
                "the simulator's rebuild is not the shipped file (another size, same toolkit version): its figures do "
                "not stand for it"
            )
    return checks


def _not_as_shipped(backend, record: dict | None) -> bool:
    """The rknn simulator rebuilt something of another size than the shipped file with the very toolkit version
    that built it (another version may lay the file out otherwise: then only the note says so)."""
    rebuilt = getattr(backend, "rebuilt", None) or {}
    return bool(rebuilt and record and rebuilt.get("size") != rebuilt.get("shipped_size")
                and rebuilt.get("toolkit") == record.get("toolkit"))  # fmt: skip


def _runner(role: str) -> tuple[str | None, str]:
    """The backend that runs ``role`` here, or None and why none does."""
    for name in _RUNNERS[role]:
        if name == "onnxruntime" and _importable("onnxruntime"):
            return name, ""
        if name == "rknn-lite" and rknn_lite.available():
            return name, ""
        if name == "qnn" and qnn.available():
            return name, ""
        if name == "rknn-simulator" and toolchain_python("rockchip"):
            return name, ""
        if name == "qnn-emulator" and toolchain_python("qualcomm"):
            return name, ""
    return None, {
        "rknn": "no runtime for a .rknn here: rknn-toolkit-lite2 runs it on the RK3588; off the board, "
        "`flexdsa toolchains install rockchip` gives rknn-toolkit2's simulator",
        "qnn-context": "no runtime for a QNN context here: onnxruntime-qnn runs it on the device; off it, "
        "`flexdsa toolchains install qualcomm` gives the HTP emulation",
    }.get(role, "onnxruntime is not installed here (`pip install onnxruntime`)")


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _load(bundle: Bundle, bucket: BucketSpec, artifact: dict, backend: str):
    from flexdsa_runtime.backends import load_backend
    from flexdsa_runtime.backends.onnxruntime_cpu import OnnxRuntimeBackend

    if backend == "onnxruntime":
        providers = None
        if artifact["role"] == "qdq-onnx" and _vitis_ai():
            providers = ["VitisAIExecutionProvider"]
        return OnnxRuntimeBackend(
            bundle.path(artifact["file"]), providers=providers, disabled_optimizers=bundle.disabled_optimizers
        )
    return load_backend(bundle, bucket, backend)


def _vitis_ai() -> bool:
    import onnxruntime as ort

    return "VitisAIExecutionProvider" in ort.get_available_providers()


def _run(backend, bucket: BucketSpec, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The artifact's outputs on ``feeds`` (at the bucket's shapes), with those the runtime serves beside it."""
    cast = {name: np.asarray(value).astype(backend.input_dtypes.get(name, np.asarray(value).dtype), copy=False)
            for name, value in feeds.items()}  # fmt: skip
    outputs = backend.run(cast)
    if bucket.served:
        outputs = {**serve(bucket.served, cast), **outputs}
    return outputs


# ---- inputs -----------------------------------------------------------------------------------------


def _inputs(bundle, bucket, report, record, count: int, backend) -> _Inputs:
    found = bucket_samples(bundle, bucket, record)
    if found.samples:
        if found.judged is not None:
            chosen = found.judged[:count]
            calibrated = set(chosen) & set(found.calibrated or ())
            text = f"{len(chosen)} sample(s) of {found.listing}, those the job judged it on" + (
                ", which it also calibrated on (none were held out)" if calibrated else ""
            )
        elif found.calibrated is not None and found.held_out:
            chosen = found.held_out[:count]
            text = (f"{len(chosen)} held-out sample(s) of {found.listing} (the build was calibrated on "
                    f"{len(found.calibrated)} others)")  # fmt: skip
        else:
            chosen = list(range(len(found.samples)))[:count]
            text = f"{len(chosen)} sample(s) of {found.listing}, the bundle's calibration set" + (
                " (which of them the build calibrated on is not recorded)" if found.calibrated is None else ""
            )
        return _Inputs([load(bundle, found.samples[i]) for i in chosen], text, False)
    shapes = _shapes(bundle, bucket, report)
    dtypes = {i["name"]: i.get("dtype") for i in runtime_inputs(bundle, bucket)}
    rng = np.random.default_rng(0)
    feeds = {}
    for name, shape in shapes.items():
        dtype = np.dtype(dtypes.get(name) or backend.input_dtypes.get(name) or np.float32)
        if dtype == np.bool_:
            feeds[name] = rng.integers(0, 2, size=shape).astype(bool)
        elif np.issubdtype(dtype, np.integer):
            feeds[name] = (
                np.ones(shape, dtype) if "mask" in name.lower() else rng.integers(0, 2, shape).astype(dtype)
            )
        else:
            feeds[name] = rng.standard_normal(shape).astype(dtype)
    described = ", ".join(f"{name} {list(shape)}" for name, shape in shapes.items())
    text = (f"1 synthetic input, seeded ({described}): the bundle ships no samples for this bucket, so numerics "
            "only, no accuracy claim")  # fmt: skip
    return _Inputs([feeds], text, True)


def _shapes(bundle: Bundle, bucket: BucketSpec, report: dict) -> dict[str, list[int]]:
    """Each input's shape at the bucket: its static shape, else the shape the validation ran it at, else its
    symbolic dims at the bucket's values (1 where the bucket fixes none)."""
    validated = next(
        (b.get("input_shapes") or {} for b in (report.get("validation") or {}).get("buckets") or []
         if b.get("bucket") == bucket.name),
        {},
    )  # fmt: skip
    declared = {i["name"]: i.get("shape") for i in runtime_inputs(bundle, bucket)}
    shapes = {}
    for name in input_names(bundle, bucket):
        shape = declared.get(name) or []
        if all(isinstance(d, int) for d in shape) and shape:
            shapes[name] = list(shape)
        elif name in validated:
            shapes[name] = list(validated[name])
        else:
            shapes[name] = [d if isinstance(d, int) else bucket.dims.get(str(d), 1) for d in shape]
    return shapes


# ---- reference and claim ----------------------------------------------------------------------------


def _float_onnx(bucket: BucketSpec, report: dict) -> dict | None:
    """The bucket's float ONNX: its ``onnx`` artifact, unless the precision stage shipped a lower precision in
    that very file (cpu-ort int8: the QDQ model is the ONNX) rather than in a vendor binary beside it."""
    artifact = bucket.artifact("onnx")
    section = _precision_section(report, bucket.name)
    shipped = section.get("shipped")
    if (
        artifact is None
        or shipped in (None, "fp32")
        or "vendor binary" in str(section.get("shipped_in") or "")
    ):
        return artifact
    return None


def _precision_section(report: dict, bucket: str) -> dict:
    precision = report.get("precision") or {}
    sections = precision.get("buckets") or {precision.get("bucket"): precision}
    return sections.get(bucket) or (precision if len(sections) == 1 else {}) or {}


def _session(model: Path):
    import onnxruntime as ort

    if not Path(model).is_file():
        raise RuntimeRefusal(f"--original {model}: no such file.")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except Exception as err:  # ONNX Runtime raises its own types for a file it cannot read
        raise RuntimeRefusal(f"--original {model}: ONNX Runtime cannot load it ({err}).") from None


def _reference(bundle, bucket, artifact, float_onnx, session, original, inputs: _Inputs):
    """The reference outputs per input and what they are, or (None, why there is none)."""
    if session is not None:
        types = {i.name: i.type for i in session.get_inputs()}
        from flexdsa_runtime.backends.base import ORT_DTYPES

        names = [o.name for o in session.get_outputs()]
        found = []
        for feeds in inputs.feeds:
            cast = {
                n: np.asarray(v).astype(ORT_DTYPES.get(types[n], np.float32))
                for n, v in feeds.items()
                if n in types
            }
            found.append(dict(zip(names, session.run(names, cast), strict=True)))
        return found, f"the original model ({Path(original).name}, --original)"
    if float_onnx is None or float_onnx["file"] == artifact["file"] or artifact["role"] == "onnx-portable":
        return None, (
            "no reference here: the bundle does not keep the original model and this is its float model; give "
            "--original MODEL.onnx to hold it against the original"
        )
    from flexdsa_runtime.backends.onnxruntime_cpu import OnnxRuntimeBackend

    backend = OnnxRuntimeBackend(bundle.path(float_onnx["file"]), disabled_optimizers=bundle.disabled_optimizers)
    try:
        found = [_run(backend, bucket, feeds) for feeds in inputs.feeds]
    finally:
        backend.close()
    return found, (
        f"the bucket's float {float_onnx['file']} (validated against the original: report.json → validation)"
    )


def _claim(report, bucket, artifact, role, inputs: _Inputs, float_onnx, session) -> tuple[_Claim | None, str]:
    """What report.json claims of this artifact, comparable with these inputs, or (None, why not)."""
    if not report:
        return None, "no claim: the bundle has no report.json"
    if role in _VENDOR_ROLES:
        entry = ((report.get("toolchain") or {}).get("buckets") or {}).get(bucket) or {}
        accuracy = entry.get("accuracy") or {}
        per_output = {
            n: o["cosine"] for n, o in (accuracy.get("outputs") or {}).items() if o.get("cosine") is not None
        }
        if per_output and not inputs.synthetic:
            on = accuracy.get("measured_on") or "the judged samples"
            return _Claim(f"cosine {min(per_output.values()):.6f} on {on} (vendor simulator)", per_output), ""
        numerics = {
            o["name"]: o["cosine"] for o in entry.get("numerics") or [] if o.get("cosine") is not None
        }
        if numerics:
            return _Claim(
                f"cosine {min(numerics.values()):.6f} to the original on random inputs (vendor simulator, numerics)",
                numerics,
            ), ""  # fmt: skip
        return None, "no claim for it in report.json (toolchain → buckets)"
    if artifact["role"] == "onnx" and float_onnx is None:  # the lower-precision model itself
        accuracy = _precision_section(report, bucket).get("accuracy") or {}
        per_output = {
            n: o["cosine"] for n, o in (accuracy.get("outputs") or {}).items() if o.get("cosine") is not None
        }
        if not per_output:
            return None, "no accuracy claim for it in report.json (precision)"
        on = accuracy.get("measured_on") or "the held-out samples"
        if inputs.synthetic:
            return None, (f"its claim (cosine {min(per_output.values()):.6f} on {on}) is on samples this bundle does "
                          "not ship: not comparable with synthetic inputs")  # fmt: skip
        return _Claim(f"cosine {min(per_output.values()):.6f} on {on} (precision stage)", per_output), ""
    validated = next(
        (b for b in (report.get("validation") or {}).get("buckets") or [] if b.get("bucket") == bucket), None
    )
    if validated is None or session is None:
        return (
            None,
            "no claim comparable without the original (report.json → validation holds it to the original)",
        )
    tolerances = {o["name"]: (float(o["atol"]), float(o["rtol"])) for o in validated.get("outputs") or []
                  if o.get("atol") is not None and o.get("rtol") is not None}  # fmt: skip
    worst = max((o.get("max_abs") or 0.0 for o in validated.get("outputs") or []), default=0.0)
    return _Claim(
        f"within the validation's tolerances of the original (max abs diff {worst:.3g} on its inputs)",
        tolerances=tolerances,
    ), ""  # fmt: skip


# ---- figures ----------------------------------------------------------------------------------------


def _measure(reference: list[dict], got: list[dict]) -> dict[str, dict[str, float]]:
    """Per output: the cosine pooled over every sample, the largest absolute difference; integer outputs: the
    share of equal elements. An output the artifact lacks is reported as such."""
    found = {}
    for name in reference[0]:
        if any(name not in outputs for outputs in got):
            found[name] = {"missing": 1.0}
            continue
        want = [np.asarray(r[name]) for r in reference]
        have = [np.asarray(g[name]) for g in got]
        if any(w.shape != h.shape for w, h in zip(want, have, strict=True)):
            found[name] = {"shape_differs": 1.0}
            continue
        if not np.issubdtype(want[0].dtype, np.floating):
            found[name] = {
                "agreement": float(np.mean([np.mean(w == h) for w, h in zip(want, have, strict=True)]))
            }
            continue
        a = np.concatenate([w.astype(np.float64).ravel() for w in want])
        b = np.concatenate([h.astype(np.float64).ravel() for h in have])
        norms = float(np.linalg.norm(a) * np.linalg.norm(b))
        cosine = float(a @ b / norms) if norms else (1.0 if not a.any() and not b.any() else 0.0)
        found[name] = {
            "cosine": cosine if np.isfinite(cosine) else 0.0,
            "max_abs": float(np.max(np.abs(a - b))),
        }
    return found


def _judge(claim: _Claim, measured: dict, reference: list[dict], got: list[dict]) -> tuple[str, str]:
    broken = [n for n, m in measured.items() if "missing" in m or "shape_differs" in m]
    if broken:
        return "FAIL", f"output(s) missing or of another shape: {', '.join(broken)}"
    if claim.cosines is not None:
        short = []
        for name, claimed in claim.cosines.items():
            figures = measured.get(name) or {}
            value = figures.get("cosine", figures.get("agreement"))
            if value is None:
                continue
            allowed = DEFICIT_FACTOR * (1.0 - claimed) + COSINE_SLACK
            if 1.0 - value > allowed:
                short.append(f"{name}: cosine {value:.6f} against the claimed {claimed:.6f} (allowed down to "
                             f"{1.0 - allowed:.6f})")  # fmt: skip
        return ("FAIL", "; ".join(short)) if short else ("PASS", "")
    outside = []
    for name, (atol, rtol) in (claim.tolerances or {}).items():
        for want, have in zip((r[name] for r in reference), (g[name] for g in got), strict=True):
            want, have = np.asarray(want, np.float64), np.asarray(have, np.float64)
            excess = np.abs(have - want) - (atol + rtol * np.abs(want))
            if not np.all(excess <= 0):
                outside.append(f"{name}: max abs diff {np.max(np.abs(have - want)):.3g} beyond atol {atol:g} + "
                               f"rtol {rtol:g}")  # fmt: skip
                break
    return ("FAIL", "; ".join(outside)) if outside else ("PASS", "")


def _report(bundle: Bundle) -> dict[str, Any]:
    name = next((n for n, e in bundle.manifest["files"].items() if n.rsplit("/", 1)[-1] == "report.json"
                 and e.get("role") == "report"), None)  # fmt: skip
    if name is None:
        return {}
    try:
        return json.loads(bundle.path(name).read_text())
    except ValueError as err:
        raise BundleError(f"{name} is not valid JSON ({err}).") from None


# ---- the command ------------------------------------------------------------------------------------


def render(checks: list[Check]) -> str:
    """The checks as text: one line per artifact, then what it ran on, against what, and its notes."""
    lines = []
    for check in checks:
        backend = check.backend or "-"
        figures = "; ".join(
            f"{name} " + ", ".join(f"{key} {value:.6f}" if key in ("cosine", "agreement") else f"{key} {value:.3g}"
                                   for key, value in values.items())
            for name, values in check.measured.items()
        )  # fmt: skip
        lines.append(f"{check.status:<4}  {check.bucket}  {check.artifact}  [{backend}]")
        for label, text in (("why", check.reason), ("measured", figures), ("claimed", check.claimed),
                            ("inputs", check.inputs), ("reference", check.reference)):  # fmt: skip
            if text and not (label == "why" and check.status == "RAN" and text == check.reference):
                lines.append(f"      {label}: {text}")
        lines += [f"      note: {note}" for note in check.notes]
    counts = {s: sum(1 for c in checks if c.status == s) for s in ("PASS", "FAIL", "RAN", "SKIP")}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    status = exit_status(checks)
    verdict = {
        EXIT_PASS: "every checked artifact holds its claim",
        EXIT_FAIL: "an artifact falls below its claim",
        EXIT_NOTHING_CHECKED: "nothing could be checked against a claim here (see why above)",
    }[status]
    lines.append(f"{summary or 'no artifact'}: {verdict}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flexdsa_runtime verify",
        description="Check a Flex-DSA bundle: run each artifact through its runtime where that runtime is here, on "
        "the bundle's own samples, and hold its outputs against the accuracy report.json claims.",
        epilog="Exit status: 0 every checked artifact holds its claim; 1 one falls below it or failed to run; 2 the "
        "bundle is missing or unusable; 3 nothing could be checked (no runtime here, no reference or no claim).",
    )
    parser.add_argument(
        "bundle", type=Path, help="the bundle: a folder (flexdsa optimize -o) or a bundle.zip"
    )
    parser.add_argument(
        "--original", type=Path, help="the original ONNX model, to hold every artifact against"
    )
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES,
                        help=f"at most this many shipped samples per artifact (default {DEFAULT_SAMPLES})")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    args = parser.parse_args(argv)
    if args.samples < 1:
        parser.error("--samples must be at least 1")
    try:
        checks = verify_bundle(args.bundle, original=args.original, samples=args.samples)
    except RuntimeRefusal as err:  # the bundle (or --original) is missing or unusable
        print(f"error: {err.message}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.json:
        print(json.dumps({"status": exit_status(checks), "checks": [asdict(c) for c in checks]}, indent=1))
    else:
        print(render(checks))
    return exit_status(checks)
