"""The vendor toolchain as a verifier (accelerators, where it installs): each bucket compiled with the
vendor's own compiler at the requested precision (its quantiser calibrated on the same samples as ours),
run in the vendor's simulator/emulator and compared with the original; our predicted placement is held
against the vendor's. Vendor-scored exploration (``vendor_runs.explore``) runs first, as the vendor's
own cost source: forms only its compiler can judge, never worse than the original compiled by the vendor
alone. Its verdict: the vendor's build ran and its outputs hold (or no toolchain is installed: said so).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass, field
from pathlib import Path

import onnx_ir as ir

from flexdsa_core.compilation import Compilation
from flexdsa_core.cost_model import CostModel
from flexdsa_core.memory_planner import plan_memory
from flexdsa_core.optimize_run import OptimizeRun
from flexdsa_core.options import OptimizeOptions
from flexdsa_core.precision import PrecisionRun, vendor_verdict
from flexdsa_core.report import SOURCES
from flexdsa_core.subgraph_mapper import SubgraphMapper
from flexdsa_core.targets import BucketModel
from flexdsa_core.vendor_runs.estimate import target_estimate
from flexdsa_core.vendor_runs.explore import Exploration, explore, vendor_section
from flexdsa_core.vendor_runs.toolchain_run import run_toolchain
from flexdsa_core.verify import Verdict, Verifier, roll_back, switch, verifier
from flexdsa_core.verify.precision import PrecisionVerdict
from flexdsa_core.verify.validation import validate_buckets


@verifier("vendor_exploration")
class VendorExploration(Verifier):
    """Exploration scored by the vendor's own estimate, the vendor alone beside it (where it gives one):
    forms only its compiler can judge, never worse than the original compiled by the vendor alone. The
    vendor's figure is one more cost source; a changed bucket is validated against the original again.
    Its evidence: the exploration's report; its ``ExplorationVerdict`` holds the exploration itself (or None)."""

    name, stage, message = "vendor_exploration", "toolchain", "compiling with the vendor toolchain"

    def verify(self, job: OptimizeRun) -> Verdict:
        optimizer, options, precision = job.optimizer, job.options, job.evidence("precision")
        exploration = explore(
            optimizer.target, optimizer.adapter, job.comp.buckets, job.original_source,
            root=optimizer.toolchain_root, workdir=job.workdir, cache=job.cache,
            progress=lambda f, m: job.progress("toolchain", 0.6 * f, m),
            precision={**(precision or {}), "requested": options.precision},
            accuracy=options.accuracy, **_user_samples(_precision_runs(job)),
            traffic=_traffic_request(options, job.buckets),
        )  # fmt: skip
        if exploration is not None:
            validated = job.verdicts.get("validation")
            comp, validation = _explored(
                job, job.comp, exploration, job.original_source, options, job.references,
                validated.evidence if validated is not None else [], job.cost_model,
            )  # fmt: skip
            switch(job, comp, None)
            if validated is not None:  # the buckets that ship changed: validation's evidence is theirs
                job.verdicts["validation"] = dataclasses.replace(validated, evidence=validation)
        return ExplorationVerdict(True, exploration.report if exploration is not None else None, exploration=exploration)


@verifier("toolchain")
class VendorBuild(Verifier):
    """The final vendor build of every bucket, run in the vendor's simulator (module docstring). Where our
    form crashed the vendor's build and the vendor alone built the original, the original ships (the
    rollback's ``fallback``). Its evidence: the toolchain report; its ``BuildVerdict`` holds the vendor's
    ``files``, the report's ``vendor`` section and the ``exploration`` as it ships."""

    name, stage = "toolchain", "toolchain"
    bisects = False  # the vendor's build is not bisected: its one fallback is the original model

    def verify(self, job: OptimizeRun) -> Verdict:
        optimizer, options, precision = job.optimizer, job.options, job.evidence("precision")
        precision_runs = _precision_runs(job)
        explored = job.verdict("vendor_exploration", ExplorationVerdict)
        self.exploration = explored.exploration if explored is not None else None
        self.compile_final = functools.partial(
            run_toolchain, optimizer.target, optimizer.adapter, partition=job.comp.partition,
            original_source=job.original_source, root=optimizer.toolchain_root, seed=options.seed,
            workdir=job.workdir, precision={**(precision or {}), "requested": options.precision},
            # The vendor's quantiser calibrates on the part of the samples ours calibrated on; its simulator is
            # judged on the part held out (the bundle's calibration.npz keeps them all, for the user's run).
            calibration={name: r.calibration or r.samples for name, r in precision_runs.items()} or None,
            accuracy=options.accuracy, held_out={name: r.judged for name, r in precision_runs.items()},
        )  # fmt: skip
        explored = self.exploration
        verdict = self._built(job, *self.compile_final(
            job.comp.buckets, bucket_options=explored.bucket_options if explored else None,
            judged_samples=explored.judged_samples if explored else None,
        ))  # fmt: skip
        return roll_back(self, job, verdict)

    def _built(self, job: OptimizeRun, toolchain_report: dict, toolchain_files: dict) -> BuildVerdict:
        vendor = None
        if self.exploration is not None:
            vendor = vendor_section(job.optimizer.target, job.optimizer.adapter, self.exploration, toolchain_report)
        return BuildVerdict(
            bool(toolchain_report.get("ran")) or not toolchain_report.get("failed"), toolchain_report,
            toolchain_report.get("failed") or None, files=toolchain_files, vendor=vendor, exploration=self.exploration,
        )  # fmt: skip

    def fallback(self, job: OptimizeRun, verdict: Verdict):
        """Never worse than the vendor alone: our form crashed the vendor's final build; the original does not."""
        if self.exploration is None:
            return None
        comp, self.exploration = _vendor_fallback(job.comp, self.exploration, verdict.evidence["failed"])
        return comp, None, self._built(job, *self.compile_final(comp.buckets))


