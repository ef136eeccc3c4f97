"""``FlexDSAOptimizer``: runs a target's pipeline, the stages and verifiers its adapter lists.

    result = FlexDSAOptimizer("cpu-ort").optimize("model.onnx", OptimizeOptions(), cache=..., progress=...)

``_optimize`` reads top to bottom: the stages that make the model (ingest, shapes, compile), the verifiers
that judge it, then the bundle (``bundle.package``). Which per-bucket stages run (``pipeline``: shapes ->
generic passes -> Fusion Switcher -> legalise -> memory plan, and the Subgraph Mapper on accelerators) and
which verifiers judge the result (``verify``: validation, padding, the latency check, precision, and on
accelerators the vendor's exploration, build and simulator) is the adapter's to say
(``PlatformAdapter.stages`` and ``verifiers``); this module knows no target. Every rewrite the stages run
comes from the target's ``registry.Registry``; every rollback goes through ``verify.roll_back``. The state
of one call is an ``optimize_run.OptimizeRun``.
"""

from __future__ import annotations

import functools
import shutil
import tempfile
import time
import weakref
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import onnx
import onnx_ir as ir

from flexdsa_core._libraries import preload_symbolic_shapes
from flexdsa_core.accuracy import check_outputs
from flexdsa_core.bundle import OptimizeResult, package
from flexdsa_core.cache import KernelCache, LayeredCache, LRUCache, StatsCache
from flexdsa_core.calibration import check_calibration, load_calibration
from flexdsa_core.compilation import KERNEL_TIMING, BucketRun, Compilation
from flexdsa_core.cost_model import CostModel
from flexdsa_core.errors import FlexDSAError
from flexdsa_core.fusions import discover_rules
from flexdsa_core.in_memory import (
    InMemoryModel,
    align_weights,
    arrays_scope,
    detach_from_proto,
    share_weights,
)
from flexdsa_core.ingest import Ingested, ingest
from flexdsa_core.invariants import check_invariants
from flexdsa_core.loadable import UnloadableGraph, load_refusal, plain_reason
from flexdsa_core.optimize_run import OptimizeRun, Progress, StageProgress
from flexdsa_core.options import OptimizeOptions
from flexdsa_core.ort_runs import proto_without_weights, run_budget
from flexdsa_core.pipeline import stages_named
from flexdsa_core.precision import check_calibration_source, check_precision_request
from flexdsa_core.preflight import check_buckets, check_disabled, model_limits, refuse_impossible_tensors
from flexdsa_core.registry import Registry
from flexdsa_core.serialized import serialization_scope
from flexdsa_core.shape_plan import ShapePlan
from flexdsa_core.shape_tracker import Bucket, ShapeTracker
from flexdsa_core.targets import BucketModel, PlatformAdapter, TargetSpec, get_adapter, load_target, op_key
from flexdsa_core.verify import Loads, Verifier, verifiers_named
from flexdsa_core.verify.latency import ModelClock
from flexdsa_core.verify.references import References

__all__ = ["Compilation", "FlexDSAOptimizer", "ModelClock", "OptimizeResult", "Progress", "preload"]


