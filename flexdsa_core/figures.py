"""The job's figures: one latency and one energy per shape bucket and one accuracy per job, each with its
source, computed once when the report is built (``report["figures"]``) and read, never recomputed, by every
surface: the report summary the API and the CLI print, the comparison row (the group page, its chart and
the "which chip?" table), the job page, and ``traffic propose``, which anchors its prices to the figure of
the bundle's bucket. A report written before figures were kept gets them from ``figures_of``.

Latency of a bucket, from the best source the job has (DESIGN, "Cost model"):

* ``measured on this CPU`` (``cpu-ort``, whose target is this machine): ONNX Runtime's median time of the
  optimised model in the latency check, at the bucket it timed; other buckets were not timed (not known);
* ``roofline estimate`` (an accelerator): the Subgraph Mapper's kernels priced on the target's sourced spec
  (``estimates.per_bucket[b].on_target``, ``vendor_runs/estimate.py``): kernels + transfers + CPU-fallback
  time. Where the estimate leaves a part of the model out (CPU-fallback nodes on a CPU with no sourced
  peak, kernels or transfers without a sourced bandwidth) the figure is a lower bound: ``complete`` False,
  ``left_out`` naming the part, the text ``≥ 26 µs`` and the label ``≥ 26 µs (roofline estimate; not
  included: 4 CPU-fallback nodes)``. The vendor's own estimate (rknn-toolkit2's cycles), where its
  toolchain ran, stands beside it as ``vendor_cycles``: the NPU's clock is unsourced, so cycles are never
  turned into seconds.

Energy: the roofline's (the part's sourced power times that latency: a lower bound where the latency is
one), else not known; nothing measures energy here.

Accuracy: the check of the model that ships (``of``): the vendor simulator's where its toolchain ran (the
judged samples' score, else the worst cosine to the original), else the held-out samples of the precision
search, else ONNX Runtime's validation (max abs difference). Synthetic inputs (the seeded random validation
inputs, or synthetic calibration) check numerics only: ``numerics_only`` is then True, the text says
"numerics only" and the figure is no accuracy claim. ``validation`` says which model the validation
compared with the original: in an int8 job the fp32 optimised model, not the one that ships.

Each figure carries ``text`` (the value as shown: ``≥ 26 µs``) and ``label`` (the value with its source and
what it leaves out); every surface prints one of those two, so the same figure reads the same everywhere.
"""

from __future__ import annotations

from typing import Any

MEASURED_HERE = "measured on this CPU"
ROOFLINE = "roofline estimate"
VENDOR_ESTIMATE = "vendor estimate"
VENDOR_SIMULATOR = "vendor simulator"
HELD_OUT = "held-out samples"
OUR_VALIDATION = "ONNX Runtime validation"
NOT_KNOWN = "not known"
NUMERICS_ONLY = "numerics only"
RANDOM_INPUTS = "the validation inputs (seeded random)"


def seconds_text(seconds: float) -> str:
    """``26 µs``, ``1.23 ms``, ``2.5 s``: three significant digits, the one format every surface uses."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s"


def joules_text(joules: float) -> str:
    if joules < 1e-3:
        return f"{joules * 1e6:.3g} µJ"
    if joules < 1:
        return f"{joules * 1e3:.3g} mJ"
    return f"{joules:.3g} J"


def bound_text(value_text: str, complete: bool) -> str:
    """A lower bound reads ``≥ 26 µs``."""
    return value_text if complete else f"≥ {value_text}"


def figures_of(report: dict) -> dict[str, Any]:
    """``report["figures"]``; for a report written before they were kept, computed from it."""
    found = report.get("figures")
    return found if isinstance(found, dict) and isinstance(found.get("per_bucket"), dict) else job_figures(report)


def job_figures(report: dict) -> dict[str, Any]:
    """Every bucket's latency and energy, the job's accuracy and what its validation compared; ``bucket``,
    ``latency`` and ``energy`` at the top are the headline bucket's (the one a comparison row shows)."""
    buckets = _buckets(report)
    per_bucket = {bucket: bucket_figures(report, bucket) for bucket in buckets}
    bucket = _headline_bucket(report, buckets)
    chosen = per_bucket.get(bucket) or {
        "latency": _unknown_latency("the report has no bucket"),
        "energy": _unknown_energy("the report has no bucket"),
    }
    return {
        "bucket": bucket,
        "latency": chosen["latency"],
        "energy": chosen["energy"],
        "accuracy": accuracy_figure(report),
        "validation": validation_figure(report),
        "per_bucket": per_bucket,
    }


