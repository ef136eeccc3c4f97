"""The report: what the compiler did to a model and what it expects the model to cost on the target.

``build_report`` assembles ``report.json``; ``report_summary`` is the small subset the service keeps on the
job row; ``render_summary`` is the readable text the CLI prints. Estimated figures (cost model) and
measured ones (ONNX Runtime on this machine) are labelled as such and never mixed.

``figures`` (``flexdsa_core.figures``) is the job's one latency and energy per bucket and its one accuracy,
each with its source, that every surface shows. ``estimates`` is the cost model's node-by-node cost of the
whole graph before and after (what the Fusion Switcher compares), not a latency figure.

``headline`` is the job's one speed-up, the figure the report, the job row, the API, the CLI and the dashboard
all show, from the best source for the target, named with it (``SOURCES``) and with what it divides:

* a target that runs here (``cpu-ort``): this CPU, measured, in paired rounds: ``1 / median(t_opt / t_orig)``
  with its 95% interval ``[1 / high, 1 / low]``, and "no significant difference" when the paired comparison's
  verdict is a tie; in a lower-precision job, the shipped precision's own comparison with the original;
* an accelerator: the vendor's own estimate of ours against its compiler alone (cycles), where the
  toolchain ran; else our roofline estimate of the original against the optimised model on the target,
  each costed node by node (the Fusion Switcher's measure: every node priced alone on the target's roofline).
  This machine's CPU timings never stand for an accelerator (they stay in ``latency``, labelled).
"""

from __future__ import annotations

import hashlib
import platform
from collections import Counter
from importlib.metadata import PackageNotFoundError, version

import onnx_ir as ir

from flexdsa_core.figures import figures_of, seconds_text
from flexdsa_core.targets.spec import op_key
from flexdsa_core.version import __version__


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    return {
        "flexdsa": __version__,
        "onnx": _version("onnx"),
        "onnx-ir": _version("onnx-ir"),
        "onnxscript": _version("onnxscript"),
        "onnxruntime": _version("onnxruntime"),
        "python": platform.python_version(),
    }


def op_counts(model: ir.Model) -> dict[str, int]:
    return dict(sorted(Counter(op_key(node.op_type, node.domain) for node in model.graph).items()))


def _fusion_lines(plans: dict[str, dict]) -> list[dict]:
    """Flatten every bucket's plan into one list of candidates with the bucket named."""
    lines = []
    for bucket, plan in plans.items():
        for candidate in plan.get("candidates", []):
            lines.append({"bucket": bucket, **candidate})
    return lines


def _shapes_at(buckets, notes: dict[str, str]) -> dict[str, dict]:
    """Per bucket, the one shape its dims that stay symbolic were costed, memory-planned, validated and timed
    at (``BucketModel.at``), as input shapes; a note where the model refused the costed shape."""
    found = {}
    for bucket in buckets:
        shapes = {
            name: [bucket.at.get(d, d) if isinstance(d, str) else d for d in dims]
            for name, dims in bucket.input_shapes.items()
        }
        entry = {
            "dims": dict(bucket.at),
            "input_shapes": shapes,
            "used_for": ["fusion costing", "memory plan", "validation", "latency check"]
            if bucket.at
            else ["every stage (no dim is symbolic)"],
        }
        if bucket.name in notes:
            entry["note"] = notes[bucket.name]
        found[bucket.name] = entry
    return found


