"""The comparison row of one target's job (``flexdsa_core.compare``): read from real reports of the pipeline on
a small BERT, each figure with its source; the vendor-alone baseline from a vendor section of the shape
``vendor_runs.explore.vendor_section`` writes; target names resolved with "did you mean"."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions, RequestSpec, list_targets
from flexdsa_core.compare import (
    MEASURED_HERE,
    NOT_KNOWN,
    OUR_VALIDATION,
    ROOFLINE,
    comparison_row,
    render_comparison,
    resolve_targets,
)
from flexdsa_core.errors import TargetNotFoundError
from flexdsa_core.figures import job_figures
from flexdsa_core.targets import load_target

TINY_BERT = Path(__file__).resolve().parents[2] / "examples" / "tiny_bert.onnx"
KNOWN = [t.name for t in list_targets()]


# A custom part whose datasheet gives throughput and bandwidth but no power figure (``power_w`` left out):
# the roofline gives it a latency and no energy. Its op table is the tiny BERT's, so everything is placed on it.
UNPOWERED = {
    "name": "custom-npu-unpowered", "vendor": "acme", "adapter": "accelerator",
    "description": "A test NPU with no sourced power figure.",
    "peak_ops_per_s": {"float32": 1e12}, "mem_bandwidth_bytes_per_s": 1e10,
    "supported_ops": ["MatMul", "Gemm", "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Erf", "Tanh", "ReduceMean",
                      "Softmax", "Transpose", "Reshape", "Gather", "Concat", "Unsqueeze", "Shape", "Slice", "Cast",
                      "LayerNormalization"],
}  # fmt: skip


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    reports = {
        name: FlexDSAOptimizer(name).optimize(TINY_BERT, OptimizeOptions()).report
        for name in ("cpu-ort", "nvidia-orin-nano")
    }
    request = RequestSpec.model_validate({"target": UNPOWERED})
    unpowered = FlexDSAOptimizer(request.target_spec()).optimize(TINY_BERT, request.options())
    reports[UNPOWERED["name"]] = unpowered.report
    return reports


def test_cpu_ort_latency_is_measured_here(reports):
    row = comparison_row(reports["cpu-ort"], bundle_bytes=1234)
    assert row["target"] == "cpu-ort" and row["bundle_bytes"] == 1234
    assert row["latency"]["source"] == MEASURED_HERE
    assert row["latency"]["seconds"] == reports["cpu-ort"]["latency"]["after_s"]
    assert row["latency"] == reports["cpu-ort"]["figures"]["latency"]  # the job's own figure, not recomputed
    assert row["energy"]["joules"] is None and row["energy"]["source"] == NOT_KNOWN and row["energy"]["text"] == NOT_KNOWN
    assert row["accelerator_flop_share"] == 1.0 and row["cpu_fallback_nodes"] == 0
    assert row["accuracy"]["source"] == OUR_VALIDATION and row["accuracy"]["ok"] is True
    # Random validation inputs check numerics only: the figure says so and claims no accuracy.
    assert row["accuracy"]["numerics_only"] is True and row["accuracy"]["text"].endswith(", numerics only")
    assert row["vendor_alone"] is None


def test_an_accelerator_has_roofline_estimates_and_its_partition(reports):
    report = reports["nvidia-orin-nano"]
    row = comparison_row(report)
    bucket = next(iter(report["estimates"]["per_bucket"]))
    on_target = report["estimates"]["per_bucket"][bucket]["on_target"]
    assert row["bucket"] == bucket
    assert row["latency"]["source"] == ROOFLINE and row["latency"]["seconds"] == on_target["latency_s"]
    # Orin's power is sourced: the roofline gives energy; the CPU's time there is not in the latency.
    assert row["energy"]["source"] == ROOFLINE and row["energy"]["joules"] == on_target["energy_j"] > 0
    assert row["accelerator_flop_share"] == report["partition"][bucket]["accelerator_flop_share"]
    assert row["cpu_fallback_nodes"] == report["partition"][bucket]["cpu_nodes"]


def test_an_unsourced_power_leaves_energy_not_known(reports):
    """The roofline still gives the part a latency, but with no power figure there is no energy: the row says
    it is not known and why, and the table shows '-' rather than a number."""
    report = reports[UNPOWERED["name"]]
    assert RequestSpec.model_validate({"target": UNPOWERED}).target_spec().power_w is None
    bucket = next(iter(report["estimates"]["per_bucket"]))
    on_target = report["estimates"]["per_bucket"][bucket]["on_target"]
    assert on_target["latency_s"] > 0 and on_target["energy_j"] is None
    row = comparison_row(report)
    assert row["latency"]["source"] == ROOFLINE and row["latency"]["seconds"] == on_target["latency_s"]
    assert row["energy"]["joules"] is None and row["energy"]["source"] == NOT_KNOWN
    assert row["energy"]["label"] == "not known (the target's power is unsourced)"
    [header, line, _legend] = render_comparison([row]).splitlines()
    energy_at = header.index("energy")
    assert line.startswith(UNPOWERED["name"]) and "[r]" in line
    assert line[energy_at:].split()[0] == "-", line


def _with_vendor(report: dict, alone_cycles: float | None, ours_cycles: float) -> dict:
    """The report with a vendor section and a simulator run, as rknn-toolkit2's exploration writes them."""
    report = copy.deepcopy(report)
    bucket = next(iter(report["estimates"]["per_bucket"]))
    source = "rknn-toolkit2 2.5.0 estimate: Total cycles of its Network Layer Information Table"
    alone = {"cycles": alone_cycles, "cpu_nodes": 1, "transitions": 1, "layers": 25, "cpu_layers": [], "source": source}
    report["vendor"] = {
        "tool": "rknn-toolkit2 2.5.0", "measure": source,
        "buckets": {bucket: {
            "vendor_alone": alone, "vendor_alone_best": alone,
            "ours": {"cycles": ours_cycles, "cpu_nodes": 1, "transitions": 1, "layers": 26, "cpu_layers": [], "source": source},
            "ratio": ours_cycles / alone_cycles if alone_cycles else None, "shipped": "ours",
        }},
    }  # fmt: skip
    report["toolchain"] = {"name": "rockchip", "ran": True, "buckets": {bucket: {
        "numerics": [{"name": "out", "cosine": 0.99991, "max_abs": 0.01}], "placement_agreement": {"share": 1.0},
    }}}  # fmt: skip
    report["figures"] = job_figures(report)  # as the pipeline computes them, once the vendor's sections are in
    return report