def bucket_figures(report: dict, bucket: str) -> dict[str, Any]:
    return {
        "dims": _dims(report, bucket),
        "latency": latency_figure(report, bucket),
        "energy": energy_figure(report, bucket),
        "vendor_cycles": _vendor_cycles(report, bucket),
    }


def runs_here(report: dict) -> bool:
    """The target is this machine's CPU (``cpu-ort``): its timings here are the target's."""
    target = report.get("target") or {}
    return bool(target.get("measured_here", target.get("name") == "cpu-ort"))


# --- latency and energy ------------------------------------------------------------------------------------


def latency_figure(report: dict, bucket: str) -> dict[str, Any]:
    if runs_here(report):
        return _measured_latency(report.get("latency") or {}, bucket, _shipped_timing(report))
    on_target = _on_target(report, bucket)
    if not on_target or on_target.get("latency_s") is None:
        return _unknown_latency("the cost model gave no latency for this bucket")
    detail = "; ".join(part for part in (on_target.get("label"), *on_target.get("notes", [])) if part)
    return _figure("seconds", on_target["latency_s"], ROOFLINE, _left_out(report, bucket, on_target), detail)


def _measured_latency(latency: dict, bucket: str, shipped: tuple[str, dict] | None) -> dict[str, Any]:
    """The latency check's time of the optimised model; where a lower precision ships, its own time, from
    the precision search's rounds paired with the original (the rounds the headline divides)."""
    if not latency.get("after_s") and not shipped:
        return _unknown_latency(latency.get("reason") or "measure_latency was off")
    if latency.get("bucket") not in (None, bucket):
        return _unknown_latency(f"the latency check timed bucket {latency['bucket']} only")
    if shipped:
        name, versus = shipped
        detail = f"the shipped {name} model, ONNX Runtime, median of {versus.get('rounds')} rounds paired with the original"
        return _figure("seconds", versus["second_s"], MEASURED_HERE, [], detail)
    detail = (
        f"{latency.get('engine', 'ONNX Runtime')}, {latency.get('intra_op_threads', 1)} thread(s), "
        f"{latency.get('graph_optimization_level', '')}, median of {latency.get('repeats')} paired rounds"
    )
    return _figure("seconds", latency["after_s"], MEASURED_HERE, [], detail)


def _shipped_timing(report: dict) -> tuple[str, dict] | None:
    """(name, its paired comparison with the original) of a lower precision that ships and was timed here."""
    precision = report.get("precision") or {}
    shipped = precision.get("shipped")
    if not isinstance(shipped, str) or shipped == "fp32" or precision.get("vendor_quantiser"):
        return None
    chosen = next((c for c in precision.get("candidates") or [] if isinstance(c, dict) and c.get("name") == shipped), None)
    versus = ((chosen or {}).get("timing_vs_fp32") or {}).get("vs_original") or {}
    return (shipped, versus) if versus.get("second_s") else None


def energy_figure(report: dict, bucket: str) -> dict[str, Any]:
    if runs_here(report):
        return _unknown_energy("nothing measures energy on this CPU, and cpu-ort has no sourced power")
    on_target = _on_target(report, bucket)
    if not on_target:
        return _unknown_energy("no on-target estimate for this bucket")
    if on_target.get("energy_j") is None:
        return _unknown_energy("the target's power is unsourced")
    detail = "the part's sourced power times the estimated latency"
    return _figure("joules", on_target["energy_j"], ROOFLINE, _left_out(report, bucket, on_target), detail)


def _figure(unit: str, value: float, source: str, left_out: list[str], detail: str) -> dict[str, Any]:
    complete = not left_out
    shown = seconds_text(value) if unit == "seconds" else joules_text(value)
    text = bound_text(shown, complete)
    omitted = ", ".join(left_out) or None
    label = f"{text} ({source}" + (f"; not included: {omitted})" if omitted else ")")
    return {unit: value, "source": source, "complete": complete, "partial": not complete, "left_out": omitted,
            "text": text, "label": label, "detail": detail}  # fmt: skip


def _unknown_latency(reason: str) -> dict[str, Any]:
    return _unknown("seconds", reason)