@verifier("vendor_accuracy")
class VendorVerdicts(Verifier):
    """Each bucket's vendor-quantised model judged by the accuracy target on held-out samples (after the
    toolchain ran it): a bucket that misses it loses its quantised artifacts, or the job fails. Its
    ``ShippedVerdict`` holds the vendor's files that ship."""

    name, stage, timed_as = "vendor_accuracy", "toolchain", None

    def applies(self, job: OptimizeRun) -> bool:
        precision = job.evidence("precision")
        return bool(precision is not None and precision.get("vendor_quantiser"))

    def verify(self, job: OptimizeRun) -> Verdict:
        toolchain = job.verdict("toolchain", BuildVerdict)
        files = _vendor_verdicts(
            job.evidence("precision"), _precision_runs(job), toolchain.evidence, dict(toolchain.files),
            vendor=toolchain.vendor,
        )  # fmt: skip
        missed = [name for name, entry in (toolchain.evidence.get("buckets") or {}).items() if entry.get("shipped") is False]
        return ShippedVerdict(not missed, job.evidence("precision"),
                              f"vendor-quantised buckets below the target: {missed}" if missed else None,
                              files=files)  # fmt: skip


@dataclass
class ExplorationVerdict(Verdict):
    """The vendor exploration's verdict: the ``Exploration`` itself, for the final build (None: not explored)."""

    exploration: Exploration | None = None


@dataclass
class BuildVerdict(Verdict):
    """The final vendor build's verdict: its ``files``, the report's ``vendor`` section (ours against the
    vendor alone, where explored) and the ``exploration`` as it ships."""

    files: dict[str, bytes | Path] = field(default_factory=dict)
    vendor: dict | None = None
    exploration: Exploration | None = None


@dataclass
class ShippedVerdict(Verdict):
    """The vendor-accuracy verdict: the vendor's files that ship (those of buckets that kept the target)."""

    files: dict[str, bytes | Path] = field(default_factory=dict)


def _precision_runs(job: OptimizeRun) -> dict[str, PrecisionRun]:
    """Each bucket's ``PrecisionRun`` (the precision verifier's), or none where it did not run."""
    precision = job.verdict("precision", PrecisionVerdict)
    return precision.runs if precision is not None else {}


def _describe(job: OptimizeRun, comp: Compilation, bucket: BucketModel, cost_model: CostModel) -> None:
    """Memory plan, partition and estimates of a bucket whose model changed after ``_compile``."""
    comp.memory[bucket.name] = plan_memory(bucket.model, dims=bucket.at).as_dict()
    mapping = SubgraphMapper(job.optimizer.target, job.optimizer.adapter, cost_model, cost_model.cache).map(bucket.model)
    comp.partition[bucket.name] = mapping.as_dict()
    cost = cost_model.graph_cost(bucket.model)
    estimates = dict(comp.estimates.get(bucket.name) or {})
    estimates["after"] = cost.as_dict()
    estimates["on_target"] = target_estimate(job.optimizer.target, mapping, cost, comp.memory[bucket.name])
    comp.estimates[bucket.name] = estimates


def _explored(job: OptimizeRun, comp, exploration, original_source, options, references, validation, cost_model):
    """The buckets exploration chose: a changed model is validated against the original again (and kept
    only if it holds: else the bucket goes back to our plain model, said in the decision); a bucket that
    ships the original model is the original, so nothing of ours is left in it to validate."""
    chosen = {b.name: b for b in exploration.buckets}
    if options.validate_outputs and exploration.changed:
        changed = copy.copy(comp)
        changed.buckets = [chosen[b.name] for b in comp.buckets if b.name in exploration.changed]
        results = {r.bucket: r for r in validate_buckets(job, changed)}
        for name, result in results.items():
            if not result.ok:
                chosen[name] = next(b for b in comp.buckets if b.name == name)
                exploration.changed.discard(name)
                exploration.report["buckets"][name]["decision"] += (
                    f"; not shipped: it failed validation against the original ({result.describe_failure()})"
                )
            else:
                validation = [result.as_dict() if v.get("bucket") == name else v for v in validation]
    comp = copy.copy(comp)
    comp.buckets = [chosen[b.name] for b in comp.buckets]
    comp.partition, comp.estimates, comp.memory = dict(comp.partition), dict(comp.estimates), dict(comp.memory)
    for bucket in comp.buckets:
        if bucket.name in exploration.changed:  # the report describes the model that ships
            _describe(job, comp, bucket, cost_model)
    for name in exploration.original:
        part = comp.partition.get(name)
        if part is not None:
            part.setdefault("notes", []).append(
                "this bucket ships the original model (see report.vendor): the partition above is our prediction "
                "for our model; the vendor's own placement of the original is under toolchain.buckets"
            )
    return comp, validation