def preload() -> None:
    """Import now what a job otherwise imports on its way: the fusion rules (found when the first registry
    is made, 0.05 s) and what symbolic shape inference imports on its first use (0.1 s). For a process's
    entry point before ``heap.freeze_imports``: the CLI, the worker's warm spare (each job runs in a fresh
    process, so each paid these inside its stages), the bench's tool process."""
    discover_rules()
    preload_symbolic_shapes()


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
        # The target's pipeline, as its adapter lists it: the per-bucket stages, in order.
        self.stages = stages_named(self.adapter.stages(self.target), self.target.name)

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
        job = OptimizeRun(self, options, cache, StageProgress(progress), workdir, calibration)

        # The stages that make the model, each from what the one before left in ``job``:
        self._ingest(job, model)  # parse and check; external data stays lazy and inside the upload
        self._shapes(job)  # Shape Tracker: named dims, buckets, one shape plan, the cost model at it
        self._compile(job)  # per bucket, the adapter's stages: passes, fusions, legalisation, memory, ... (``_compile_buckets``)
        # The verifiers that judge it, as the adapter lists them, each a verdict with its evidence; those that
        # undo a rewrite go through the one rollback (``verify.roll_back``):
        for verifier in self.verifiers():
            self._verify(job, verifier)
        # The bundle: the report from the verdicts, the adapter's target-ready files, the manifest.
        return package(job)

    def verifiers(self) -> tuple[Verifier, ...]:
        """Fresh verifiers for one run, in the adapter's order (each may keep state for the run: timings)."""
        return verifiers_named(self.adapter.verifiers(self.target), self.target.name)

    @staticmethod
    def _verify(job: OptimizeRun, verifier: Verifier) -> None:
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
        """The adapter's stages (``self.stages``), in order, once per shape bucket. Timing, progress and the
        invariant checks (``debug_invariants``) are applied around them by the loop."""
        comp = Compilation(disabled, [], [], {}, {}, {}, {}, Counter())
        passes = [p.make(options) for p in self.registry.passes if p.name not in disabled]
        for index, bucket in enumerate(buckets):
            run = BucketRun(bucket, tracker, options, disabled, cost_model, passes, comp, optimizer=self)
            for stage in self.stages:
                if stage.progress:
                    progress(stage.name, index / len(buckets), f"{stage.progress} ({bucket.name})")
                start, timing_before = time.perf_counter(), cost_model.measure_seconds
                try:
                    stage.run(run)
                except (FlexDSAError, MemoryError):
                    raise  # the user's to fix, or the machine's: not a rewrite to roll back
                except Exception as error:  # noqa: BLE001 - a stage that broke on what a rewrite made
                    raise UnloadableGraph(comp, f"{stage.run.__name__.strip('_')}[{bucket.name}]",
                                          plain_reason(error), error) from error  # fmt: skip
                if stage.name:  # kernels the cost model timed on the way count as timing, not as the stage
                    timing = cost_model.measure_seconds - timing_before
                    comp.stage_seconds[stage.name] += time.perf_counter() - start - timing
                    comp.stage_seconds[KERNEL_TIMING] += timing
                if stage.check and options.debug_invariants:
                    supported = self.adapter_supports if stage.supported else None
                    check_invariants(run.model, stage=f"{stage.name}[{bucket.name}]", supported=supported)
            # The weights the passes made: the same ones as the buckets before made take their tensors, the
            # rest an aligned array each that sessions read in place (not a copy per session).
            earlier = [model for done in comp.buckets for model in (done.model, done.portable) if model is not None]
            portable = run.legalized.portable if run.legalized is not None else None
            for model in (run.model, portable):
                if model is not None:
                    share_weights(model, earlier)
                    align_weights(model)
                    earlier.append(model)
            # Never a graph ONNX Runtime refuses: each finished bucket is loaded once (nothing run).
            refusal = load_refusal(run.model)
            if refusal is not None:
                raise UnloadableGraph(comp, f"load[{bucket.name}]", refusal)
            comp.buckets.append(
                BucketModel(bucket.name, run.model, bucket.input_shapes(run.model), portable, run.at)
            )
        return comp

    def adapter_supports(self, op_type: str, domain: str) -> bool:
        return self.adapter.supports(self.target, op_type, domain)

    # ------------------------------------------------------------------ stages of the verified run
    def _ingest(self, job: OptimizeRun, model) -> None:
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

    def _shapes(self, job: OptimizeRun) -> None:
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
            refuse_impossible_tensors(job.ingested.model)  # 10^12-element Expand: refused before anything allocates
            # The tracker's copy (the same tensors) is the original from here on: the upload's graph goes, before
            # the inference (a collection there frees it with the symbolic probe: ``_refine_symbolically``).
            job.ingested.model = None
            job.shape_report = tracker.infer()
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
        # Measured where the target runs here and the options allow it (``CostModel.measuring``), else the roofline.
        job.cost_model = CostModel(self.target, cache=job.cache, calibrate=options.calibrate, dims=plan.dims)
        job.cost_model.memory_budget_bytes = plan.budget_bytes

    def _compile(self, job: OptimizeRun) -> None:
        """The per-bucket pipeline under the requested switched-off rewrites, loadable in ONNX Runtime (a
        rewrite that makes a graph it refuses is bisected and switched off); ``job.recompile`` is the same
        pipeline under other switched-off sets, what every rollback calls."""
        job.recompile = functools.partial(
            self._compile_buckets, job.tracker, job.buckets, job.options, cost_model=job.cost_model,
            progress=job.progress,
        )  # fmt: skip
        Loads.compile(job, frozenset(job.options.disabled_rules))
        for stage in ("passes", "fusion", "memory"):
            job.progress.finish(stage)
        # The inputs validation and the latency check use, and the original's outputs on them, made once.
        job.references = References(job.original_source, job.options.seed, job.original_digest, job.original_in_memory)

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
