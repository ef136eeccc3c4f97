"""The group page's cells and chart (``service.groups.views``) from comparison rows: each figure's own text, a lower
bound with what it leaves out beside it, and measured and estimated latencies on separate panels."""

from __future__ import annotations

from flexdsa_core.figures import job_figures
from service.groups.views import chart, table


def _row(target: str, report: dict) -> dict:
    figures = job_figures(report)
    return {"target": target, "job_id": target, "status": "succeeded", "bucket": figures["bucket"],
            "latency": figures["latency"], "energy": figures["energy"], "accuracy": figures["accuracy"],
            "accelerator_flop_share": 0.9, "cpu_fallback_nodes": 39, "bundle_bytes": 1000}  # fmt: skip


def _rows() -> list[dict]:
    measured = {"target": {"name": "cpu-ort", "measured_here": True}, "shapes": {"buckets": ["dynamic"]},
                "latency": {"after_s": 4.5e-4, "bucket": "dynamic"}}  # fmt: skip
    on_target = {"latency_s": 2.8e-5, "energy_j": None, "complete": False, "left_out": ["39 CPU-fallback nodes"],
                 "notes": []}  # fmt: skip
    estimated = {"target": {"name": "amd-xdna2", "measured_here": False},
                 "estimates": {"per_bucket": {"b": {"on_target": on_target}}},
                 "validation": {"performed": True, "ok": True, "buckets": [{"outputs": [{"max_abs": 2.4e-7}]}]}}  # fmt: skip
    return [_row("cpu-ort", measured), _row("amd-xdna2", estimated)]


def test_cells_show_each_figures_text_and_what_a_lower_bound_leaves_out():
    cpu, npu = table(_rows())
    assert cpu["latency"]["text"] == "450 µs" and cpu["latency"]["note"] is None
    assert npu["latency"]["text"] == "≥ 28 µs"
    assert npu["latency"]["note"] == "lower bound; not included: 39 CPU-fallback nodes"
    assert npu["accuracy"]["text"] == "max abs diff 2.40e-07, numerics only"


def test_measured_and_estimated_latencies_are_on_separate_panels():
    panels = chart(_rows())["panels"]
    titles = [panel["title"] for panel in panels]
    assert titles[:3] == [
        "Latency, measured on this CPU",
        "Latency, roofline estimate on each target (≥: a lower bound)",
        "Energy per inference: not known for any target",
    ]
    measured, estimated = panels[0]["bars"], panels[1]["bars"]
    assert [b["target"] for b in measured] == ["cpu-ort"] and measured[0]["cls"] == "measured"
    assert [b["target"] for b in estimated] == ["amd-xdna2"] and estimated[0]["cls"] == "estimate incomplete"
    assert estimated[0]["label"] == "≥ 28 µs (roofline estimate)"
    assert estimated[0]["note"] == "lower bound; not included: 39 CPU-fallback nodes"  # drawn under the bar
    # Each panel is scaled to its own largest figure: no estimate is drawn against a measurement.
    assert measured[0]["width"] == estimated[0]["width"] == 300