def _vendor_fallback(comp, exploration, failure: str):
    """The vendor's final build failed on a model of ours where the vendor alone built the original: every
    bucket that has a vendor-alone build ships the original instead, and says why."""
    sources = {}
    for name, row in exploration.report["buckets"].items():
        if row["vendor_alone"].get("cycles") is not None and name not in exploration.original:
            sources[name] = row
    if not sources:
        return comp, exploration
    original = ir.load(exploration.original_file) if exploration.original_file else None
    if original is None:
        return comp, exploration
    comp = copy.copy(comp)
    comp.buckets = [
        dataclasses.replace(b, model=original, portable=None) if b.name in sources else b for b in comp.buckets
    ]
    for name, row in sources.items():
        exploration.original.add(name)
        exploration.changed.discard(name)
        row["decision"] += f"; the vendor's final build of our model failed ({failure.splitlines()[0][:300]}): the original model ships"
    return comp, exploration


def _vendor_verdicts(precision: dict, runs: dict, toolchain: dict, files: dict, vendor: dict | None = None) -> dict:
    """Each bucket's vendor-quantised model judged by the accuracy target (``vendor_verdict``); a bucket
    that misses it loses its quantised artifacts (or the job fails, as ``precision_fallback`` asks)."""
    sections = precision.get("buckets") or {next(iter(runs)): precision}
    for name, bucket_run in runs.items():
        entry = (toolchain.get("buckets") or {}).get(name) or {}
        section = sections[name]
        section["toolchain_accuracy"] = (
            {**entry["accuracy"], "source": SOURCES["simulator"]} if entry.get("accuracy") else None
        )
        ok = vendor_verdict(bucket_run, section, name, entry.get("accuracy"), bool(toolchain.get("ran")))
        if section is not precision:
            precision["warnings"].extend(w for w in section["warnings"] if w not in precision["warnings"])
        if not ok:
            for artifact in entry.get("artifacts", []):
                files.pop(artifact, None)
            entry["shipped"] = False
        elif toolchain.get("ran") and entry.get("accuracy") is not None and entry.get("artifacts"):
            # The vendor's binary holds the requested precision (its simulator judged it): that is what ships;
            # the ONNX model beside it stays float, the quantiser's input.
            # Exploration may have found plain float16 cheaper than any accurate quantised build (its name,
            # e.g. "float16", against "w8a8" or "w8a8 + float16 hybrid"): then float16 is what ships.
            chosen = (((vendor or {}).get("buckets") or {}).get(name) or {}).get("precision")
            float_only = bool(chosen) and "float16" in chosen and "+" not in chosen
            section["shipped"] = "fp16" if float_only else precision.get("requested") or bucket_run.options.precision
            section["shipped_in"] = "the vendor binary (" + ", ".join(entry["artifacts"]) + ")"
            if chosen:
                section["shipped_format"] = chosen
    if isinstance(precision.get("shipped"), dict):
        precision["shipped"] = {name: section.get("shipped") for name, section in sections.items()}
    toolchain["artifacts"] = sorted(files)
    return files


def _traffic_request(options: OptimizeOptions, buckets) -> dict | None:
    """Observed traffic and each bucket's dims, for the vendor's expected cost per request (``vendor_runs.explore``)."""
    if not options.observed_shapes:
        return None
    observed = [{"dims": dict(entry.dims), "count": entry.count} for entry in options.observed_shapes]
    named = {dim for entry in observed for dim in entry["dims"]}
    fixed = {dim: value for bucket in buckets for dim, value in bucket.dims.items() if dim not in named}
    return {"observed": observed, "bucket_dims": {b.name: dict(b.dims) for b in buckets}, "fixed": fixed}


def _user_samples(runs: dict) -> dict:
    """The user's samples per bucket for vendor exploration, split as the precision stage split them
    (``holdout``): the vendor quantises on the calibration part and is judged on the held-out part. Synthetic
    samples never judge accuracy, so buckets calibrated on them are left out."""
    calibration, held_out = {}, {}
    for name, precision_run in runs.items():
        if precision_run.synthetic or not precision_run.samples:
            continue
        calibration[name] = precision_run.calibration or precision_run.samples
        held_out[name] = precision_run.judged or calibration[name]
    return {"calibration": calibration or None, "held_out": held_out or None}