def _unknown_energy(reason: str) -> dict[str, Any]:
    return _unknown("joules", reason)


def _unknown(unit: str, reason: str) -> dict[str, Any]:
    return {unit: None, "source": NOT_KNOWN, "complete": True, "partial": False, "left_out": None,
            "text": NOT_KNOWN, "label": f"{NOT_KNOWN} ({reason})", "detail": reason}  # fmt: skip


def _left_out(report: dict, bucket: str, on_target: dict) -> list[str]:
    """What the estimate leaves out; for a report from before ``left_out`` was kept, the fallback nodes of
    its partition where it was marked partial."""
    if "left_out" in on_target:
        return list(on_target["left_out"] or [])
    if not on_target.get("partial"):
        return []
    cpu_nodes = ((report.get("partition") or {}).get(bucket) or {}).get("cpu_nodes")
    return [f"{cpu_nodes} CPU-fallback nodes"] if cpu_nodes else ["a part its spec leaves unsourced"]


def _on_target(report: dict, bucket: str) -> dict | None:
    per_bucket = (report.get("estimates") or {}).get("per_bucket") or {}
    return (per_bucket.get(bucket) or {}).get("on_target")


def _vendor_cycles(report: dict, bucket: str) -> dict | None:
    """Ours, by the vendor's own measure (cycles), where its toolchain scored the shipped bundle."""
    vendor = report.get("vendor") or {}
    ours = (((vendor.get("buckets") or {}).get(bucket) or {}).get("ours")) or {}
    if ours.get("cycles") is None:
        return None
    return {"cycles": ours["cycles"], "cpu_nodes": ours.get("cpu_nodes"),
            "source": f"{VENDOR_ESTIMATE}: {ours.get('source') or vendor.get('measure') or vendor.get('tool')}"}  # fmt: skip


def _buckets(report: dict) -> list[str]:
    for found in (
        (report.get("estimates") or {}).get("per_bucket"),
        (report.get("shapes") or {}).get("buckets"),
        report.get("partition"),
    ):
        if found:
            return list(found)
    bucket = (report.get("latency") or {}).get("bucket")
    return [bucket] if bucket else []


def _headline_bucket(report: dict, buckets: list[str]) -> str | None:
    timed = (report.get("latency") or {}).get("bucket")
    if runs_here(report) and timed in buckets:
        return timed
    return buckets[0] if buckets else None


def _dims(report: dict, bucket: str) -> dict[str, int]:
    """The dims the bucket's figures are for: its own, and those its symbolic dims were costed and timed at."""
    shapes = report.get("shapes") or {}
    own = next((b.get("dims") or {} for b in (shapes.get("manifest") or {}).get("buckets", []) if b.get("name") == bucket), {})
    return {**own, **(((shapes.get("at") or {}).get(bucket) or {}).get("dims") or {})}


# --- accuracy and validation -------------------------------------------------------------------------------


def shipped_precision(report: dict) -> str:
    """The precision of the model that ships: the precision search's choice, else the vendor toolchain's
    quantisation (an int8-only part quantises whatever was asked), else fp32."""
    shipped = (report.get("precision") or {}).get("shipped")
    if isinstance(shipped, str) and shipped != "fp32":
        return shipped
    for bucket in ((report.get("toolchain") or {}).get("buckets") or {}).values():
        quantised = _vendor_precision((bucket or {}).get("quantization") if isinstance(bucket, dict) else None)
        if quantised and quantised != "fp32":
            return quantised
    return "fp32"


def _vendor_precision(quantization) -> str | None:
    """A toolchain's quantisation: Quark's record (``{"precision": "int8"}``), or the line RKNN and QNN write
    ("rknn w8a8 ...", "float graph on HTP FP16 ...", "uint8 activations ...")."""
    if isinstance(quantization, dict):
        return quantization.get("precision")
    if not isinstance(quantization, str):
        return None
    words = quantization.lower()
    if "fp16" in words or "float16" in words:
        return "fp16"
    return "int8" if any(w in words for w in ("int8", "w8a8", "uint8", "uint16")) else None