def build_report(
    *,
    target,
    options,
    ingested,
    nodes_before: dict[str, int],
    comp,
    shape_report: dict,
    shape_manifest: dict,
    validation: list[dict],
    rollbacks: list[dict],
    latency: dict | None,
    cache_stats: dict,
    stage_seconds: dict[str, float],
    total_seconds: float,
    shape_notes: dict[str, str] | None = None,
) -> dict:
    after = {bucket.name: op_counts(bucket.model) for bucket in comp.buckets}
    fusion_names = {c["rule"] for plan in comp.fusion_plans.values() for c in plan.get("candidates", [])}
    estimates = {bucket: dict(figures) for bucket, figures in comp.estimates.items()}
    _explain_gain_beyond_measurement(estimates, latency)
    first = next(iter(after.values()), {})
    options_json = options.model_dump_json()
    return {
        "flexdsa_version": __version__,
        # measured_here: the target is this machine's CPU (cpu-ort), so timings here are the target's.
        "target": {"name": target.name, "version": target.version, "vendor": target.vendor,
                   "measured_here": target.calibrated},  # fmt: skip
        "objective": options.objective,
        "model": ingested.info,
        "warnings": list(ingested.warnings),
        "nodes": {
            "before": nodes_before,
            "after": after,
            "total_before": sum(nodes_before.values()),
            "total_after": sum(first.values()),
        },
        "passes": comp.pass_records,
        # Fusion rules only; every rewrite that changed the graph (passes, target rewrites too) is below.
        "fusions": {
            "applied": [name for name in comp.applied if name in fusion_names],
            "candidates": _fusion_lines(comp.fusion_plans),
        },
        "rewrites_applied": list(comp.applied),
        "disabled_rewrites": sorted(comp.disabled),
        "legalization": comp.legalization,
        # Subgraph Mapper (accelerators): placement, fallback reasons, partitions, kernels explored vs cached.
        "partition": comp.partition,
        "shapes": {
            **shape_report,
            "buckets": [b.name for b in comp.buckets],
            "manifest": shape_manifest,
            "at": _shapes_at(comp.buckets, shape_notes or {}),
        },
        "memory": comp.memory,
        "estimates": {
            "label": "the cost model's node-by-node cost of the whole graph, before and after (what the Fusion "
            "Switcher compares; not the latency figure, which is under figures)"
            + (
                " (calibrated by measuring ONNX Runtime kernels on this machine)" if target.calibrated else ""
            ),
            "per_bucket": estimates,
        },
        "validation": {
            "performed": bool(validation),
            "ok": all(v["ok"] for v in validation) if validation else None,
            "buckets": validation,
        },
        "rollbacks": rollbacks,
        "latency": latency,
        "cache": cache_stats,
        "compile_seconds": {k: round(v, 4) for k, v in stage_seconds.items()},
        "total_seconds": round(total_seconds, 3),
        "reproducibility": {
            "model_sha256": ingested.info.get("sha256"),
            "options_sha256": hashlib.sha256(options_json.encode()).hexdigest(),
            "options": options.model_dump(),
            "target_spec_sha256": target.spec_hash(),
            "versions": versions(),
        },
    }


def _explain_gain_beyond_measurement(estimates: dict[str, dict], latency: dict | None) -> None:
    """Fusion gains summed from kernels timed alone can exceed the whole model as measured (ORT_ENABLE_ALL
    fuses the original too, and one call per kernel carries overhead a graph does not): say so, never
    leave an estimate above a measurement unexplained."""
    if not latency or not latency.get("before_s"):
        return
    figures = estimates.get(latency.get("bucket"))
    gain = (figures or {}).get("fusion_gain_estimate_s")
    if gain and gain > latency["before_s"]:
        figures["fusion_gain_exceeds_measured_model"] = (
            f"the summed per-kernel gain ({gain * 1e3:.3f} ms) exceeds the whole original model as measured "
            f"({latency['before_s'] * 1e3:.3f} ms): kernels were timed alone, each call with its own overhead, "
            "while the measured model runs at ORT_ENABLE_ALL, where ONNX Runtime fuses the original too. "
            "The measured latency is the figure to use."
        )


SOURCES = {
    "measured": "this CPU, measured",
    "vendor": "vendor estimate",
    "roofline": "roofline estimate",
    "simulator": "vendor simulator",
}


