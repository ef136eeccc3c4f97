"""The bundle of one verified run: ``report.json`` assembled from the verifiers' verdicts, the adapter's
target-ready files, the vendor's, the calibration samples a vendor quantiser takes, ``fusion_plan.json`` and,
last, ``manifest.json`` over all of them (``OptimizeResult``).

Each section of the report is the evidence of one verdict (``OptimizeRun.verdicts``): ``validation``, ``padding``
(under ``shapes``), ``latency`` (the never-slower check's), ``precision``, ``toolchain`` and ``vendor``; their
warnings are gathered into the report's ``warnings``. ``report.build_report`` lays out the rest (what the
compiler did, the estimates, the cache and the stage times).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

from flexdsa_core.figures import job_figures
from flexdsa_core.in_memory import release_arrays
from flexdsa_core.optimize_run import OptimizeRun
from flexdsa_core.precision import int8_only, samples_dataset, samples_npz, synthetic_calibration_warning
from flexdsa_core.report import build_report, headline, render_summary, report_summary
from flexdsa_core.rewrites import KINDS
from flexdsa_core.serialized import kept_bytes, model_bytes
from flexdsa_core.targets import BucketModel, TargetSpec
from flexdsa_core.vendor_runs.deploy_manifest import complete_manifest
from flexdsa_core.verify.precision import PrecisionVerdict
from flexdsa_core.verify.toolchain import BuildVerdict, ShippedVerdict

__all__ = ["OptimizeResult", "package"]


@dataclass
class OptimizeResult:
    target: TargetSpec
    buckets: list[BucketModel]
    artifacts: dict[str, bytes | Path]
    report: dict
    workdir: Path | None = field(default=None, repr=False)
    # Bucket name -> the bytes already made for validation and the artifacts (``serialized``), not made again.
    serialized: dict[str, bytes] = field(default_factory=dict, repr=False)

    def model_bytes(self, bucket: str | None = None) -> bytes:
        chosen = next((b for b in self.buckets if bucket in (None, b.name)), None)
        if chosen is None:
            raise KeyError(f"no bucket {bucket!r}; buckets: {[b.name for b in self.buckets]}")
        serialized = self.serialized.get(chosen.name)
        return serialized if serialized is not None else model_bytes(chosen.model)

    def artifact_bytes(self, name: str) -> bytes:
        """One artifact's bytes, whether the bundle holds it in memory or as a file under the job's workdir."""
        content = self.artifacts[name]
        return content.read_bytes() if isinstance(content, Path) else content

    def write(self, out_dir: str | Path) -> list[Path]:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        written = []
        for name, content in self.artifacts.items():
            path = out / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                shutil.copyfile(content, path)
            else:
                path.write_bytes(content)
            written.append(path)
        return written

    def report_summary(self) -> dict:
        return report_summary(self.report)

    def summary(self) -> str:
        return render_summary(self.report)


def package(job: OptimizeRun) -> OptimizeResult:
    """The report (every verifier's evidence), the adapter's target-ready files and the manifest."""
    _release_runs(job)
    shape_manifest = job.tracker.manifest()
    # Nothing specialises or recompiles from here: the tracker's models (the original's graph, its weights
    # and each bucket's specialised copy) go too, once the manifest is taken from them.
    job.tracker.release_models()
    job.recompile = None
    job.progress("adapter", 0.0, "generating artifacts")
    report = _report(job, shape_manifest)
    target, comp = job.optimizer.target, job.comp
    files = job.optimizer.adapter.generate(comp.buckets, target, report, workdir=job.workdir)
    artifacts: dict[str, bytes | Path] = {**files, **_vendor_files(job)}
    artifacts.update(_calibration_files(job))
    artifacts["report.json"] = json.dumps(report, indent=2, default=str).encode()
    artifacts["fusion_plan.json"] = json.dumps(comp.fusion_plans, indent=2, default=str).encode()
    # Last, over the whole bundle: every file with its role, how to load it and its checksum (the deploy
    # contract flexdsa_runtime reads).
    artifacts["manifest.json"] = complete_manifest(artifacts, report, target)
    job.progress.finish("adapter")
    job.progress("report", 1.0, "done")
    serialized = {b.name: kept_bytes(b.model) for b in comp.buckets}
    serialized = {name: data for name, data in serialized.items() if data is not None}
    return OptimizeResult(target, comp.buckets, artifacts, report, job.workdir, serialized)


def _release_runs(job: OptimizeRun) -> None:
    """Every ONNX Runtime run of the original is done: its in-memory copy (for a model whose weights are
    Constant nodes, the whole upload again), the reference outputs and the arrays kept for sessions go
    before the artifacts are serialised, where the job's memory peaks."""
    job.original_in_memory = None
    job.references.release()
    release_arrays()


def _report(job: OptimizeRun, shape_manifest: dict) -> dict:
    """``report.json``: ``build_report``'s layout, then each verdict's evidence as its section."""
    target, options, comp = job.optimizer.target, job.options, job.comp
    latency, precision = job.evidence("never_slower"), job.evidence("precision")
    job.stage_seconds.update(comp.stage_seconds)
    report = build_report(
        target=target,
        options=options,
        ingested=job.ingested,
        nodes_before=job.nodes_before,
        comp=comp,
        shape_report=job.shape_report.as_dict(),
        shape_manifest=shape_manifest,
        validation=job.evidence("validation", []),
        rollbacks=job.rollbacks,
        latency=latency,
        cache_stats=job.cache.stats.as_dict(),
        stage_seconds=dict(job.stage_seconds),
        total_seconds=time.perf_counter() - job.started,
        shape_notes=job.references.notes,
    )
    # What changed the graph, by kind, as the registry declares it (pass, fusion, legalisation).
    registry = job.optimizer.registry
    report["rewrites_applied_by_kind"] = {
        kind: [name for name in comp.applied if registry.kind_of(name) == kind] for kind in KINDS
    }
    # Each verifier's verdict in one place (its evidence is the report's section of the same subject).
    report["verdicts"] = {name: {"ok": v.ok, "failure": v.failure} for name, v in job.verdicts.items()}
    for bucket_name, plan in comp.fusion_plans.items():
        report["warnings"].extend(f"[{bucket_name}] {w}" for w in plan.get("delivery_warnings", []))
    if latency:
        report["warnings"].extend(latency.get("warnings", []))
    if precision is not None:
        report["precision"] = precision
        if latency and precision.get("shipped") not in (None, "fp32") and not precision.get("vendor_quantiser"):
            latency["measures"] = (
                f"the fp32 optimised model; the shipped {precision['shipped']} model is timed under "
                "precision.candidates (against fp32 and the original, in the same rounds)"
            )
        report["warnings"].extend(precision.get("warnings", []))
    if int8_only(target) and job.calibration is None:  # allowed only by allow_synthetic_calibration
        report["warnings"].append(synthetic_calibration_warning(target))
    _padding_section(report, job.evidence("padding"))
    _vendor_sections(report, job)
    # The one latency, energy and accuracy per bucket every surface shows, each named with its source.
    report["figures"] = job_figures(report)
    # The one speed-up every surface shows, from the best source for this target, named with it.
    report["headline"] = headline(report)
    return report


def _padding_section(report: dict, padding: dict | None) -> None:
    report["shapes"]["padding"] = padding
    if padding is None:  # a pipeline without the padding check: the runtime is told nothing it may pad
        return
    report["warnings"].extend(
        f"padding {dim} changes the outputs ({found['reason']}): the runtime serves only a bucket's exact {dim}"
        for dim, found in padding["dims"].items()
        if found.get("tolerated") is False
    )


def _vendor_sections(report: dict, job: OptimizeRun) -> None:
    """``toolchain`` (the vendor's build and simulator) and ``vendor`` (ours against the vendor alone), with
    each bucket's vendor exploration in its fusion plan."""
    toolchain_report, build = job.evidence("toolchain", {}), job.verdict("toolchain", BuildVerdict)
    if toolchain_report:
        report["toolchain"] = toolchain_report
        report["warnings"].extend(toolchain_report.get("warnings", []))
    if build is not None and build.vendor is not None:
        report["vendor"] = build.vendor
        for bucket_name, plan in build.exploration.plans.items():
            job.comp.fusion_plans.setdefault(bucket_name, {})["vendor_exploration"] = plan


def _vendor_files(job: OptimizeRun) -> dict[str, bytes | Path]:
    """The vendor's compiled files that ship: those the accuracy verdict kept, where it judged them."""
    shipped = job.verdict("vendor_accuracy", ShippedVerdict)
    if shipped is not None:
        return shipped.files
    build = job.verdict("toolchain", BuildVerdict)
    return build.files if build is not None else {}


def _calibration_files(job: OptimizeRun) -> dict[str, bytes]:
    """Where the vendor's quantiser makes the shipped model, the samples it calibrates on, per bucket."""
    precision, verdict = job.evidence("precision"), job.verdict("precision", PrecisionVerdict)
    if precision is None or verdict is None or not precision.get("vendor_quantiser"):
        return {}
    samples = verdict.samples
    first = job.comp.buckets[0].name
    files = {"calibration.npz": samples_npz(samples[first]), **samples_dataset(samples[first])}
    for name, bucket_samples in list(samples.items())[1:]:  # each further bucket at its shapes
        files[f"calibration.{name}.npz"] = samples_npz(bucket_samples)
        files.update(samples_dataset(bucket_samples, bucket=name))
    return files
