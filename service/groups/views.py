"""What a job group's page shows: the comparison table's cells and the chart's bars, laid out here so the
template only places them (an inline SVG: no script, nothing fetched from elsewhere).

Every latency, energy and accuracy shown is the job's own figure (``report["figures"]``, kept in the
comparison row), as its text: the job page, the report and the CLI show the same string. A lower bound
(``≥ 26 µs``) carries what it leaves out beside it, in the cell and in the chart, not only on hover.

The chart has one panel per figure and source: measured and estimated latencies never share an axis (a
panel "Latency, measured on this CPU" and one "Latency, roofline estimate"), nor do energies; then the
accelerator's share of FLOPs. In each panel one bar per target, scaled to the panel's largest value,
labelled with the figure's text and coloured by its source; a lower bound is drawn open (class
``incomplete``). A target with no figure is listed in the estimate panel as "not known", with no bar.
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
    shown_text,
)
from service.dashboard.pages import _filesize

LABEL_W = 150  # the target names' column
BAR_W = 300
VALUE_W = 420
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


def _panel(title: str, rows: list[dict], bar) -> dict[str, Any]:
    """One panel: ``bar(row)`` -> (number or None, label, source, note); a note (what a lower bound leaves out)
    takes a line of its own under the bar."""
    figures = [(row["target"], *bar(row)) for row in rows]
    largest = max((v for _, v, _, _, _ in figures if v), default=0.0)
    bars, y = [], 0
    for target, number, label, source, note in figures:
        width = round(BAR_W * number / largest, 1) if number and largest else 0.0
        cls = source_class(source if number is not None else None)
        bars.append({
            "target": target, "y": y, "width": max(width, 1.0) if number else 0.0, "label": label, "note": note,
            "known": number is not None, "cls": f"{cls} incomplete" if note else cls,
        })  # fmt: skip
        y += ROW_H * (2 if note else 1)
    return {"title": title, "bars": bars, "height": y}


def _figure_bar(key: str, field: str):
    """The bar of a row's latency (``field`` seconds) or energy (joules) figure; its label is the figure's text
    with its source, and under it what it leaves out where it is a lower bound."""

    def bar(row: dict):
        figure = row[key]
        value = figure.get(field)
        if value is None:
            return None, NOT_KNOWN, None, None
        complete = figure.get("complete", not figure.get("partial"))
        note = None if complete else f"lower bound; not included: {figure.get('left_out') or 'a part of the model'}"
        return value, f"{shown_text(figure, field)} ({figure['source']})", figure["source"], note

    return bar


def _by_source(done: list[dict], key: str) -> list[tuple[str, list[dict]]]:
    """The rows of one figure split by source, measured first; rows without the figure go with the estimates
    (or stand alone, where no target has one)."""
    sources: dict[str, list[dict]] = {}
    for row in done:
        sources.setdefault(row[key]["source"], []).append(row)
    unknown = sources.pop(NOT_KNOWN, [])
    if unknown:
        sources.setdefault(ROOFLINE if ROOFLINE in sources else NOT_KNOWN, []).extend(unknown)
    order = sorted(sources, key=lambda s: (s != MEASURED_HERE, s))
    return [(source, sources[source]) for source in order]


def _panel_title(title: str, source: str, rows: list[dict], key: str) -> str:
    """``Latency, roofline estimate on each target (≥: a lower bound)``: the figure, its source, and the mark
    of a lower bound where a bar is one. Each panel is scaled to its own largest bar."""
    if source == NOT_KNOWN:
        return f"{title}: not known for any target"
    where = " on each target" if source == ROOFLINE else ""
    bound = " (≥: a lower bound)" if any(not row[key].get("complete", True) for row in rows) else ""
    return f"{title}, {source}{where}{bound}"


def chart(rows: list[dict]) -> dict[str, Any]:
    done = [row for row in rows if "latency" in row]
    panels = []
    for key, field, title in (("latency", "seconds", "Latency"), ("energy", "joules", "Energy per inference")):
        for source, members in _by_source(done, key):
            panels.append(_panel(_panel_title(title, source, members, key), members, _figure_bar(key, field)))
    panels.append(_panel("FLOPs on the accelerator (%, Subgraph Mapper)", done,
                         lambda r: (_pct(r.get("accelerator_flop_share")), _num(_pct(r.get("accelerator_flop_share")), " %"),
                                    PLACEMENT, None)))  # fmt: skip
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
            "latency": _figure_cell(row["latency"], "seconds"),
            "energy": _figure_cell(row["energy"], "joules"),
            "vendor_estimate": _cell(_num(vendor_estimate.get("cycles"), " cycles"), vendor_estimate.get("source") or NOT_KNOWN, None),
            "accuracy": _figure_cell(accuracy, "value"),
            "flop_share": _num(_pct(row.get("accelerator_flop_share")), " %"),
            "cpu_nodes": "–" if row.get("cpu_fallback_nodes") is None else str(row["cpu_fallback_nodes"]),
            "bundle": _filesize(row.get("bundle_bytes")) if row.get("bundle_bytes") is not None else "–",
            "vendor_alone": _cell(
                f"{alone['ratio']:.3f}× (ours / vendor alone, cycles)" if alone.get("ratio") is not None else "–",
                f"vendor estimate: {alone['source']}" if alone.get("source") else NOT_KNOWN,
                alone.get("error") or "ours / the vendor compiler alone, by the vendor's own estimate",
            ),
        })  # fmt: skip
    return cells


def _cell(text: str, source: str | None, detail: str | None, note: str | None = None) -> dict[str, Any]:
    return {"text": text, "source": source or NOT_KNOWN, "detail": detail or "", "note": note,
            "cls": source_class(source if text != "–" else None)}  # fmt: skip


def _figure_cell(figure: dict, key: str) -> dict[str, Any]:
    """A figure's text as every surface shows it; a lower bound with what it leaves out, shown in the cell."""
    known = figure.get(key) is not None
    note = None
    if known and not figure.get("complete", not figure.get("partial")):
        note = f"lower bound; not included: {figure.get('left_out') or 'a part its spec leaves unsourced'}"
    text = shown_text(figure, key) if known else "–"
    return _cell(text, figure.get("source"), figure.get("detail"), note=note)


def _pct(value: float | None) -> float | None:
    return None if value is None else value * 100


def _num(value: float | None, unit: str = "") -> str:
    if value is None:
        return "–" if unit else "not known"
    return f"{value:.4g}{unit}"