def headline(report: dict) -> dict | None:
    """The job's one speed-up with its source (module docstring); None when nothing gives one."""
    target = report.get("target") or {}
    here = target.get("measured_here", target.get("name") == "cpu-ort")
    return _measured_headline(report) if here else _estimated_headline(report)


def _measured_headline(report: dict) -> dict | None:
    latency = report.get("latency") or {}
    comparison, of = latency.get("comparison"), "fp32"
    precision = report.get("precision") or {}
    shipped = precision.get("shipped")
    if isinstance(shipped, str) and shipped != "fp32":
        chosen = next((c for c in precision.get("candidates", []) if c.get("name") == shipped), None)
        versus = ((chosen or {}).get("timing_vs_fp32") or {}).get("vs_original")
        if versus:
            comparison, of = versus, shipped
    if not comparison or not comparison.get("ratio_median"):
        return None
    low, high = comparison["ratio_ci"]
    verdict = {"faster": "faster", "slower": "slower"}.get(comparison["verdict"], "no significant difference")
    figure = {
        "speedup": round(1 / comparison["ratio_median"], 4),
        "interval": [round(1 / high, 4) if high else None, round(1 / low, 4) if low else None],
        "confidence": comparison.get("confidence"),
        "verdict": verdict,
        "against": "the original model",
        "divides": "its time / the optimised model's, paired rounds",
        "of": of,
        "source": SOURCES["measured"],
        "detail": f"ONNX Runtime CPU, 1 thread, {comparison.get('rounds')} paired rounds",
    }
    return {**figure, "text": _headline_text(figure)}


def _estimated_headline(report: dict) -> dict | None:
    vendor = report.get("vendor") or {}
    for bucket, row in (vendor.get("buckets") or {}).items():
        if row.get("ratio"):
            figure = {
                "speedup": round(1 / row["ratio"], 4), "interval": None, "verdict": None,
                "against": f"the original compiled by {vendor.get('tool')} alone", "of": row.get("precision") or "fp32",
                "divides": "its cycles / ours",
                "source": SOURCES["vendor"], "detail": f"{vendor.get('measure') or vendor.get('tool')}, bucket {bucket}",
            }  # fmt: skip
            return {**figure, "text": _headline_text(figure)}
    for bucket, estimate in ((report.get("estimates") or {}).get("per_bucket") or {}).items():
        before = (estimate.get("before") or {}).get("seconds")
        after = (estimate.get("after") or {}).get("seconds")
        if before and after:
            figure = {
                "speedup": round(before / after, 4), "interval": None, "verdict": None,
                "against": "the original model", "of": "fp32", "source": SOURCES["roofline"],
                "divides": "its node-by-node roofline cost / the optimised model's",
                "detail": f"cost model from the {report['target']['name']} spec, bucket {bucket}",
            }  # fmt: skip
            return {**figure, "text": _headline_text(figure)}
    return None


def _headline_text(figure: dict) -> str:
    """``1.12x the original model (its time / the optimised model's, paired rounds; 95% interval 1.05-1.19),
    this CPU, measured``: the ratio, what it divides, its interval and its source."""
    interval, bounds = figure.get("interval"), ""
    if interval and None not in interval:
        bounds = f"{round((figure.get('confidence') or 0.95) * 100)}% interval {interval[0]:.2f}-{interval[1]:.2f}"
    divides = figure.get("divides")
    if figure.get("verdict") == "no significant difference":
        inner = ", ".join(part for part in (f"median {figure['speedup']:.2f}x", bounds) if part)
        speed = f"no significant difference from {figure['against']} ({inner}{'; ' + divides if divides else ''})"
    else:
        inner = "; ".join(part for part in (divides, bounds) if part)
        speed = f"{figure['speedup']:.2f}x {figure['against']}" + (f" ({inner})" if inner else "")
    of = f" ({figure['of']})" if figure.get("of") not in (None, "fp32") else ""
    return f"{speed}{of}, {figure['source']}"


