"""``FlexDSAOptimizer``: the whole compiler as one short list of stages and verifiers.

    result = FlexDSAOptimizer("cpu-ort").optimize("model.onnx", OptimizeOptions(), cache=..., progress=...)

``_optimize`` reads top to bottom: the stages that make the model (ingest, shapes, compile), the verifiers
that judge it (``verifiers()``: validation, padding, never-slower, precision, vendor exploration and toolchain; each answers a
``verify.Verdict`` with its evidence, and those that can undo a rewrite share ``verify.roll_back``), then the
bundle. ``_compile_buckets`` is the per-bucket pipeline (shapes -> generic passes -> Fusion Switcher ->
legalise -> memory plan -> Subgraph Mapper), run under a set of switched-off rewrites; every rewrite it
runs comes from the target's ``registry.Registry``. The state of one call is a ``job.Job``.

A little over 500 lines because the per-bucket stage methods sit beside the pipeline that lists them, so
that one file shows every stage of the compiler in order; the verifiers live in ``verify/``.
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
import time
import weakref
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx_ir as ir

from flexdsa_core.accuracy import check_outputs
from flexdsa_core.cache import KernelCache, LayeredCache, LRUCache, StatsCache
from flexdsa_core.calibration import check_calibration, load_calibration
from flexdsa_core.compilation import BucketRun, Compilation, Stage, loadable
from flexdsa_core.cost_model import CostModel
from flexdsa_core.delivery import check_delivery
from flexdsa_core.errors import FlexDSAError
from flexdsa_core.figures import job_figures
from flexdsa_core.fusion_switcher import FusionSwitcher
from flexdsa_core.in_memory import (
    InMemoryModel,
    align_weights,
    arrays_scope,
    detach_from_proto,
    release_arrays,
    share_weights,
)
from flexdsa_core.ingest import Ingested, ingest
from flexdsa_core.invariants import check_invariants
from flexdsa_core.job import Job, Progress, StageProgress
from flexdsa_core.loadable import UnloadableGraph, load_refusal, plain_reason
from flexdsa_core.memory_planner import plan_memory
from flexdsa_core.options import OptimizeOptions
from flexdsa_core.passes.manager import run_passes
from flexdsa_core.precision import (
    check_calibration_source,
    check_precision_request,
    int8_only,
    samples_dataset,
    samples_npz,
    synthetic_calibration_warning,
)
from flexdsa_core.preflight import check_buckets, check_disabled, model_limits, refuse_impossible_tensors
from flexdsa_core.registry import Registry
from flexdsa_core.report import build_report, headline, render_summary, report_summary
from flexdsa_core.rewrites import KINDS
from flexdsa_core.serialized import kept_bytes, model_bytes, serialization_scope
from flexdsa_core.shape_plan import ShapePlan
from flexdsa_core.shape_tracker import Bucket, ShapeTracker
from flexdsa_core.subgraph_mapper import SubgraphMapper
from flexdsa_core.targets import BucketModel, PlatformAdapter, TargetSpec, get_adapter, load_target, op_key
from flexdsa_core.targets.accelerator import AcceleratorAdapter
from flexdsa_core.targets.deploy_manifest import complete_manifest
from flexdsa_core.targets.estimate import target_estimate
from flexdsa_core.validate import proto_without_weights, run_budget
from flexdsa_core.verify import Verifier
from flexdsa_core.verify.latency import ModelClock, NeverSlower
from flexdsa_core.verify.precision import Precision
from flexdsa_core.verify.toolchain import Toolchain, VendorExploration, VendorVerdicts
from flexdsa_core.verify.validation import Padding, References, Validation

__all__ = ["Compilation", "FlexDSAOptimizer", "ModelClock", "OptimizeResult", "Progress"]


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


def _output_shapes(model: ir.Model) -> dict[str, list | None]:
    """Graph output name -> its dims (ints or names), None where unknown: what accuracy metrics are checked against."""
    return {
        value.name: None if value.shape is None else [d if isinstance(d, int) else str(d) for d in value.shape]
        for value in model.graph.outputs
    }


def _op_counts(model: ir.Model) -> dict[str, int]:
    return dict(sorted(Counter(op_key(node.op_type, node.domain) for node in model.graph).items()))


class FlexDSAOptimizer:
    """``toolchain_root``: where vendor toolchains are installed (``flexdsa toolchains install``); None means
    none is used, and accelerator bundles carry the commands to compile them on the user's side. ``rules``:
    the fusion rule library (default: every rule found in ``fusions/``); ``clock``: how whole models are
    timed (``ModelClock``). Both are there for tests and experiments; a service never sets them."""

    def __init__(
        self,
        target: TargetSpec | str,
        *,
        toolchain_root: str | Path | None = None,
        rules: Sequence | None = None,
        clock: ModelClock | None = None,
    ) -> None:
        self.target = load_target(target) if isinstance(target, str) else target
        self.adapter: PlatformAdapter = get_adapter(self.target)
        self.toolchain_root = Path(toolchain_root) if toolchain_root is not None else None
        # Every rewrite this target runs, of every kind (passes, fusion rules, legalisations): one registry.
        self.registry = Registry(self.target, rules)
        self.rules = self.registry.fusions
        self.clock = clock or ModelClock()

    def switchable_rewrites(self) -> dict[str, list[str]]:
        """Every name ``disabled_rules`` accepts for this target, by kind (the registry's)."""
        return self.registry.names()

    def _check_disabled(self, options: OptimizeOptions) -> None:
        check_disabled(options.disabled_rules, self.target)

    def supports(self, key: str) -> bool:
        op_type, domain = (key.split("::", 1)[1], key.split("::", 1)[0]) if "::" in key else (key, "")
        if self.target.opset_range and domain in ("", "ai.onnx") and not _in_opset(op_type, self.target.opset_range):
            return False  # e.g. LayerNormalization (opset 17) on a parser that stops at opset 15
        return self.adapter.supports(self.target, op_type, domain)

    # ------------------------------------------------------------------ the verified run
    def optimize(
        self,
        model: str | Path | bytes | onnx.ModelProto,
        options: OptimizeOptions | None = None,
        *,
        cache: KernelCache | None = None,
        progress: Progress | None = None,
        workdir: str | Path | None = None,
        calibration: dict | bytes | str | Path | None = None,
    ) -> OptimizeResult:
        """Optimise, validate and package ``model``. Scratch files (validation copies and artifacts of models
        with external data) go under ``workdir``, or a temporary folder removed with the result.
        ``calibration``: samples for ``options.precision`` other than fp32, an ``.npz`` (path or bytes) or its
        arrays by input name (``calibration.py``); None: synthetic samples, with a warning."""
        owned = workdir is None
        scratch = Path(tempfile.mkdtemp(prefix="flexdsa-")) if owned else Path(workdir)
        scratch.mkdir(parents=True, exist_ok=True)  # a caller's folder that does not exist yet
        budget_s = (options or OptimizeOptions()).run_budget_s
        try:
            # Every ONNX Runtime run below (validation, latency, shape probes) stops at this budget; a finished
            # model is serialised once for all of them and the artifacts (no stage changes a finished model),
            # and a weight ONNX Runtime reads from memory is made an array once (``in_memory``).
            with run_budget(budget_s), serialization_scope(), arrays_scope():
                result = self._optimize(model, options, cache, progress, scratch, calibration)
        except BaseException:
            if owned:
                shutil.rmtree(scratch, ignore_errors=True)
            raise
        if owned:
            weakref.finalize(result, shutil.rmtree, scratch, True)
        return result

    def _optimize(self, model, options, cache, progress, workdir: Path, calibration=None) -> OptimizeResult:
        options = options or OptimizeOptions()
        self._check_disabled(options)
        check_precision_request(options, self.target)
        # An in-process LRU always sits in front: identical layers in one model (and the recompiles of the
        # bisection) measure once, whatever the caller's cache is.
        if not isinstance(cache, StatsCache):
            cache = StatsCache(LayeredCache(LRUCache(), cache) if cache is not None else LRUCache())
        job = Job(self, options, cache, StageProgress(progress), workdir, calibration)

        # The stages that make the model, each from what the one before left in ``job``:
        self._ingest(job, model)  # parse and check; external data stays lazy and inside the upload
        self._shapes(job)  # Shape Tracker: named dims, buckets, one shape plan, the cost model at it
        self._compile(job)  # per bucket: passes, fusions, legalisation, memory, mapper (``_compile_buckets``)
        # The verifiers that judge it, each a verdict with its evidence; validation and the never-slower check
        # undo a rewrite through the one rollback (``verify.roll_back``):
        for verifier in self.verifiers():
            self._verify(job, verifier)
        # The bundle: report, the adapter's target-ready files, the manifest.
        return self._package(job)

    @staticmethod
    def verifiers() -> tuple[Verifier, ...]:
        """Fresh verifiers for one run, in order (each may keep state for the run: the latency check's timings)."""
        return (
            Validation(),  # every bucket against the original; on a mismatch, roll back the rewrite
            Padding(),  # whether the runtime may pad a request up to its bucket
            NeverSlower(),  # cpu-ort: timed against the original; a rewrite that costs time is rolled back
            Precision(),  # int8/mixed/fp16 judged on held-out samples, never slower than fp32
            VendorExploration(),  # accelerators: forms scored by the vendor's own estimate, vendor alone beside
            Toolchain(),  # accelerators: the vendor's own build and simulator of what ships
            VendorVerdicts(),  # the vendor-quantised model judged by the accuracy target
        )

    @staticmethod
    def _verify(job: Job, verifier: Verifier) -> None:
        """One verifier through the shared hooks: its progress message, its time, its verdict."""
        if verifier.applies(job):
            message = verifier.start_message(job)
            if message:
                job.progress(verifier.stage, 0.0, message)
            if verifier.seconds_key is None:
                job.verdicts[verifier.name] = verifier.verify(job)
            else:
                with job.timed(verifier.seconds_key):
                    job.verdicts[verifier.name] = verifier.verify(job)
        if verifier.finishes:
            job.progress.finish(verifier.stage)

    # ------------------------------------------------------------------ the per-bucket pipeline
    def _compile_buckets(
        self,
        tracker: ShapeTracker,
        buckets,
        options: OptimizeOptions,
        disabled: frozenset[str],
        cost_model: CostModel,
        progress: StageProgress,
    ) -> Compilation:
        """The pipeline, once per shape bucket: each stage below is one named method, in order. Timing,
        progress and the invariant checks (``debug_invariants``) are applied around them by the loop."""
        stages = (
            # Shape Tracker: fix this bucket's dims and fold the shape arithmetic they decide.
            Stage("shapes", self._specialize, check=True),
            # Whole-graph estimate before the rewrites (targets we cannot run; cpu-ort measures instead).
            Stage(None, self._estimate_before),
            # Generic passes to a fixed point: folding, CSE, dead code, no-ops, algebra.
            Stage("passes", self._generic_passes, progress="generic passes", check=True),
            # Fusion Switcher: legal fusions for this target, each taken only where the cost model says it pays.
            Stage("fusion", self._choose_fusions, progress="choosing fusions", check=True),
            # Platform legalisation: ops the target lacks are rewritten (or left to CPU fallback).
            Stage("adapter", self._legalize, check=True, supported=True),
            # Memory plan: lifetimes -> static arena, reported against the naive sum of all tensors.
            Stage("memory", self._plan_memory),
            # Subgraph Mapper (accelerators): accelerator partitions vs CPU fallback, kernels against SRAM.
            Stage("mapper", self._map_subgraphs),
            # What the report needs: the delivery check of every taken fusion, and the estimates after.
            Stage(None, self._record),
        )
        comp = Compilation(disabled, [], [], {}, {}, {}, {}, Counter())
        passes = [p.make(options) for p in self.registry.passes if p.name not in disabled]
        for index, bucket in enumerate(buckets):
            run = BucketRun(bucket, tracker, options, disabled, cost_model, passes, comp)
            for stage in stages:
                if stage.progress:
                    progress(stage.name, index / len(buckets), f"{stage.progress} ({bucket.name})")
                start = time.perf_counter()
                try:
                    stage.run(run)
                except (FlexDSAError, MemoryError):
                    raise  # the user's to fix, or the machine's: not a rewrite to roll back
                except Exception as error:  # noqa: BLE001 - a stage that broke on what a rewrite made
                    raise UnloadableGraph(comp, f"{stage.run.__name__.strip('_')}[{bucket.name}]",
                                          plain_reason(error), error) from error  # fmt: skip
                if stage.name:
                    comp.stage_seconds[stage.name] += time.perf_counter() - start
                if stage.check and options.debug_invariants:
                    supported = self.adapter_supports if stage.supported else None
                    check_invariants(run.model, stage=f"{stage.name}[{bucket.name}]", supported=supported)
            # The weights the passes made: the same ones as the buckets before made take their tensors, the
            # rest an aligned array each that sessions read in place (not a copy per session).
            earlier = [model for done in comp.buckets for model in (done.model, done.portable) if model is not None]
            for model in (run.model, run.legalized.portable):
                if model is not None:
                    share_weights(model, earlier)
                    align_weights(model)
                    earlier.append(model)
            # Never a graph ONNX Runtime refuses: each finished bucket is loaded once (nothing run).
            refusal = load_refusal(run.model)
            if refusal is not None:
                raise UnloadableGraph(comp, f"load[{bucket.name}]", refusal)
            comp.buckets.append(
                BucketModel(
                    bucket.name, run.model, bucket.input_shapes(run.model), run.legalized.portable, run.at
                )
            )
        return comp

    def _specialize(self, run: BucketRun) -> None:
        run.model = run.tracker.specialize(run.bucket)

    def _estimate_before(self, run: BucketRun) -> None:
        if not self.target.calibrated:
            run.cost_before = run.cost_model.graph_cost(run.model)

    def _generic_passes(self, run: BucketRun) -> None:
        run.records = run_passes(run.model, run.passes)
        for record in run.records:
            if record.modified:
                run.applied(record.name)

    def _choose_fusions(self, run: BucketRun) -> None:
        switcher = FusionSwitcher(
            self.target, self.supports, run.cost_model, objective=run.options.objective, disabled=run.disabled
        )
        run.plan = switcher.run(run.model, self.rules)
        for name in run.plan.applied:
            run.applied(name)
        # Fusions leave dead producers and foldable leftovers behind: one more round of the passes.
        run.records += run_passes(run.model, run.passes)

    def _legalize(self, run: BucketRun) -> None:
        run.legalized = self.adapter.legalize(run.model, self.target, run.disabled)
        run.model = run.legalized.model
        run.comp.legalization[run.bucket.name] = run.legalized.notes
        for name in run.legalized.applied:
            run.applied(name)

    def _plan_memory(self, run: BucketRun) -> None:
        # One shape per bucket from here on: the dims still symbolic take the values the cost model costed
        # them at (lowered where the model refused its default), and memory, validation and the latency check
        # all use them.
        run.at = run.cost_model.input_dims(run.model)
        run.comp.memory[run.bucket.name] = plan_memory(
            run.model, dims={**run.bucket.dims, **run.at}
        ).as_dict()

    def _map_subgraphs(self, run: BucketRun) -> None:
        if isinstance(self.adapter, AcceleratorAdapter):
            run.mapping = SubgraphMapper(self.target, self.adapter, run.cost_model, run.cost_model.cache).map(
                run.model
            )
            run.comp.partition[run.bucket.name] = run.mapping.as_dict()

    def _record(self, run: BucketRun) -> None:
        comp, name, plan = run.comp, run.bucket.name, run.plan.to_json()
        comp.pass_records[name] = [r.as_dict() for r in run.records]
        comp.fusion_plans[name] = plan
        # Every fusion the plan calls taken must be in the file we deliver, or the report says it is not.
        plan["delivery_warnings"] = check_delivery(plan, run.model)
        if run.cost_before is not None:
            cost_after = run.cost_model.graph_cost(run.model)
            comp.estimates[name] = {"before": run.cost_before.as_dict(), "after": cost_after.as_dict()}
            if run.mapping is not None:
                comp.estimates[name]["on_target"] = target_estimate(
                    self.target, run.mapping, cost_after, comp.memory[name]
                )
        else:
            comp.estimates[name] = {
                "note": "not estimated: this target runs here, see the measured latency",
                "fusion_gain_estimate_s": sum(
                    (c.get("estimated_gain") or {}).get("seconds", 0) or 0
                    for c in plan.get("candidates", [])
                    if c.get("taken")
                ),
            }

    def adapter_supports(self, op_type: str, domain: str) -> bool:
        return self.adapter.supports(self.target, op_type, domain)

    # ------------------------------------------------------------------ stages of the verified run
    def _ingest(self, job: Job, model) -> None:
        """Parse and check the model; metrics naming outputs the model lacks, an int8-only target without
        samples, and calibration samples that do not fit are refused here, before any compiling."""
        options = job.options
        job.progress("ingest", 0.0, "reading model")
        with job.timed("ingest"):
            if isinstance(model, onnx.ModelProto):
                model = model.SerializeToString()
            ingested: Ingested = ingest(model)
            job.ingested = ingested
            job.original_source = Path(model) if isinstance(model, (str, Path)) else model
            job.original_digest = ingested.info.get("sha256")  # of exactly these bytes (the file, or the upload)
            # The model's tensors made its own, so that the parsed upload goes once its ONNX Runtime form (for
            # the original's sessions, weights read from memory: no second parse, no copies) is taken from it.
            detach_from_proto(ingested.model)
            if ingested.proto is not None and (options.validate_outputs or options.measure_latency):
                job.original_in_memory = InMemoryModel.from_proto(ingested.proto, ingested.model)
            ingested.proto = None
            if ingested.info.get("ir_version_lowered_from"):  # ONNX Runtime refuses the file as uploaded
                job.original_source, job.original_digest = job.model_source(ingested.model), None
                job.original_in_memory = None
        job.nodes_before = _op_counts(ingested.model)
        check_outputs(options.accuracy, _output_shapes(ingested.model))
        check_calibration_source(options, self.target, has_samples=job.calibration is not None)
        job.samples = self._calibration_samples(ingested.model, options, job.calibration)
        job.progress.finish("ingest")

    def _shapes(self, job: Job) -> None:
        """Symbolic shapes with named dims; buckets from the request, the traffic or the target; refused here
        when the model cannot run at one. Then one source of shapes: the dims no bucket fixes take the
        Shape Tracker's representative values (held to the memory budget), for the costing, the memory plan
        and validation alike."""
        options = job.options
        job.progress("shapes", 0.0, "inferring shapes")
        with job.timed("shapes"):
            tracker = job.tracker = ShapeTracker(job.ingested.model)
            if options.input_shapes:
                tracker.apply_input_shapes(options.input_shapes)
            job.shape_report = tracker.infer()
            refuse_impossible_tensors(job.ingested.model)  # 10^12-element Expand: refused before anything allocates
            # The tracker's copy (the same tensors) is the original from here on: the upload's graph goes.
            job.ingested.model = None
            # Without shape_buckets, observed_shapes (traffic) decide the buckets: least expected padded cost;
            # and the calibration samples' own shapes stand for the target's default of a dim (seq 64, not 128).
            traffic = {"observed": options.observed_shapes, "max_buckets": options.max_buckets}
            job.buckets = tracker.buckets(options.shape_buckets, self.target, **traffic, samples=job.samples)
            check_buckets(tracker, job.buckets)  # a bucket the model cannot run is the user's to fix
            check_precision_request(options, self.target, buckets=len(job.buckets))
        job.progress.finish("shapes")
        plan = _free_dims_plan(tracker, job.buckets, job.shape_report)
        # How far each dim of the model goes at all (a 64-row position table: seq 64): the runtime refuses a
        # request past it as such, before any backend is called, instead of a backend's raw error.
        tracker.limits = model_limits(tracker, job.buckets, plan.dims)
        job.cost_model = CostModel(
            self.target, cache=job.cache, calibrate=options.calibrate and self.target.calibrated, dims=plan.dims
        )
        job.cost_model.memory_budget_bytes = plan.budget_bytes

    def _compile(self, job: Job) -> None:
        """The per-bucket pipeline under the requested switched-off rewrites, loadable in ONNX Runtime (a
        rewrite that makes a graph it refuses is bisected and switched off); ``job.recompile`` is the same
        pipeline under other switched-off sets, what every rollback calls."""
        job.recompile = functools.partial(
            self._compile_buckets, job.tracker, job.buckets, job.options, cost_model=job.cost_model,
            progress=job.progress,
        )  # fmt: skip
        job.comp = loadable(job.recompile, frozenset(job.options.disabled_rules), job.rollbacks)
        for stage in ("passes", "fusion", "memory"):
            job.progress.finish(stage)
        # The inputs validation and the latency check use, and the original's outputs on them, made once.
        job.references = References(job.original_source, job.options.seed, job.original_digest, job.original_in_memory)

    def _package(self, job: Job) -> OptimizeResult:
        """The report (every verifier's evidence), the adapter's target-ready files and the manifest."""
        options, comp, tracker, cache = job.options, job.comp, job.tracker, job.cache
        latency, precision, padding = job.latency, job.precision, job.padding
        toolchain_report, vendor, exploration = job.toolchain_report, job.vendor, job.exploration
        # Every ONNX Runtime run of the original is done: its in-memory copy (for a model whose weights are
        # Constant nodes, the whole upload again), the reference outputs and the arrays kept for sessions go
        # before the artifacts are serialised, where the job's memory peaks.
        job.original_in_memory = None
        job.references.release()
        release_arrays()
        # Nothing specialises or recompiles from here: the tracker's models (the original's graph, its weights
        # and each bucket's specialised copy) go too, once the manifest is taken from them.
        shape_manifest = tracker.manifest()
        tracker.release_models()
        job.recompile = None
        job.progress("adapter", 0.0, "generating artifacts")
        job.stage_seconds.update(comp.stage_seconds)
        report = build_report(
            target=self.target,
            options=options,
            ingested=job.ingested,
            nodes_before=job.nodes_before,
            comp=comp,
            shape_report=job.shape_report.as_dict(),
            shape_manifest=shape_manifest,
            validation=job.validation,
            rollbacks=job.rollbacks,
            latency=latency,
            cache_stats=cache.stats.as_dict(),
            stage_seconds=dict(job.stage_seconds),
            total_seconds=time.perf_counter() - job.started,
            shape_notes=job.references.notes,
        )
        # What changed the graph, by kind, as the registry declares it (pass, fusion, legalisation).
        report["rewrites_applied_by_kind"] = {
            kind: [name for name in comp.applied if self.registry.kind_of(name) == kind] for kind in KINDS
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
        if int8_only(self.target) and job.calibration is None:  # allowed only by allow_synthetic_calibration
            report["warnings"].append(synthetic_calibration_warning(self.target))
        report["shapes"]["padding"] = padding
        report["warnings"].extend(
            f"padding {dim} changes the outputs ({found['reason']}): the runtime serves only a bucket's exact {dim}"
            for dim, found in padding["dims"].items()
            if found.get("tolerated") is False
        )
        if toolchain_report:
            report["toolchain"] = toolchain_report
            report["warnings"].extend(toolchain_report.get("warnings", []))
        if vendor is not None:
            report["vendor"] = vendor
            for bucket_name, plan in exploration.plans.items():
                comp.fusion_plans.setdefault(bucket_name, {})["vendor_exploration"] = plan
        # The one latency, energy and accuracy per bucket every surface shows, each named with its source.
        report["figures"] = job_figures(report)
        # The one speed-up every surface shows, from the best source for this target, named with it.
        report["headline"] = headline(report)
        files = self.adapter.generate(comp.buckets, self.target, report, workdir=job.workdir)
        artifacts: dict[str, bytes | Path] = {**files, **job.toolchain_files}
        if precision is not None and precision.get("vendor_quantiser"):
            first = comp.buckets[0].name
            artifacts["calibration.npz"] = samples_npz(job.precision_samples[first])
            artifacts.update(samples_dataset(job.precision_samples[first]))
            for name, bucket_samples in list(job.precision_samples.items())[1:]:  # each further bucket at its shapes
                artifacts[f"calibration.{name}.npz"] = samples_npz(bucket_samples)
                artifacts.update(samples_dataset(bucket_samples, bucket=name))
        artifacts["report.json"] = json.dumps(report, indent=2, default=str).encode()
        artifacts["fusion_plan.json"] = json.dumps(comp.fusion_plans, indent=2, default=str).encode()
        # Last, over the whole bundle: every file with its role, how to load it and its checksum (the deploy
        # contract flexdsa_runtime reads).
        artifacts["manifest.json"] = complete_manifest(artifacts, report, self.target)
        job.progress.finish("adapter")
        job.progress("report", 1.0, "done")
        serialized = {b.name: kept_bytes(b.model) for b in comp.buckets}
        serialized = {name: data for name, data in serialized.items() if data is not None}
        return OptimizeResult(self.target, comp.buckets, artifacts, report, job.workdir, serialized)

    def _calibration_samples(self, model: ir.Model, options: OptimizeOptions, calibration) -> list[dict] | None:
        if options.precision == "fp32":
            return None
        inputs = proto_without_weights(model)
        if calibration is None:
            return None
        arrays = calibration if isinstance(calibration, dict) else load_calibration(calibration)
        return check_calibration(inputs, arrays)


@functools.cache
def _in_opset(op_type: str, opset_range: tuple[int, int]) -> bool:
    """Whether ai.onnx ``op_type`` exists at an opset inside ``opset_range`` (inclusive)."""
    try:
        schema = onnx.defs.get_schema(op_type, max_inclusive_version=opset_range[1], domain="")
    except onnx.defs.SchemaError:
        return False
    return schema.since_version <= opset_range[1]


def _free_dims_plan(tracker: ShapeTracker, buckets: list[Bucket], shape_report) -> ShapePlan:
    """``tracker.plan`` for the dynamic dims no bucket fixes (at the first bucket's values), merged into the
    report's ``shapes.plan`` beside the default buckets' choice."""
    free = [name for name in shape_report.dims if name not in buckets[0].dims]
    plan = tracker.plan(free, fixed=buckets[0].dims)
    merged = dict(shape_report.plan or {})
    fresh = plan.as_dict()
    merged["dims"] = {**merged.get("dims", {}), **fresh["dims"]}
    merged["notes"] = [*merged.get("notes", []), *fresh["notes"]]
    shape_report.plan = {**fresh, **merged}
    return plan
