"""One model, several targets: the comparison row of each target's job, read from its report.

Every figure carries what produced it, because the rows mix sources that do not mean the same thing:

- latency: ``measured on this CPU`` (``cpu-ort``: ONNX Runtime here is the target), ``roofline estimate``
  (the cost model from the target's sourced spec: ``on_target.latency_s``), or ``not known``. The vendor's
  own estimate, where its toolchain ran, is in cycles of a clock no source gives, so it stands beside the
  latency as ``vendor_estimate`` (cycles) rather than being turned into seconds;
- energy: ``roofline estimate`` (the part's sourced power times the estimated latency) or ``not known``;
- accuracy: ``vendor simulator`` (the vendor toolchain's run of the compiled bundle: the judged samples'
  score where samples were given, else the worst cosine to the original), ``held-out samples`` (our
  precision search, on samples the quantiser did not calibrate on), or ``ONNX Runtime validation`` (our
  float check on the CPU: agreement within the precision's tolerance, no accuracy claim);
- the accelerator's share of FLOPs and the CPU-fallback nodes from the Subgraph Mapper's partition;
- the vendor-alone baseline (``report["vendor"]``) where the vendor's toolchain compiled the original too:
  its cycles, ours, and ours / theirs.

With several shape buckets, the headline bucket is the first the report lists (the estimates' order), and
the row names it. ``render_comparison`` prints the rows as the text table the CLI and the bench show.
"""

from __future__ import annotations

import difflib
from typing import Any

MEASURED_HERE = "measured on this CPU"
ROOFLINE = "roofline estimate"
VENDOR_ESTIMATE = "vendor estimate"
VENDOR_SIMULATOR = "vendor simulator"
HELD_OUT = "held-out samples"
OUR_VALIDATION = "ONNX Runtime validation"
NOT_KNOWN = "not known"


def resolve_targets(requested: str | list[str], known: list[str]) -> list[str]:
    """The target names a multi-target request means: ``"all"`` is every built-in target; a list is checked
    name by name (duplicates dropped, order kept). ``ValueError`` names the first unknown one with the
    closest known names."""
    if isinstance(requested, str):
        if requested.strip().lower() == "all":
            return list(known)
        requested = [part for part in requested.split(",")]
    names: list[str] = []
    for raw in requested:
        name = str(raw).strip()
        if not name:
            continue
        if name.lower() == "all":
            return list(known)
        if name not in known:
            raise ValueError(unknown_target_message(name, known))
        if name not in names:
            names.append(name)
    if not names:
        raise ValueError(f"No target named. Name one or more of: {', '.join(known)}, or 'all'.")
    return names