def accuracy_figure(report: dict) -> dict[str, Any]:
    """The shipped model's check against the original, with its source and what it was measured on."""
    shipped = shipped_precision(report)
    found = _toolchain_accuracy(report) or _held_out_accuracy(report) or _validation_accuracy(report)
    if found is None:
        return {"value": None, "metric": None, "ok": None, "source": NOT_KNOWN, "numerics_only": False,
                "of": shipped, "detail": "outputs were not checked", "text": NOT_KNOWN,
                "label": f"{NOT_KNOWN} (outputs were not checked)"}  # fmt: skip
    value, metric = found["value"], found["metric"]
    shown = f"max abs diff {value:.2e}" if metric == "max_abs" else f"{metric} {value:.5f}"
    text = f"{shown}, {NUMERICS_ONLY}" if found["numerics_only"] else shown
    model = "the optimised model" if shipped == "fp32" else f"the shipped {shipped} model"
    label = f"{text} ({found['source']}: {model}, {found['detail']})"
    return {**found, "of": shipped, "text": text, "label": label}


def _toolchain_accuracy(report: dict) -> dict | None:
    toolchain = report.get("toolchain") or {}
    if not toolchain.get("ran"):
        return None
    source = f"{VENDOR_SIMULATOR} ({toolchain.get('name')})"
    buckets = [b for b in (toolchain.get("buckets") or {}).values() if isinstance(b, dict)]
    judged = [b["accuracy"] for b in buckets if isinstance(b.get("accuracy"), dict) and "loss" in b["accuracy"]]
    if judged:
        worst = max(judged, key=lambda a: a["loss"])
        on = worst.get("measured_on") or "the judged samples"
        return {"value": round(1 - worst["loss"], 6), "metric": worst.get("metric", "score"),
                "ok": all(a.get("ok", True) for a in judged), "source": source,
                "numerics_only": _synthetic(report, on), "detail": f"on {on}"}  # fmt: skip
    cosines = [o["cosine"] for b in buckets for o in b.get("numerics") or [] if isinstance(o, dict) and o.get("cosine") is not None]
    if not cosines:
        return None
    return {"value": round(min(cosines), 6), "metric": "cosine", "ok": None, "source": source, "numerics_only": True,
            "detail": f"worst cosine to the original's outputs on {RANDOM_INPUTS}"}  # fmt: skip


def _held_out_accuracy(report: dict) -> dict | None:
    accuracy = (report.get("precision") or {}).get("accuracy") or {}
    if "loss" not in accuracy:
        return None
    on = accuracy.get("measured_on") or "the held-out samples"
    return {"value": round(1 - accuracy["loss"], 6), "metric": accuracy.get("metric", "score"),
            "ok": accuracy.get("ok"), "source": HELD_OUT, "numerics_only": _synthetic(report, on),
            "detail": f"on {on}"}  # fmt: skip


def _validation_accuracy(report: dict) -> dict | None:
    validation = report.get("validation") or {}
    if not validation.get("performed"):
        return None
    outputs = [o for b in validation.get("buckets", []) for o in b.get("outputs", [])]
    worst = max((o["max_abs"] for o in outputs if isinstance(o.get("max_abs"), int | float)), default=0.0)
    return {"value": worst, "metric": "max_abs", "ok": validation.get("ok"), "source": OUR_VALIDATION,
            "numerics_only": True, "detail": f"largest difference to the original's outputs on {RANDOM_INPUTS}"}  # fmt: skip


def _synthetic(report: dict, measured_on: str) -> bool:
    calibration = ((report.get("precision") or {}).get("calibration") or {}).get("source")
    return calibration == "synthetic" or "synthetic" in measured_on


def validation_figure(report: dict) -> dict[str, Any]:
    """What the validation compared with the original, and its verdict, in words: in a job that ships a
    lower precision it validated the fp32 optimised model, and says so."""
    validation = report.get("validation") or {}
    shipped = shipped_precision(report)
    model = "the optimised model" if shipped == "fp32" else "the fp32 optimised model"
    if not validation.get("performed"):
        return {"ok": None, "of": model, "text": "skipped (validate_outputs=false)"}
    found = _validation_accuracy(report) or {}
    text = (
        f"{'passed' if validation.get('ok') else 'FAILED'}: {model} against the original, max abs diff "
        f"{found.get('value', 0.0):.3g} on {RANDOM_INPUTS}"
    )
    if shipped != "fp32":
        text += f"; not the shipped {shipped} model (its check: accuracy)"
    return {"ok": validation.get("ok"), "of": model, "text": text}