def report_summary(report: dict) -> dict:
    """What a job row keeps: small, and enough for the job list and the API's job view. ``speedup`` is the
    ``headline`` figure (with its interval and source under ``headline``); CPU timings are kept only where the
    target is this machine's CPU."""
    target = report.get("target") or {}
    here = target.get("measured_here", target.get("name") == "cpu-ort")
    latency = (report.get("latency") or {}) if here else {}
    top = report.get("headline") or headline(report)
    return {
        # The job's one latency and energy per bucket and its accuracy, as every surface shows them.
        "figures": figures_of(report),
        "target": report["target"]["name"],
        "nodes_before": report["nodes"]["total_before"],
        "nodes_after": report["nodes"]["total_after"],
        "fusions_applied": report["fusions"]["applied"],
        "rollbacks": report["rollbacks"],
        "validation_ok": report["validation"]["ok"],
        "latency_before_ms": round(latency["before_s"] * 1e3, 4) if latency.get("before_s") else None,
        "latency_after_ms": round(latency["after_s"] * 1e3, 4) if latency.get("after_s") else None,
        "speedup": top["speedup"] if top else None,
        "headline": top,
        "cache": report["cache"],
        "total_seconds": report["total_seconds"],
        "warnings": list(report.get("warnings", [])),
        "precision": _precision_summary(report.get("precision")),
        "vendor": _vendor_summary(report.get("vendor")),
    }


def _vendor_summary(vendor: dict | None) -> dict | None:
    """Per bucket, ours against the vendor alone by the vendor's own measure, with what produced the figures."""
    if not vendor:
        return None
    return {
        "tool": vendor.get("tool"),
        "measure": vendor.get("measure"),
        "buckets": {
            name: {
                "vendor_alone": (row.get("vendor_alone_best") or row["vendor_alone"]).get("cycles"),
                "ours": (row.get("ours") or {}).get("cycles"),
                "ratio": round(row["ratio"], 4) if row.get("ratio") is not None else None,
                "cpu_nodes": [row["vendor_alone"].get("cpu_nodes"), (row.get("ours") or {}).get("cpu_nodes")],
                "shipped": row.get("shipped"),
                "precision": row.get("precision"),
            }
            for name, row in vendor.get("buckets", {}).items()
        },
        "traffic": {k: (vendor.get("traffic") or {}).get(k) for k in ("expected_cycles_per_request", "vendor_alone_at_largest", "ratio", "requests")}
        if vendor.get("traffic") else None,
    }


def _precision_summary(precision: dict | None) -> dict | None:
    """Requested and shipped precision, the shipped model's worst cosine and its measured speed-ups."""
    if not precision:
        return None
    shipped = precision.get("shipped")
    chosen = next((c for c in precision.get("candidates", []) if c["name"] == shipped), None)
    timing = (chosen or {}).get("timing_vs_fp32") or {}
    accuracy = precision.get("accuracy") or {}
    cosines = [o["cosine"] for o in accuracy.get("outputs", {}).values() if "cosine" in o]
    calibration = precision.get("calibration_accuracy") or {}
    return {
        "requested": precision.get("requested"),
        "shipped": shipped,
        "calibration": (precision.get("calibration") or {}).get("source"),
        "min_cosine": min(cosines) if cosines else None,
        "speedup_vs_fp32": round(1 / chosen["time_ratio_vs_fp32"], 4) if chosen and chosen["time_ratio_vs_fp32"] else None,
        "speedup_vs_original": timing.get("speedup_vs_original"),
        # The worst figure (1 - loss) and what it was measured on: the held-out samples decide.
        "judged": {"worst": round(1 - accuracy["loss"], 6), "on": accuracy.get("measured_on")} if "loss" in accuracy else None,
        "on_calibration": {"worst": round(1 - calibration["loss"], 6), "on": calibration.get("measured_on")}
        if "loss" in calibration else None,
        # What the judged figure rests on and whether its one-sided 95% bound establishes the target.
        "claim": _claim_line(precision.get("claim")),
    }


