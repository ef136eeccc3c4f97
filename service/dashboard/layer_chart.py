"""Where a quantised model departs from the fp32 one, drawn: one bar per layer, its cosine to the fp32 tensor
on held-out samples, coloured by the precision it was given, with the reason on hover.

Two sources, one picture each:

Each bar's length is the layer's departure, ``1 - cosine``, on a log axis (a cosine of 0.9999 and one of 0.99
differ by two decades, where on a linear cosine axis they look the same); the cosine is written beside it.

* ``precision.layers`` (cpu-ort, and every target whose int8 is made here): every quantisable layer's
  ``cosine`` from ``precision.layer_cosines`` (the shipped model's tensor against the fp32 model's, on the
  held-out samples), in graph order;
* ``vendor.buckets[b].exact_rewrites`` (an accelerator whose vendor's simulator analyses its int8 per layer:
  rknn's ``accuracy_analysis``): the layers the vendor's simulator scores worst alone (single-layer cosine),
  ours beside the vendor alone's.

An inline SVG (no script, nothing fetched): the page works offline.
"""

from __future__ import annotations

import math
from typing import Any

from markupsafe import Markup, escape

__all__ = ["layer_charts"]

ROW, LEFT, RIGHT, TOP, LABEL = 16, 230, 80, 40, 34  # px: row height, label column, value column, header
FLOOR = 1e-7  # 1 - cosine below this draws no bar: the tensor is the fp32 one to float rounding
WIDTH = 760
COLOURS = {"int8": "#2f6fdf", "float32": "#a15c00", "float16": "#a15c00", "vendor": "#9aa7b8"}
MAX_ROWS = 120  # a model with more layers: its worst by cosine (report.json has them all)


def layer_charts(report: dict) -> list[dict[str, Any]]:
    """``[{"title", "note", "svg"}]`` for the job page, empty when the report has no per-layer figure."""
    charts = []
    precision = report.get("precision") or {}
    rows = [r for r in precision.get("layers") or [] if r.get("cosine") is not None]
    if rows:
        meta = precision.get("layer_cosines") or {}
        shown = rows if len(rows) <= MAX_ROWS else sorted(rows, key=lambda r: r["cosine"])[:MAX_ROWS]
        bars = [
            {"label": r["layer"], "op": r.get("op", ""), "value": r["cosine"], "kind": r.get("precision", "float32"),
             "title": f"{r['layer']} ({r.get('op', '')}, {r.get('precision', '')}): cosine {r['cosine']:.6f}, "
                      f"worst sample {r.get('worst_sample_cosine', float('nan')):.6f}. {r.get('reason', '')}"}
            for r in shown
        ]  # fmt: skip
        note = (
            f"{meta.get('model', precision.get('shipped', ''))} against {meta.get('against', 'the fp32 model')}, "
            f"on {meta.get('samples', '?')} {meta.get('on', 'samples')}"
            + (f"; the {MAX_ROWS} lowest of {len(rows)} layers" if len(rows) > MAX_ROWS else "")
        )
        charts.append({"title": "Per layer: how far the shipped model's tensor departs from the fp32 model's (1 − cosine)",
                       "note": note, "svg": _svg(bars, "per-layer cosine")})  # fmt: skip
    for bucket, row in ((report.get("vendor") or {}).get("buckets") or {}).items():
        exact = row.get("exact_rewrites") or {}
        ours = (exact.get("layer_accuracy") or {}).get("worst_single") or []
        alone = (exact.get("layer_accuracy_vendor_alone") or {}).get("worst_single") or []
        bars = [_vendor_bar(r, "int8", "shipped") for r in ours if r.get("cosine_single") is not None]
        bars += [_vendor_bar(r, "vendor", "vendor alone") for r in alone if r.get("cosine_single") is not None]
        if bars:
            charts.append({
                "title": f"Bucket {bucket}: the layers the vendor's simulator scores worst alone (single-layer cosine)",
                "note": (exact.get("layer_accuracy") or {}).get("measured_on", "the vendor's simulator")
                + "; the shipped build's and the vendor alone's w8a8",
                "svg": _svg(bars, f"bucket {bucket} vendor per-layer cosine"),
            })  # fmt: skip
    return charts


def _vendor_bar(row: dict, kind: str, who: str) -> dict:
    return {"label": f"{row.get('layer')}", "op": row.get("op") or "", "value": row["cosine_single"], "kind": kind,
            "title": f"{who}: {row.get('layer')} ({row.get('op')}), single-layer cosine {row['cosine_single']:.6f}"}  # fmt: skip


def _svg(bars: list[dict], label: str) -> Markup:
    """Horizontal bars of each layer's departure from the fp32 tensor, ``1 - cosine`` on a log axis from
    ``FLOOR`` (no bar: the same to float rounding) to 1 (a bar across: unrelated), its cosine written beside."""
    plot = WIDTH - LEFT - RIGHT
    height = TOP + ROW * len(bars) + LABEL
    decades = -math.log10(FLOOR)

    def x(value: float) -> float:
        departure = min(max(1.0 - value, FLOOR), 1.0)
        return LEFT + plot * (math.log10(departure) + decades) / decades

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="layer-chart" viewBox="0 0 {WIDTH} {height}" '
        f'width="{WIDTH}" height="{height}" role="img" aria-label="{escape(label)}">',
        f'<text x="{LEFT}" y="12" font-size="11" fill="#667085">1 − cosine, log scale: a longer bar departs more '
        "from the fp32 tensor</text>",
    ]
    for power in range(int(decades) + 1):
        tick = LEFT + plot * power / decades
        parts.append(
            f'<line x1="{tick:.1f}" y1="{TOP - 6}" x2="{tick:.1f}" y2="{TOP + ROW * len(bars)}" stroke="#e4e7ec"/>'
            f'<text x="{tick:.1f}" y="{TOP - 8}" font-size="10" fill="#667085" text-anchor="middle">'
            f"1e{power - int(decades)}</text>"
        )
    for index, bar in enumerate(bars):
        y = TOP + ROW * index
        name = bar["label"] if len(bar["label"]) <= 34 else bar["label"][:15] + "…" + bar["label"][-18:]
        parts.append(
            f'<g class="layer" data-layer="{escape(bar["label"])}" data-precision="{escape(bar["kind"])}" '
            f'data-cosine="{bar["value"]}"><title>{escape(bar["title"])}</title>'
            f'<text x="{LEFT - 6}" y="{y + 11}" font-size="11" text-anchor="end">{escape(name)}</text>'
            f'<rect x="{LEFT}" y="{y + 2}" width="{x(bar["value"]) - LEFT:.1f}" height="{ROW - 4}" '
            f'fill="{COLOURS.get(bar["kind"], "#9aa7b8")}"/>'
            f'<text x="{LEFT + plot + 6}" y="{y + 11}" font-size="11">{bar["value"]:.6f}</text></g>'
        )
    y = TOP + ROW * len(bars) + 16
    vendor = any(b["kind"] == "vendor" for b in bars)
    legend = [("int8", "shipped build"), ("vendor", "vendor alone")] if vendor else [("int8", "int8"), ("float32", "kept float")]
    for offset, (kind, text) in enumerate(legend):
        parts.append(
            f'<rect x="{LEFT + offset * 110}" y="{y - 9}" width="10" height="10" fill="{COLOURS[kind]}"/>'
            f'<text x="{LEFT + offset * 110 + 14}" y="{y}" font-size="11">{text}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