def unknown_target_message(name: str, known: list[str]) -> str:
    if name.strip().lower() == "all" or "," in name:
        return (
            f"'target' names one target, not {name!r}: to compare several, send \"targets\" in its place "
            "(a list of names, or \"all\"; flexdsa submit --targets all). Built-in targets: " + ", ".join(known) + "."
        )
    close = difflib.get_close_matches(name, known, n=2, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return f"Unknown target {name!r}.{hint} Built-in targets: {', '.join(known)}."


def comparison_row(report: dict, bundle_bytes: int | None = None) -> dict[str, Any]:
    """The comparison row of one target's job from its ``report.json``; ``bundle_bytes``: the size of every
    file the bundle ships (the caller knows its artifacts)."""
    target = report.get("target") or {}
    per_bucket = (report.get("estimates") or {}).get("per_bucket") or {}
    partition = report.get("partition") or {}
    bucket = next(iter(per_bucket), None) or next(iter(partition), None)
    on_target = (per_bucket.get(bucket) or {}).get("on_target") if bucket else None
    part = partition.get(bucket) if bucket else None
    return {
        "target": target.get("name"),
        "vendor": target.get("vendor"),
        "bucket": bucket,
        "latency": _latency(report, on_target),
        "energy": _energy(on_target),
        "vendor_estimate": _vendor_estimate(report, bucket),
        "accuracy": _accuracy(report),
        "accelerator_flop_share": _flop_share(report, part),
        "cpu_fallback_nodes": part.get("cpu_nodes") if part else (0 if _runs_here(report) else None),
        "bundle_bytes": bundle_bytes,
        "vendor_alone": _vendor_alone(report, bucket),
    }


def _runs_here(report: dict) -> bool:
    """``cpu-ort``: the bundle runs on this machine's ONNX Runtime, so its CPU is the target itself."""
    return (report.get("target") or {}).get("name") == "cpu-ort"


def _latency(report: dict, on_target: dict | None) -> dict:
    latency = report.get("latency") or {}
    if _runs_here(report):
        if latency.get("after_s"):
            return {"seconds": latency["after_s"], "source": MEASURED_HERE, "partial": False,
                    "detail": f"{latency.get('engine', 'ONNX Runtime')}, median of {latency.get('repeats')} paired rounds"}  # fmt: skip
        return {"seconds": None, "source": NOT_KNOWN, "partial": False, "detail": "latency was not measured"}
    if on_target and on_target.get("latency_s") is not None:
        return {
            "seconds": on_target["latency_s"],
            "source": ROOFLINE,
            "partial": bool(on_target.get("partial")),
            "detail": "; ".join([on_target.get("label", ""), *on_target.get("notes", [])]).strip("; "),
        }
    return {"seconds": None, "source": NOT_KNOWN, "partial": False, "detail": "the cost model gave no latency"}


def _energy(on_target: dict | None) -> dict:
    if on_target and on_target.get("energy_j") is not None:
        return {"joules": on_target["energy_j"], "source": ROOFLINE,
                "detail": "the part's sourced power times the estimated latency"}  # fmt: skip
    return {"joules": None, "source": NOT_KNOWN, "detail": "the target's power is unsourced" if on_target else
            "no on-target estimate for this target"}  # fmt: skip


def _vendor_estimate(report: dict, bucket: str | None) -> dict | None:
    """Ours, by the vendor's own measure (cycles), where its toolchain scored the shipped bundle."""
    vendor = report.get("vendor") or {}
    rows = vendor.get("buckets") or {}
    row = rows.get(bucket) or next(iter(rows.values()), None)
    ours = (row or {}).get("ours") or {}
    if ours.get("cycles") is None:
        return None
    return {"cycles": ours["cycles"], "cpu_nodes": ours.get("cpu_nodes"),
            "source": f"{VENDOR_ESTIMATE}: {ours.get('source') or vendor.get('measure') or vendor.get('tool')}"}  # fmt: skip


def _vendor_alone(report: dict, bucket: str | None) -> dict | None:
    vendor = report.get("vendor") or {}
    rows = vendor.get("buckets") or {}
    row = rows.get(bucket) or next(iter(rows.values()), None)
    if not row:
        return None
    alone = row.get("vendor_alone_best") or row.get("vendor_alone") or {}
    if alone.get("error"):
        return {"cycles": None, "ours_cycles": (row.get("ours") or {}).get("cycles"), "ratio": None,
                "error": f"the vendor alone could not build the original: {alone['error']}",
                "source": vendor.get("tool")}  # fmt: skip
    return {
        "cycles": alone.get("cycles"),
        "ours_cycles": (row.get("ours") or {}).get("cycles"),
        "ratio": row.get("ratio"),
        "cpu_nodes": alone.get("cpu_nodes"),
        "shipped": row.get("shipped"),
        "source": alone.get("source") or vendor.get("measure") or vendor.get("tool"),
    }


def _flop_share(report: dict, part: dict | None) -> float | None:
    if part and part.get("accelerator_flop_share") is not None:
        return part["accelerator_flop_share"]
    return 1.0 if _runs_here(report) else None


def _accuracy(report: dict) -> dict:
    toolchain = report.get("toolchain") or {}
    if toolchain.get("ran"):
        buckets = (toolchain.get("buckets") or {}).values()
        judged = [b["accuracy"] for b in buckets if b.get("accuracy") and "loss" in b["accuracy"]]
        if judged:
            worst = max(judged, key=lambda a: a["loss"])
            return {"value": round(1 - worst["loss"], 6), "metric": worst.get("metric", "score"),
                    "ok": all(a.get("ok", True) for a in judged), "source": f"{VENDOR_SIMULATOR} ({toolchain.get('name')})",
                    "detail": f"on {worst.get('measured_on') or 'the judged samples'}"}  # fmt: skip
        cosines = [o["cosine"] for b in buckets for o in b.get("numerics", []) if o.get("cosine") is not None]
        if cosines:
            return {"value": round(min(cosines), 6), "metric": "cosine", "ok": None,
                    "source": f"{VENDOR_SIMULATOR} ({toolchain.get('name')})",
                    "detail": "worst cosine of the vendor's outputs to the original's, on the validation inputs"}  # fmt: skip
    accuracy = (report.get("precision") or {}).get("accuracy") or {}
    if "loss" in accuracy:
        return {"value": round(1 - accuracy["loss"], 6), "metric": accuracy.get("metric", "score"),
                "ok": accuracy.get("ok"), "source": HELD_OUT, "detail": f"on {accuracy.get('measured_on')}"}  # fmt: skip
    validation = report.get("validation") or {}
    if validation.get("performed"):
        outputs = [o for b in validation.get("buckets", []) for o in b.get("outputs", [])]
        worst = max((o.get("max_abs") or 0.0 for o in outputs), default=None)
        return {"value": worst, "metric": "max_abs", "ok": validation.get("ok"), "source": OUR_VALIDATION,
                "detail": "largest absolute difference to the original's outputs on the validation inputs"}  # fmt: skip
    return {"value": None, "metric": None, "ok": None, "source": NOT_KNOWN, "detail": "outputs were not checked"}


# --- text table -------------------------------------------------------------------------------------------

_COLUMNS = ("target", "latency", "energy", "accuracy", "accel FLOPs", "CPU nodes", "bundle", "vs vendor alone")


def render_comparison(rows: list[dict]) -> str:
    """The rows as an aligned text table, each figure followed by its source in brackets, and a legend."""
    table = [list(_COLUMNS)]
    for row in rows:
        if row.get("error"):
            table.append([row.get("target") or "?", f"{row.get('status', 'failed')}: {row['error']}"])
            continue
        table.append([
            row["target"], _seconds(row["latency"]), _joules(row["energy"]), _accuracy_text(row["accuracy"]),
            _share(row.get("accelerator_flop_share")), _int(row.get("cpu_fallback_nodes")),
            _bytes(row.get("bundle_bytes")), _alone(row.get("vendor_alone")),
        ])  # fmt: skip
    widths = [max(len(r[i]) for r in table if i < len(r) and len(r) == len(_COLUMNS)) for i in range(len(_COLUMNS))]
    lines = []
    for r in table:
        if len(r) != len(_COLUMNS):
            lines.append(f"{r[0]:<{widths[0]}}  {r[1]}")
        else:
            lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip())
    lines.append("[m] measured on this CPU  [r] roofline estimate from the target's spec  [v] vendor simulator  "
                 "[h] held-out samples  [o] ONNX Runtime validation (max abs diff)  * partial: the spec leaves a figure "
                 "unsourced or CPU-fallback time out (see the row's detail)  - not known")  # fmt: skip
    return "\n".join(lines)