def test_the_vendor_alone_baseline_and_the_simulators_accuracy(reports):
    row = comparison_row(_with_vendor(reports["nvidia-orin-nano"], alone_cycles=50000.0, ours_cycles=45000.0))
    assert row["vendor_alone"]["cycles"] == 50000.0 and row["vendor_alone"]["ours_cycles"] == 45000.0
    assert row["vendor_alone"]["ratio"] == pytest.approx(0.9)
    assert row["vendor_estimate"]["cycles"] == 45000.0
    assert row["vendor_estimate"]["source"].startswith("vendor estimate: rknn-toolkit2 2.5.0")
    accuracy = row["accuracy"]
    assert (accuracy["value"], accuracy["metric"], accuracy["ok"]) == (0.99991, "cosine", None)
    assert accuracy["source"] == "vendor simulator (rockchip)"
    # The simulator ran on the random validation inputs: numerics only, on every surface.
    assert accuracy["numerics_only"] and accuracy["text"] == "cosine 0.99991, numerics only"
    table = render_comparison([row])
    assert "0.900x cycles [v]" in table and "cosine 0.99991, numerics only [v]" in table


def test_a_vendor_alone_that_failed_is_said(reports):
    report = _with_vendor(reports["nvidia-orin-nano"], alone_cycles=None, ours_cycles=45000.0)
    bucket = next(iter(report["vendor"]["buckets"]))
    report["vendor"]["buckets"][bucket]["vendor_alone"] = {"error": "it could not"}
    report["vendor"]["buckets"][bucket]["vendor_alone_best"] = None
    row = comparison_row(report)
    assert row["vendor_alone"]["ratio"] is None and "it could not" in row["vendor_alone"]["error"]


def test_render_comparison_lists_every_row_with_sources(reports):
    rows = [comparison_row(reports[name]) for name in ("cpu-ort", "nvidia-orin-nano")]
    rows.append({"target": "xilinx-kv260", "status": "failed", "error": "refused"})
    lines = render_comparison(rows).splitlines()
    assert lines[0].split()[:3] == ["target", "latency", "energy"]
    assert lines[1].startswith("cpu-ort") and "[m]" in lines[1]
    assert lines[2].startswith("nvidia-orin-nano") and "[r]" in lines[2]
    assert lines[3].startswith("xilinx-kv260") and "failed: refused" in lines[3]


def test_resolve_targets():
    assert resolve_targets("all", KNOWN) == KNOWN
    assert resolve_targets(["cpu-ort", "rockchip-rk3588", "cpu-ort"], KNOWN) == ["cpu-ort", "rockchip-rk3588"]
    assert resolve_targets("cpu-ort, amd-xdna2", KNOWN) == ["cpu-ort", "amd-xdna2"]
    with pytest.raises(ValueError, match="Did you mean 'nvidia-orin-nano'"):
        resolve_targets(["nvidia-orin"], KNOWN)
    with pytest.raises(ValueError, match="No target named"):
        resolve_targets([], KNOWN)


def test_an_unknown_single_target_says_did_you_mean():
    with pytest.raises(TargetNotFoundError, match="Did you mean 'qualcomm-sm8650'"):
        load_target("qualcom-sm8650")
