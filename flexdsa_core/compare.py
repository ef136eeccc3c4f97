"""One model, several targets: the comparison row of each target's job, read from its report.

Every figure carries what produced it, because the rows mix sources that do not mean the same thing. The
latency, energy and accuracy are the job's own figures (``report["figures"]``, ``flexdsa_core.figures``), the
ones its report, job page and summary show, never recomputed here:

- latency: ``measured on this CPU`` (``cpu-ort``: ONNX Runtime here is the target), ``roofline estimate``
  (the cost model from the target's sourced spec), or ``not known``; a lower bound (``complete`` False, text
  ``≥ 26 µs``) where the estimate leaves CPU-fallback nodes or unsourced terms out, with ``left_out`` naming
  them. The vendor's own estimate, where its toolchain ran, is in cycles of a clock no source gives, so it
  stands beside the latency as ``vendor_estimate`` (cycles) rather than being turned into seconds;
- energy: ``roofline estimate`` (the part's sourced power times the estimated latency) or ``not known``;
- accuracy: the shipped model's check: ``vendor simulator``, ``held-out samples`` or ``ONNX Runtime
  validation``, marked ``numerics only`` where it rests on synthetic inputs (no accuracy claim);
- the accelerator's share of FLOPs and the CPU-fallback nodes from the Subgraph Mapper's partition;
- the vendor-alone baseline (``report["vendor"]``) where the vendor's toolchain compiled the original too:
  its cycles, ours, and ours / theirs.

With several shape buckets, the row is the headline bucket's (``figures["bucket"]``) and names it.
``render_comparison`` prints the rows as the text table the CLI and the bench show.
"""

from __future__ import annotations

import difflib
from typing import Any

from flexdsa_core.figures import (  # noqa: F401 - the source names, re-exported for the service's views
    HELD_OUT,
    MEASURED_HERE,
    NOT_KNOWN,
    NUMERICS_ONLY,
    OUR_VALIDATION,
    ROOFLINE,
    VENDOR_ESTIMATE,
    VENDOR_SIMULATOR,
    bound_text,
    figures_of,
    joules_text,
    runs_here,
    seconds_text,
)


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
    figures = figures_of(report)
    bucket = figures["bucket"]
    part = (report.get("partition") or {}).get(bucket) if bucket else None
    own = figures["per_bucket"].get(bucket) or {}
    return {
        "target": target.get("name"),
        "vendor": target.get("vendor"),
        "bucket": bucket,
        "latency": figures["latency"],
        "energy": figures["energy"],
        "vendor_estimate": own.get("vendor_cycles"),
        "accuracy": figures["accuracy"],
        "accelerator_flop_share": _flop_share(report, part),
        "cpu_fallback_nodes": part.get("cpu_nodes") if part else (0 if runs_here(report) else None),
        "bundle_bytes": bundle_bytes,
        "vendor_alone": _vendor_alone(report, bucket),
    }


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
    return 1.0 if runs_here(report) else None


# --- text table -------------------------------------------------------------------------------------------

_COLUMNS = ("target", "latency", "energy", "accuracy", "accel FLOPs", "CPU nodes", "bundle", "ours/vendor alone")


def render_comparison(rows: list[dict]) -> str:
    """The rows as an aligned text table, each figure as its ``text`` followed by its source in brackets, and a
    legend."""
    table = [list(_COLUMNS)]
    for row in rows:
        if row.get("error"):
            table.append([row.get("target") or "?", f"{row.get('status', 'failed')}: {row['error']}"])
            continue
        table.append([
            row["target"], _cell(row["latency"], "seconds"), _cell(row["energy"], "joules"),
            _cell(row["accuracy"], "value"), _share(row.get("accelerator_flop_share")),
            _int(row.get("cpu_fallback_nodes")), _bytes(row.get("bundle_bytes")), _alone(row.get("vendor_alone")),
        ])  # fmt: skip
    widths = [max(len(r[i]) for r in table if i < len(r) and len(r) == len(_COLUMNS)) for i in range(len(_COLUMNS))]
    lines = []
    for r in table:
        if len(r) != len(_COLUMNS):
            lines.append(f"{r[0]:<{widths[0]}}  {r[1]}")
        else:
            lines.append("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip())
    lines.append("[m] measured on this CPU  [r] roofline estimate from the target's spec  [v] vendor simulator  "
                 "[h] held-out samples  [o] ONNX Runtime validation  ≥ a lower bound: the estimate leaves out the "
                 "CPU-fallback nodes or a term its spec does not source (the job's report names which)  numerics only: "
                 "on synthetic inputs, no accuracy claim  - not known")  # fmt: skip
    return "\n".join(lines)


_MARK = {MEASURED_HERE: "m", ROOFLINE: "r", HELD_OUT: "h", OUR_VALIDATION: "o"}


def _mark(source: str) -> str:
    return "v" if source.startswith(VENDOR_SIMULATOR) else _MARK.get(source, "?")


def _cell(figure: dict, key: str) -> str:
    """The figure's text (as every surface shows it) and its source's mark; '-' where not known."""
    if figure.get(key) is None:
        return "-"
    return f"{shown_text(figure, key)} [{_mark(figure['source'])}]"


def shown_text(figure: dict, key: str) -> str:
    """``figure["text"]``; for a row kept before figures had one, written the same way from its number."""
    if figure.get("text"):
        return figure["text"]
    value = figure[key]
    if key == "seconds":
        return bound_text(seconds_text(value), not figure.get("partial"))
    if key == "joules":
        return joules_text(value)
    return f"max abs diff {value:.2e}" if figure.get("metric") == "max_abs" else f"{figure.get('metric')} {value:.5f}"


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