def _claim_line(claim: dict | None) -> str | None:
    """``precision.claim`` in one line: the judged samples (and groups), and per output what it establishes."""
    if not claim:
        return None
    groups = f" of {claim['groups']} groups" if claim.get("groups") else ""
    parts = []
    for name, item in claim["outputs"].items():
        top1 = item.get("top1")
        if top1 and not top1["rows"]:
            parts.append(f"{name}: top-1 not judged (no confident row)")
        elif top1:
            verdict = "establishes" if top1["established"] else "does not establish"
            parts.append(f"{name}: top-1 ({top1['rule']}) on {top1['rests_on']}, bound {top1['bound']:.3f} {verdict} {top1['goal']}")
        cosine = item.get("cosine")
        if cosine:
            verdict = "establishes" if cosine["established"] else "does not establish"
            parts.append(f"{name}: cosine bound {cosine['bound']:.4f} {verdict} {cosine['goal']}")
    return f"{claim['samples']} judged samples{groups}; " + ("; ".join(parts) or "no bounded figure")


def _placement_line(report: dict) -> str | None:
    """How many nodes the Subgraph Mapper puts on the accelerator and how many on its CPU, per bucket."""
    parts = [
        f"[{bucket}] {part['accelerator_nodes']} on the accelerator, {part['cpu_nodes']} on the CPU"
        for bucket, part in (report.get("partition") or {}).items()
        if part.get("accelerator_nodes") is not None
    ]
    return f"Placement     {'; '.join(parts)} (Subgraph Mapper)" if parts else None


# The precision summary's figures, each ratio named with what it divides.
_PRECISION_FIGURES = (
    ("min_cosine", "min cosine to the original"),
    ("speedup_vs_fp32", "fp32 time / shipped time"),
    ("speedup_vs_original", "original time / shipped time"),
)


def _figure_lines(figures: dict) -> list[str]:
    """The job's figures as ``figures`` gives them: what the validation compared, each bucket's latency and
    energy (a lower bound marked, with what it leaves out) and the accuracy of the model that ships."""
    lines = [f"Validation    {figures['validation']['text']}"]
    for bucket, found in figures["per_bucket"].items():
        lines.append(f"Latency       [{bucket}] {found['latency']['label']}")
        lines.append(f"Energy        [{bucket}] {found['energy']['label']}")
        if found.get("vendor_cycles"):
            lines.append(f"  vendor      [{bucket}] {found['vendor_cycles']['cycles']:,.0f} cycles ({found['vendor_cycles']['source']})")
    lines.append(f"Accuracy      {figures['accuracy']['label']}")
    return lines


