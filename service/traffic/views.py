"""What the job page shows of run-time traffic: the bundle's versions and their lineage, the traffic histogram
against the buckets (an SVG drawn here, nothing fetched), the padding waste, and the re-specialisation
proposal with its expected gain. Read through ``service.traffic.service``; a failure to read or propose is shown as
a sentence, never a broken page."""

from __future__ import annotations

import logging
from html import escape
from typing import Any

from markupsafe import Markup
from sqlalchemy.orm import Session

from service.core.errors import ServiceError
from service.core.models import Job
from service.jobs import service as jobs
from service.storage.store import ArtifactStore
from service.traffic import service as traffic

log = logging.getLogger("flexdsa.service")

WIDTH, HEIGHT = 720, 220
LEFT, RIGHT, TOP, BOTTOM = 48, 16, 28, 44
# One colour per bucket (cycled), refused requests in the error colour.
PALETTE = ("#2f6fdf", "#1a7f47", "#a15c00", "#7a3fc0", "#0e7c86", "#b0407a")
REFUSED = "#b42318"
PROPOSED = "#1a7f47"


def traffic_view(session: Session, store: ArtifactStore, job: Job, root: str) -> dict[str, Any]:
    """``{"versions": [...], "summary": ... | None, "proposal": ... | None, "chart": Markup | None, ...}``."""
    view: dict[str, Any] = {"versions": [], "summary": None, "proposal": None, "charts": [], "error": None}
    for version in traffic.lineage(session, job):
        view["versions"].append(
            {
                "job": jobs.job_out(version, root),
                "buckets": traffic.version_buckets(session, store, version),
                "this": version.id == job.id,
            }
        )
    view["policy"] = {"waste": job.auto_respecialise_waste, "max_buckets": job.respecialise_max_buckets}
    if job.status != "succeeded":
        return view
    try:
        summary = traffic.traffic_summary(session, store, job)
    except ServiceError as err:
        view["error"] = err.message
        return view
    if not summary["pushes"]:
        return view
    view["summary"] = summary
    try:
        view["proposal"] = traffic.proposal(session, store, job)
    except ServiceError as err:
        view["proposal_error"] = err.message
    except Exception:  # noqa: BLE001 - a proposal that cannot be made must not hide the traffic
        log.exception("dashboard: no re-specialisation proposal for job %s", job.id)
        view["proposal_error"] = "The proposal could not be computed (logged for the operators)."
    proposed = ((view["proposal"] or {}).get("proposed") or {}).get("buckets") or {}
    for dim in summary["dims"]:
        if len(summary["histogram"][dim]) > 1 or len(summary["dims"]) == 1:
            view["charts"].append({"dim": dim, "svg": histogram_svg(summary, dim, proposed.get(dim, []))})
    return view


def histogram_svg(summary: dict[str, Any], dim: str, proposed: list[int]) -> Markup:
    """Requests per value of ``dim`` as bars coloured by the bucket that served them (refused in red), the
    bundle's bucket sizes as dashed lines and the proposal's as dotted green ones."""
    bars: dict[int, dict[str, int]] = {}
    for shape in summary["shapes"]:
        value = shape["dims"].get(dim)
        for bucket, count in shape["buckets"].items():
            bars.setdefault(value, {}).setdefault(bucket, 0)
            bars[value][bucket] += count
    bucket_names = [b["name"] for b in summary["buckets"]]
    colours = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(bucket_names)}
    colours["None"] = REFUSED
    current = sorted({b["dims"][dim] for b in summary["buckets"] if dim in b["dims"]})
    top_value = max([*bars, *current, *proposed, 1])
    top_count = max([sum(c.values()) for c in bars.values()] + [1])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(value: float) -> float:
        return LEFT + plot_w * value / top_value

    def y(count: float) -> float:
        return TOP + plot_h * (1 - count / top_count)

    bar_w = max(2.0, min(18.0, plot_w / top_value * 0.8))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="traffic-chart" data-dim="{escape(dim)}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="Requests per {escape(dim)} against the buckets">',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" stroke="#9aa7b8"/>',
        f'<text x="{LEFT}" y="{HEIGHT - 8}" font-size="11" fill="#667085">{escape(dim)} →</text>',
        f'<text x="4" y="{TOP - 10}" font-size="11" fill="#667085">requests (max {top_count})</text>',
    ]
    for value in sorted(bars):
        base = 0
        for bucket, count in sorted(bars[value].items()):
            height = plot_h * count / top_count
            parts.append(
                f'<rect class="bar" data-value="{value}" data-bucket="{escape(bucket)}" x="{x(value) - bar_w / 2:.1f}" '
                f'y="{y(base + count):.1f}" width="{bar_w:.1f}" height="{height:.1f}" '
                f'fill="{colours.get(bucket, "#9aa7b8")}"><title>{escape(dim)} {value}: {count} request(s), '
                f"{'refused' if bucket == 'None' else 'bucket ' + escape(bucket)}</title></rect>"
            )
            base += count
    for value in current:
        parts.append(
            f'<line class="bucket-line" data-value="{value}" x1="{x(value):.1f}" y1="{TOP - 4}" x2="{x(value):.1f}" '
            f'y2="{TOP + plot_h}" stroke="#172033" stroke-dasharray="5 3"/>'
            f'<text x="{x(value):.1f}" y="{TOP + plot_h + 14}" font-size="11" text-anchor="middle">{value}</text>'
        )
    for value in proposed:
        parts.append(
            f'<line class="proposed-line" data-value="{value}" x1="{x(value):.1f}" y1="{TOP - 4}" '
            f'x2="{x(value):.1f}" y2="{TOP + plot_h}" stroke="{PROPOSED}" stroke-width="2" stroke-dasharray="2 3"/>'
            f'<text x="{x(value):.1f}" y="{TOP + plot_h + 28}" font-size="11" fill="{PROPOSED}" '
            f'text-anchor="middle">{value}</text>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