_MARK = {MEASURED_HERE: "m", ROOFLINE: "r", HELD_OUT: "h", OUR_VALIDATION: "o"}


def _mark(source: str) -> str:
    return "v" if source.startswith(VENDOR_SIMULATOR) else _MARK.get(source, "?")


def _seconds(latency: dict) -> str:
    if latency.get("seconds") is None:
        return "-"
    partial = "*" if latency.get("partial") else ""
    return f"{latency['seconds'] * 1e3:.4g} ms [{_mark(latency['source'])}]{partial}"


def _joules(energy: dict) -> str:
    return "-" if energy.get("joules") is None else f"{energy['joules'] * 1e3:.4g} mJ [{_mark(energy['source'])}]"


def _accuracy_text(accuracy: dict) -> str:
    if accuracy.get("value") is None:
        return "-"
    value = accuracy["value"]
    text = f"{value:.2e}" if accuracy.get("metric") == "max_abs" else f"{accuracy.get('metric')} {value:.5f}"
    return f"{text} [{_mark(accuracy['source'])}]"


def _share(share: float | None) -> str:
    return "-" if share is None else f"{share * 100:.1f}%"


def _int(value: int | None) -> str:
    return "-" if value is None else str(value)


def _bytes(size: int | None) -> str:
    if size is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return str(size)


def _alone(alone: dict | None) -> str:
    if not alone or alone.get("ratio") is None:
        return "-"
    return f"{alone['ratio']:.3f}x cycles [v]"