def render_summary(report: dict) -> str:
    s = report_summary(report)
    lines = [
        f"Target        {s['target']}  (objective: {report['objective']})",
        f"Nodes         {s['nodes_before']} -> {s['nodes_after']}",
    ]
    before, after = report["nodes"]["before"], next(iter(report["nodes"]["after"].values()), {})
    changed = sorted(k for k in set(before) | set(after) if before.get(k, 0) != after.get(k, 0))
    for op in changed:
        lines.append(f"  {op:<40} {before.get(op, 0):>5} -> {after.get(op, 0):<5}")
    from_samples = (report.get("shapes") or {}).get("from_samples")
    if from_samples:  # the user gave no shape_buckets: say where the shapes came from
        taken = ", ".join(f"{name} {value}" for name, value in from_samples.items())
        lines.append(f"Buckets       {', '.join(report['shapes']['buckets'])}: {taken} from the calibration samples' shapes")
    taken = [c for c in report["fusions"]["candidates"] if c.get("taken")]
    refused = [c for c in report["fusions"]["candidates"] if not c.get("taken") and c.get("matches")]
    lines.append(
        f"Fusions       {len(taken)} taken, {len(refused)} refused where they matched (see fusion_plan.json)"
    )
    for c in taken + refused:
        mark = "+" if c.get("taken") else "-"
        lines.append(f"  {mark} {c.get('rule')}: {c.get('reason', '')}")
    for bucket, notes in report.get("legalization", {}).items():
        for note in notes:
            lines.append(f"Legalised     [{bucket}] {note}")
    for rollback in report["rollbacks"]:
        lines.append(f"Rolled back   {rollback['rewrite']} ({rollback['reason']}): {rollback['detail']}")
    lines += _figure_lines(s["figures"])
    latency = report.get("latency") or {}
    if s["latency_before_ms"]:
        lines.append(
            f"ORT CPU       {seconds_text(latency['before_s'])} -> {seconds_text(latency['after_s'])} "
            "(original -> optimised; this CPU, measured, 1 thread, ORT_ENABLE_ALL, medians"
            + (f"; {latency['measures']})" if latency.get("measures") else ")")
        )
    if s["headline"]:
        lines.append(f"Speed-up      {s['headline']['text']}")
    placement = _placement_line(report)
    if placement:
        lines.append(placement)
    precision = s.get("precision")
    if precision:
        figures = [f"{label} {precision[key]}" for key, label in _PRECISION_FIGURES if precision.get(key) is not None]
        lines.append(
            f"Precision     {precision['requested']} requested, {precision['shipped']} shipped "
            f"(calibration: {precision['calibration']}{'; ' + ', '.join(figures) if figures else ''})"
        )
        for key, label in (("judged", "judged"), ("on_calibration", "calibration")):
            if precision.get(key):
                lines.append(f"  accuracy   {label}: worst figure {precision[key]['worst']:.5f} on {precision[key]['on']}")
        if precision.get("claim"):
            lines.append(f"  claim      {precision['claim']}")
        kept = [row for row in report["precision"].get("layers", []) if row.get("precision") == "float32"]
        for row in kept[:12]:  # the whole table is in report.json
            lines.append(f"  kept float  {row['layer']}: {row['reason']}")
        if len(kept) > 12:
            lines.append(f"  kept float  ... and {len(kept) - 12} more (report.json, precision.layers)")
    vendor = s.get("vendor")
    if vendor:
        lines.append(f"Vendor        ours vs {vendor['tool']} alone, by {vendor['measure'] or 'its placement'}")
        for bucket, row in vendor["buckets"].items():
            if row["ours"] is not None and row["vendor_alone"]:
                figure = f"{row['ours']:,.0f} vs {row['vendor_alone']:,.0f} cycles (ours / alone: {row['ratio']:.3f}x)"
            else:
                figure = "no cost figure from the vendor"
            lines.append(
                f"  [{bucket}] {figure}; CPU layers {row['cpu_nodes'][1]} vs {row['cpu_nodes'][0]}; "
                f"shipped {row['shipped']}{' (' + row['precision'] + ')' if row['precision'] else ''}"
            )
        traffic = vendor.get("traffic")
        if traffic and traffic.get("ratio") is not None:
            lines.append(
                f"  traffic: {traffic['expected_cycles_per_request']:,.0f} cycles per request over the buckets vs "
                f"{traffic['vendor_alone_at_largest']:,.0f} for the vendor alone at the largest observed shape "
                f"(ours / alone: {traffic['ratio']:.3f}x, {traffic['requests']} requests)"
            )
    for bucket, memory in report["memory"].items():
        arena, naive = memory.get("arena_bytes"), memory.get("naive_bytes")
        if arena is not None and naive:
            lines.append(f"Memory        [{bucket}] arena {arena / 1e6:.2f} MB vs naive {naive / 1e6:.2f} MB")
    cache = report["cache"]
    lines.append(f"Kernel cache  {cache.get('hits', 0)} hits, {cache.get('misses', 0)} misses")
    lines.append(f"Compile time  {report['total_seconds']:.2f} s")
    for warning in s["warnings"]:
        lines.append(f"WARNING       {warning}")
    return "\n".join(lines)
