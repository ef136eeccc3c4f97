"""What a job group's page shows: the comparison table's cells and the chart's bars, laid out here so the
template only places them (an inline SVG: no script, nothing fetched from elsewhere).

The chart has one panel per figure (latency, energy, the accelerator's share of FLOPs); in each, one bar per
target, scaled to the panel's largest value, labelled with the value and coloured by its source, so an
estimate is never mistaken for a measurement. A target with no figure gets a "not known" label, no bar.
"""

from __future__ import annotations

from typing import Any

from flexdsa_core.compare import (
    HELD_OUT,
    MEASURED_HERE,
    NOT_KNOWN,
    OUR_VALIDATION,
    ROOFLINE,
    VENDOR_SIMULATOR,
)
from service.api._pages import _filesize

LABEL_W = 150  # the target names' column
BAR_W = 300
VALUE_W = 190
ROW_H = 22
PANEL_GAP = 30

PLACEMENT = "Subgraph Mapper"  # the accelerator's share of FLOPs: our partition, neither timed nor estimated
SOURCE_CLASS = {MEASURED_HERE: "measured", ROOFLINE: "estimate", NOT_KNOWN: "unknown", PLACEMENT: "placement"}


def source_class(source: str | None) -> str:
    if not source:
        return "unknown"
    if source.startswith(VENDOR_SIMULATOR) or source.startswith("vendor"):
        return "vendor"
    return SOURCE_CLASS.get(source, {HELD_OUT: "measured", OUR_VALIDATION: "measured"}.get(source, "estimate"))


def _panel(title: str, unit: str, rows: list[dict], value, text) -> dict[str, Any]:
    """One panel: ``value(row)`` -> (number or None, source)."""
    figures = [(row["target"], *value(row)) for row in rows]
    largest = max((v for _, v, _ in figures if v), default=0.0)
    bars = []
    for index, (target, number, source) in enumerate(figures):
        width = round(BAR_W * number / largest, 1) if number and largest else 0.0
        bars.append({
            "target": target, "y": index * ROW_H, "width": max(width, 1.0) if number else 0.0,
            "label": text(number) + (f" ({source})" if number is not None else ""),
            "known": number is not None, "cls": source_class(source if number is not None else None),
        })  # fmt: skip
    return {"title": f"{title} ({unit})", "bars": bars, "height": len(bars) * ROW_H}


def chart(rows: list[dict]) -> dict[str, Any]:
    done = [row for row in rows if "latency" in row]
    panels = [
        _panel("Latency", "ms", done, lambda r: (_ms(r["latency"]["seconds"]), r["latency"]["source"]), _num),
        _panel("Energy per inference", "mJ", done, lambda r: (_ms(r["energy"]["joules"]), r["energy"]["source"]), _num),
        _panel("FLOPs on the accelerator", "%", done,
               lambda r: (_pct(r.get("accelerator_flop_share")), PLACEMENT), _num),
    ]  # fmt: skip
    y = 0
    for panel in panels:
        panel["y"] = y + 18
        y += 18 + panel["height"] + PANEL_GAP
    return {
        "panels": panels, "height": max(y - PANEL_GAP, 1), "width": LABEL_W + BAR_W + VALUE_W,
        "label_w": LABEL_W, "bar_w": BAR_W, "row_h": ROW_H,
    }  # fmt: skip


def table(rows: list[dict]) -> list[dict[str, Any]]:
    """The comparison's cells, each with its source as a tooltip and a class."""
    cells = []
    for row in rows:
        if "latency" not in row:
            cells.append({"target": row["target"], "job_id": row.get("job_id"), "status": row.get("status"),
                          "error": row.get("error")})  # fmt: skip
            continue
        accuracy = row["accuracy"]
        alone = row.get("vendor_alone") or {}
        vendor_estimate = row.get("vendor_estimate") or {}
        cells.append({
            "target": row["target"], "job_id": row.get("job_id"), "status": row.get("status"), "error": None,
            "bucket": row.get("bucket"),
            "latency": _cell(_num(_ms(row["latency"]["seconds"]), " ms"), row["latency"]["source"], row["latency"].get("detail"),
                             note="partial (hover: what it leaves out)" if row["latency"].get("partial") else None),
            "energy": _cell(_num(_ms(row["energy"]["joules"]), " mJ"), row["energy"]["source"], row["energy"].get("detail")),
            "vendor_estimate": _cell(_num(vendor_estimate.get("cycles"), " cycles"), vendor_estimate.get("source") or NOT_KNOWN, None),
            "accuracy": _cell(_accuracy(accuracy), accuracy.get("source"), accuracy.get("detail")),
            "flop_share": _num(_pct(row.get("accelerator_flop_share")), " %"),
            "cpu_nodes": "–" if row.get("cpu_fallback_nodes") is None else str(row["cpu_fallback_nodes"]),
            "bundle": _filesize(row.get("bundle_bytes")) if row.get("bundle_bytes") is not None else "–",
            "vendor_alone": _cell(
                f"{alone['ratio']:.3f}× its cycles" if alone.get("ratio") is not None else "–",
                f"vendor estimate: {alone['source']}" if alone.get("source") else NOT_KNOWN,
                alone.get("error") or "ours / the vendor compiler alone, by the vendor's own estimate",
            ),
        })  # fmt: skip
    return cells


def _cell(text: str, source: str | None, detail: str | None, note: str | None = None) -> dict[str, Any]:
    return {"text": text, "source": source or NOT_KNOWN, "detail": detail or "", "note": note,
            "cls": source_class(source if text != "–" else None)}  # fmt: skip


def _accuracy(accuracy: dict) -> str:
    value = accuracy.get("value")
    if value is None:
        return "–"
    if accuracy.get("metric") == "max_abs":
        return f"max |Δ| {value:.2e}"
    return f"{accuracy.get('metric')} {value:.5f}"


def _ms(value: float | None) -> float | None:
    return None if value is None else value * 1e3


def _pct(value: float | None) -> float | None:
    return None if value is None else value * 100


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "–" if unit else "not known"
    return f"{value:.4g}{unit}"
