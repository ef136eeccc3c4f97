"""``FlexDSAOptimizer``: the whole compiler, stage by stage, as one flat pipeline.

    result = FlexDSAOptimizer("cpu-ort").optimize("model.onnx", OptimizeOptions(), cache=..., progress=...)

``_compile`` is the pipeline proper (shapes -> generic passes -> Fusion Switcher -> cleanup -> legalise ->
memory plan), run once per shape bucket and parameterised by the set of rewrites switched off. ``optimize``
wraps it with what makes the output trustworthy: numerical validation of every bucket, accuracy bisection
(find the rewrite that broke the numerics, switch it off, compile again), the never-slower check on
cpu-ort (the same bisection, with latency as the predicate), and the report.

Over 500 lines because it is the glue of every stage: each stage is its own module (shape_tracker,
passes, fusion_switcher, subgraph_mapper, memory_planner, validate, precision, targets) and what
remains here is their order, the bisections that undo a rewrite, and the report.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import shutil
import tempfile
import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from flexdsa_core.accuracy import check_outputs
from flexdsa_core.cache import KernelCache, LayeredCache, LRUCache, StatsCache, kernel_key
from flexdsa_core.calibration import CalibrationError, check_calibration, load_calibration, synthetic_samples
from flexdsa_core.cost_model import CostModel, machine_fingerprint
from flexdsa_core.delivery import check_delivery
from flexdsa_core.dims import is_batch_dim
from flexdsa_core.errors import FlexDSAError, ValidationFailedError
from flexdsa_core.fusion_switcher import FusionSwitcher
from flexdsa_core.fusions import discover_rules
from flexdsa_core.in_memory import InMemoryModel, arrays_scope, release_arrays
from flexdsa_core.ingest import Ingested, ingest, needs_external_data, save_model
from flexdsa_core.invariants import check_invariants
from flexdsa_core.loadable import InternalGraphError, UnloadableGraph, load_refusal, plain_reason
from flexdsa_core.memory_planner import plan_memory
from flexdsa_core.options import OptimizeOptions
from flexdsa_core.padding_check import check_padding
from flexdsa_core.passes import generic_passes
from flexdsa_core.passes.manager import run_passes
from flexdsa_core.precision import (
    QDQ_OPAQUE_WEIGHT_OPS,
    PrecisionRun,
    apply_precision,
    check_calibration_source,
    check_precision_request,
    int8_format,
    int8_only,
    replace_model,
    samples_dataset,
    samples_npz,
    synthetic_calibration_warning,
    vendor_verdict,
)
from flexdsa_core.preflight import check_buckets, check_disabled, refuse_impossible_tensors, switchable_names
from flexdsa_core.report import SOURCES, build_report, headline, render_summary, report_summary
from flexdsa_core.serialized import kept_bytes, model_bytes, serialization_scope
from flexdsa_core.shape_plan import ShapePlan
from flexdsa_core.shape_tracker import Bucket, ShapeTracker
from flexdsa_core.significance import (
    MIN_ROUNDS,
    MODEL_MIN_EFFECT,
    Comparison,
    Question,
    paired,
    settled_early,
)
from flexdsa_core.subgraph_mapper import SubgraphMapper
from flexdsa_core.targets import BucketModel, PlatformAdapter, TargetSpec, get_adapter, load_target, op_key
from flexdsa_core.targets.accelerator import AcceleratorAdapter
from flexdsa_core.targets.deploy_manifest import complete_manifest
from flexdsa_core.targets.estimate import target_estimate
from flexdsa_core.targets.toolchain_run import run_toolchain
from flexdsa_core.targets.vendor_explore import explore, vendor_section
from flexdsa_core.validate import (
    LatencyRounds,
    compare,
    latency_samples,
    make_inputs,
    run,
    run_budget,
    second_shape_dims,
    session,
)
from flexdsa_core.version import __version__

Progress = Callable[[str, float, str], None]

# Share of the whole run each stage takes, for one overall progress fraction.
STAGE_WEIGHTS = {
    "ingest": 0.05, "shapes": 0.05, "passes": 0.15, "fusion": 0.30, "memory": 0.05,
    "adapter": 0.05, "validate": 0.20, "measure": 0.10, "report": 0.05, "precision": 0.0,
}  # fmt: skip
MAX_ROLLBACKS = 6


@dataclass
class Compilation:
    """One run of the pipeline under one set of switched-off rewrites."""

    disabled: frozenset[str]
    buckets: list[BucketModel]
    applied: list[str]  # rewrites that changed the graph, in order of first effect
    pass_records: dict[str, list[dict]]
    fusion_plans: dict[str, dict]
    memory: dict[str, dict]
    estimates: dict[str, dict]
    stage_seconds: Counter
    legalization: dict[str, list[str]] = field(default_factory=dict)
    partition: dict[str, dict] = field(default_factory=dict)


@dataclass(frozen=True)
class _Stage:
    """One stage of ``_compile``: its name (for timing and progress; None: untimed bookkeeping), the method
    that runs it, the progress message, and whether the invariants are checked after it (``supported``:
    also that every op is in the target's table)."""

    name: str | None
    run: Callable[[_BucketRun], None]
    progress: str | None = None
    check: bool = False
    supported: bool = False


@dataclass
class _BucketRun:
    """What the stages of one bucket hand each other: the model as it goes, and what the report keeps."""

    bucket: Bucket
    tracker: ShapeTracker
    options: OptimizeOptions
    disabled: frozenset[str]
    cost_model: CostModel
    passes: list
    comp: Compilation
    model: ir.Model | None = None
    at: dict[str, int] = field(default_factory=dict)  # the free symbolic dims' values (``BucketModel.at``)
    records: list = field(default_factory=list)
    plan: object = None
    legalized: object = None
    mapping: object = None
    cost_before: object = None

    def applied(self, name: str) -> None:
        if name not in self.comp.applied:
            self.comp.applied.append(name)


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


class _Progress:
    """Turns stage-local progress into one overall fraction for the caller's callback."""

    def __init__(self, callback: Progress | None) -> None:
        self.callback = callback
        self.done = 0.0

    def __call__(self, stage: str, local: float = 0.0, message: str = "") -> None:
        if self.callback is not None:
            overall = min(1.0, self.done + STAGE_WEIGHTS.get(stage, 0.0) * max(0.0, min(local, 1.0)))
            self.callback(stage, overall, message)

    def finish(self, stage: str) -> None:
        self.done = min(1.0, self.done + STAGE_WEIGHTS.get(stage, 0.0))


def _output_shapes(model: ir.Model) -> dict[str, list | None]:
    """Graph output name -> its dims (ints or names), None where unknown: what accuracy metrics are checked against."""
    return {
        value.name: None if value.shape is None else [d if isinstance(d, int) else str(d) for d in value.shape]
        for value in model.graph.outputs
    }


def _op_counts(model: ir.Model) -> dict[str, int]:
    return dict(sorted(Counter(op_key(node.op_type, node.domain) for node in model.graph).items()))


@dataclass(frozen=True)
class ModelClock:
    """How whole models are timed against each other for the never-slower check: ``samples(models, feeds,
    repeats=, interleave=)`` (one pass, models loaded in turn) and ``rounds(models, feeds)`` (the models
    loaded once, ``.more(n)`` adding paired rounds). Tests hand in a fake clock here."""

    samples: Callable = latency_samples
    rounds: Callable = LatencyRounds


class _References:
    """The inputs validation and the latency check use, and the original model's outputs on them, per bucket
    shape: made once per job (every re-validation of a bisection reads them again). The original is loaded
    for the runs of one call and let go (a large model's weights are not held a second time meanwhile)."""

    def __init__(
        self,
        original_source: bytes | Path,
        seed: int,
        digest: str | None = None,
        in_memory: InMemoryModel | None = None,
    ) -> None:
        self.original_source = original_source
        self.seed = seed
        # sha256 of ``original_source`` where ingest already took it (a 200 MB model is not hashed twice).
        self.digest = digest
        # The same model for ONNX Runtime with its weights read from memory (``in_memory``), where it can be.
        self.in_memory = in_memory
        # (bucket, costed dims) -> (dims the original runs at, feeds, its outputs)
        self._main: dict[tuple, tuple[dict[str, int], dict, dict]] = {}
        self._second: dict[str, tuple[dict, dict] | None] = {}  # bucket -> the second shape's, or None
        self.notes: dict[str, str] = {}  # bucket -> why its shape is not the costed one

    def release(self) -> None:
        """Let go of the original's in-memory copy and of the reference inputs and outputs (the notes stay)."""
        self.in_memory = None
        self._main.clear()
        self._second.clear()

    @property
    def runtime(self) -> bytes | Path | InMemoryModel:
        """What ONNX Runtime loads the original from."""
        return self.in_memory if self.in_memory is not None else self.original_source

    def inputs(self, bucket: BucketModel, *, second: bool) -> tuple[dict[str, int], list[tuple[dict, dict]]]:
        """(the dims used, [(feeds, outputs)] at ``bucket.at`` and, with ``second`` and symbolic dims, at the
        small second shape). Where the original itself cannot run at the costed shape (a position table
        shorter than the default 128 that no probe met), its free dims are lowered until it runs, with a note."""
        original = None

        def outputs(feeds: dict) -> dict:
            nonlocal original
            if original is None:
                original = session(self.runtime)
            return run(original, feeds)

        key = (bucket.name, tuple(sorted(bucket.at.items())))
        if key not in self._main:
            proto, error = _proto_without_weights(bucket.model), None
            for lowered in (None, 64, 32, 16, 8):
                dims = bucket.at if lowered is None else {
                    k: (v if is_batch_dim(k) else min(v, lowered)) for k, v in bucket.at.items()
                }  # fmt: skip
                if lowered is not None and dims == bucket.at:
                    continue
                feeds = make_inputs(proto, seed=self.seed, dims=dims)
                try:
                    found = (dict(dims), feeds, outputs(feeds))
                    break
                except Exception as err:  # noqa: BLE001 - ORT raises many types; the smallest shape re-raises
                    error = err
            else:
                raise error
            if dims != bucket.at:
                self.notes[bucket.name] = (
                    f"costed at {bucket.at}, but the original model does not run there "
                    f"({str(error).splitlines()[0][:160]}): validated, timed and memory-planned at {dims}"
                )
            self._main[key] = self._main[(bucket.name, tuple(sorted(dims.items())))] = found
        dims, feeds, reference = self._main[key]
        shapes = [(feeds, reference)]
        if second and bucket.at:
            if bucket.name not in self._second:
                proto = _proto_without_weights(bucket.model)
                small = make_inputs(proto, seed=self.seed, dims=second_shape_dims(bucket.at))
                same = {k: v.shape for k, v in small.items()} == {k: v.shape for k, v in feeds.items()}
                self._second[bucket.name] = None if same else self._second_shape(bucket, small, outputs)
            if self._second[bucket.name] is not None:
                shapes.append(self._second[bucket.name])
        return dims, shapes

    def _second_shape(self, bucket: BucketModel, small: dict, outputs) -> tuple[dict, dict] | None:
        """The second shape's (feeds, outputs); None, with a note, where the original itself does not run
        there (a model that takes one sequence length only): nothing to compare the optimised model with."""
        try:
            return small, outputs(small)
        except Exception as err:  # noqa: BLE001 - ORT raises many types
            shapes = {k: list(v.shape) for k, v in small.items()}
            note = (
                f"not validated at a second shape: the original model does not run at {shapes} "
                f"({str(err).splitlines()[0][:160]})"
            )
            self.notes[bucket.name] = f"{self.notes[bucket.name]}; {note}" if bucket.name in self.notes else note
            return None


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
        self.rules = tuple(rules) if rules is not None else tuple(discover_rules())
        self.clock = clock or ModelClock()

    def switchable_rewrites(self) -> dict[str, list[str]]:
        """Every name ``disabled_rules`` accepts for this target, by kind (``preflight.switchable_names``)."""
        return switchable_names(self.target)

    def _check_disabled(self, options: OptimizeOptions) -> None:
        check_disabled(options.disabled_rules, self.target)

    def supports(self, key: str) -> bool:
        op_type, domain = (key.split("::", 1)[1], key.split("::", 1)[0]) if "::" in key else (key, "")
        if self.target.opset_range and domain in ("", "ai.onnx") and not _in_opset(op_type, self.target.opset_range):
            return False  # e.g. LayerNormalization (opset 17) on a parser that stops at opset 15
        return self.adapter.supports(self.target, op_type, domain)

    # ------------------------------------------------------------------ the pipeline
    def _compile(
        self,
        tracker: ShapeTracker,
        buckets,
        options: OptimizeOptions,
        disabled: frozenset[str],
        cost_model: CostModel,
        progress: _Progress,
    ) -> Compilation:
        """The pipeline, once per shape bucket: each stage below is one named method, in order. Timing,
        progress and the invariant checks (``debug_invariants``) are applied around them by the loop."""
        stages = (
            # Shape Tracker: fix this bucket's dims and fold the shape arithmetic they decide.
            _Stage("shapes", self._specialize, check=True),
            # Whole-graph estimate before the rewrites (targets we cannot run; cpu-ort measures instead).
            _Stage(None, self._estimate_before),
            # Generic passes to a fixed point: folding, CSE, dead code, no-ops, algebra.
            _Stage("passes", self._generic_passes, progress="generic passes", check=True),
            # Fusion Switcher: legal fusions for this target, each taken only where the cost model says it pays.
            _Stage("fusion", self._choose_fusions, progress="choosing fusions", check=True),
            # Platform legalisation: ops the target lacks are rewritten (or left to CPU fallback).
            _Stage("adapter", self._legalize, check=True, supported=True),
            # Memory plan: lifetimes -> static arena, reported against the naive sum of all tensors.
            _Stage("memory", self._plan_memory),
            # Subgraph Mapper (accelerators): accelerator partitions vs CPU fallback, kernels against SRAM.
            _Stage("mapper", self._map_subgraphs),
            # What the report needs: the delivery check of every taken fusion, and the estimates after.
            _Stage(None, self._record),
        )
        comp = Compilation(disabled, [], [], {}, {}, {}, {}, Counter())
        passes = [p for p in generic_passes(options) if p.name not in disabled]
        for index, bucket in enumerate(buckets):
            run = _BucketRun(bucket, tracker, options, disabled, cost_model, passes, comp)
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

    def _specialize(self, run: _BucketRun) -> None:
        run.model = run.tracker.specialize(run.bucket)

    def _estimate_before(self, run: _BucketRun) -> None:
        if not self.target.calibrated:
            run.cost_before = run.cost_model.graph_cost(run.model)

    def _generic_passes(self, run: _BucketRun) -> None:
        run.records = run_passes(run.model, run.passes)
        for record in run.records:
            if record.modified:
                run.applied(record.name)

    def _choose_fusions(self, run: _BucketRun) -> None:
        switcher = FusionSwitcher(
            self.target, self.supports, run.cost_model, objective=run.options.objective, disabled=run.disabled
        )
        run.plan = switcher.run(run.model, self.rules)
        for name in run.plan.applied:
            run.applied(name)
        # Fusions leave dead producers and foldable leftovers behind: one more round of the passes.
        run.records += run_passes(run.model, run.passes)

    def _legalize(self, run: _BucketRun) -> None:
        run.legalized = self.adapter.legalize(run.model, self.target, run.disabled)
        run.model = run.legalized.model
        run.comp.legalization[run.bucket.name] = run.legalized.notes
        for name in run.legalized.applied:
            run.applied(name)

    def _plan_memory(self, run: _BucketRun) -> None:
        # One shape per bucket from here on: the dims still symbolic take the values the cost model costed
        # them at (lowered where the model refused its default), and memory, validation and the latency check
        # all use them.
        run.at = run.cost_model.input_dims(run.model)
        run.comp.memory[run.bucket.name] = plan_memory(
            run.model, dims={**run.bucket.dims, **run.at}
        ).as_dict()

    def _map_subgraphs(self, run: _BucketRun) -> None:
        if isinstance(self.adapter, AcceleratorAdapter):
            run.mapping = SubgraphMapper(self.target, self.adapter, run.cost_model, run.cost_model.cache).map(
                run.model
            )
            run.comp.partition[run.bucket.name] = run.mapping.as_dict()

    def _record(self, run: _BucketRun) -> None:
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
        run = copy.copy(self)  # per-call state (the scratch folder) stays off the shared instance
        run._scratch = scratch
        budget_s = (options or OptimizeOptions()).run_budget_s
        try:
            # Every ONNX Runtime run below (validation, latency, shape probes) stops at this budget; a finished
            # model is serialised once for all of them and the artifacts (no stage changes a finished model),
            # and a weight ONNX Runtime reads from memory is made an array once (``in_memory``).
            with run_budget(budget_s), serialization_scope(), arrays_scope():
                result = run._optimize(model, options, cache, progress, scratch, calibration)
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
        report_progress = _Progress(progress)
        # An in-process LRU always sits in front: identical layers in one model (and the recompiles of the
        # bisection) measure once, whatever the caller's cache is.
        if not isinstance(cache, StatsCache):
            cache = StatsCache(LayeredCache(LRUCache(), cache) if cache is not None else LRUCache())
        stage_seconds: Counter = Counter()
        started = time.perf_counter()

        # Stage 1, ingest: parse and check the model; external data stays lazy and inside the upload.
        report_progress("ingest", 0.0, "reading model")
        start = time.perf_counter()
        if isinstance(model, onnx.ModelProto):
            model = model.SerializeToString()
        ingested: Ingested = ingest(model)
        original_source = Path(model) if isinstance(model, (str, Path)) else model
        original_digest = ingested.info.get("sha256")  # of exactly these bytes (the file, or the upload)
        # The upload for ONNX Runtime with its weights read from memory (no second parse, no copies).
        original_in_memory = None
        if ingested.proto is not None and (options.validate_outputs or options.measure_latency):
            original_in_memory = InMemoryModel.from_proto(ingested.proto, ingested.model)
        if ingested.info.get("ir_version_lowered_from"):  # ONNX Runtime refuses the file as uploaded
            original_source, original_digest = self._model_source(ingested.model), None
            original_in_memory = None
        stage_seconds["ingest"] = time.perf_counter() - start
        nodes_before = _op_counts(ingested.model)
        # Metrics naming outputs the model lacks, and an int8-only target without samples: refused before work.
        check_outputs(options.accuracy, _output_shapes(ingested.model))
        check_calibration_source(options, self.target, has_samples=calibration is not None)
        # Calibration samples are the user's to fix: refused here, before any compiling, when they do not fit.
        samples = self._calibration_samples(ingested.model, options, calibration)
        report_progress.finish("ingest")

        # Stage 2, Shape Tracker: symbolic shapes with named dims; buckets from the request or the target.
        report_progress("shapes", 0.0, "inferring shapes")
        start = time.perf_counter()
        tracker = ShapeTracker(ingested.model)
        if options.input_shapes:
            tracker.apply_input_shapes(options.input_shapes)
        shape_report = tracker.infer()
        refuse_impossible_tensors(ingested.model)  # 10^12-element Expand: refused before anything allocates
        # Without shape_buckets, observed_shapes (traffic) decide the buckets: least expected padded cost.
        traffic = {"observed": options.observed_shapes, "max_buckets": options.max_buckets}
        buckets = tracker.buckets(options.shape_buckets, self.target, **traffic)
        check_buckets(tracker, buckets)  # a bucket the model cannot run is the user's to fix: refuse it now
        check_precision_request(options, self.target, buckets=len(buckets))
        stage_seconds["shapes"] += time.perf_counter() - start
        report_progress.finish("shapes")

        # One source of shapes: the dims no bucket fixes take the Shape Tracker's representative values (held
        # to the memory budget, where the model runs), for the costing, the memory plan and validation alike.
        plan = _free_dims_plan(tracker, buckets, shape_report)
        cost_model = CostModel(
            self.target, cache=cache, calibrate=options.calibrate and self.target.calibrated, dims=plan.dims
        )
        cost_model.memory_budget_bytes = plan.budget_bytes
        disabled = frozenset(options.disabled_rules)
        # The pipeline again with other rewrites switched off: what the bisections below call.
        recompile = functools.partial(
            self._compile, tracker, buckets, options, cost_model=cost_model, progress=report_progress
        )
        comp = self._loadable(recompile, disabled, rollbacks := [])
        for stage in ("passes", "fusion", "memory"):
            report_progress.finish(stage)

        # Stage 8, validate: every bucket against the original; on a mismatch, bisect and roll back.
        validation: list[dict] = []
        reference_cache = _References(original_source, options.seed, original_digest, original_in_memory)
        if options.validate_outputs:
            start = time.perf_counter()
            comp, validation = self._validated(
                comp, original_source, options, rollbacks, reference_cache, recompile, report_progress
            )
            stage_seconds["validate"] = time.perf_counter() - start  # a bisection's recompiles included
        report_progress.finish("validate")

        # Padding: whether a request smaller than its bucket may be padded up to it (mask, causal, batch rows)
        # or must be served at a bucket's exact size; the manifest tells the runtime which (padding_check).
        start = time.perf_counter()
        padding = check_padding(
            reference_cache.runtime, _proto_without_weights(tracker.model), tracker.manifest(),
            shape_report.as_dict()["outputs"], seed=options.seed,
            tolerances={k: (v.atol, v.rtol) for k, v in (options.tolerances or {}).items()},
        )  # fmt: skip
        stage_seconds["padding_check"] = time.perf_counter() - start

        # Never slower (cpu-ort, where the output runs here): time both, drop rewrites that cost time.
        latency = None
        if options.measure_latency:
            report_progress("measure", 0.0, "timing original and optimised models in ONNX Runtime")
            start = time.perf_counter()
            comp, latency = self._never_slower(
                comp, original_source, options, rollbacks, reference_cache, recompile, report_progress, cache
            )
            stage_seconds["measure"] = time.perf_counter() - start
        report_progress.finish("measure")

        # Precision: the verified, timed fp32 result quantised (cpu-ort) or halved (accelerators), judged by the
        # accuracy target on the calibration samples; never slower than fp32, never below the target.
        precision, precision_samples, precision_runs = None, None, {}
        if options.precision != "fp32":
            report_progress("precision", 0.0, f"{options.precision}: calibrating, scoring and timing")
            start = time.perf_counter()
            comp, precision, precision_samples, precision_runs = self._precision(
                comp, original_source, options, samples, recompile, report_progress, cache
            )
            stage_seconds["precision"] = time.perf_counter() - start

        # Vendor toolchain (accelerators, where it installs): compile each bucket with the vendor's own
        # compiler at the requested precision (its quantiser calibrated on the same samples as ours), run it
        # in the vendor's simulator/emulator, compare with the original, and hold our predicted placement
        # against the vendor's.
        toolchain_report, toolchain_files, vendor, exploration = {}, {}, None, None
        if isinstance(self.adapter, AcceleratorAdapter):
            report_progress("toolchain", 0.0, "compiling with the vendor toolchain")
            start = time.perf_counter()
            # Exploration scored by the vendor's own estimate, the vendor alone beside it (where it gives one):
            # forms only its compiler can judge, never worse than the original compiled by the vendor alone.
            exploration = explore(
                self.target, self.adapter, comp.buckets, original_source, root=self.toolchain_root,
                workdir=workdir, cache=cache, progress=lambda f, m: report_progress("toolchain", 0.6 * f, m),
                precision={**(precision or {}), "requested": options.precision},
                accuracy=options.accuracy, **_user_samples(precision_runs),
                traffic=_traffic_request(options, buckets),
            )  # fmt: skip
            if exploration is not None:
                comp, validation = self._explored(
                    comp, exploration, original_source, options, reference_cache, validation, cost_model
                )
            compile_final = functools.partial(
                run_toolchain, self.target, self.adapter, partition=comp.partition, original_source=original_source,
                root=self.toolchain_root, seed=options.seed, workdir=workdir,
                precision={**(precision or {}), "requested": options.precision},
                # The vendor's quantiser calibrates on the part of the samples ours calibrated on; its simulator is
                # judged on the part held out (the bundle's calibration.npz keeps them all, for the user's run).
                calibration={name: r.calibration or r.samples for name, r in precision_runs.items()} or None,
                accuracy=options.accuracy, held_out={name: r.judged for name, r in precision_runs.items()},
            )  # fmt: skip
            toolchain_report, toolchain_files = compile_final(
                comp.buckets, bucket_options=exploration.bucket_options if exploration else None
            )
            if exploration is not None and not toolchain_report.get("ran") and toolchain_report.get("failed"):
                # Never worse than the vendor alone: our form crashed the vendor's final build; the original does not.
                comp, exploration = self._vendor_fallback(comp, exploration, toolchain_report["failed"])
                toolchain_report, toolchain_files = compile_final(comp.buckets)
            if exploration is not None:
                vendor = vendor_section(self.target, self.adapter, exploration, toolchain_report)
            stage_seconds["toolchain"] = time.perf_counter() - start
            if precision is not None and precision.get("vendor_quantiser"):
                toolchain_files = self._vendor_verdicts(
                    precision, precision_runs, toolchain_report, toolchain_files, vendor=vendor
                )

        # Every ONNX Runtime run of the original is done: its in-memory copy (for a model whose weights are
        # Constant nodes, the whole upload again), the reference outputs and the arrays kept for sessions go
        # before the artifacts are serialised, where the job's memory peaks.
        original_in_memory = None
        reference_cache.release()
        release_arrays()

        # Stage 7, platform adapter: target-ready files per bucket plus the manifest.
        report_progress("adapter", 0.0, "generating artifacts")
        stage_seconds.update(comp.stage_seconds)
        report = build_report(
            target=self.target,
            options=options,
            ingested=ingested,
            nodes_before=nodes_before,
            comp=comp,
            shape_report=shape_report.as_dict(),
            shape_manifest=tracker.manifest(),
            validation=validation,
            rollbacks=rollbacks,
            latency=latency,
            cache_stats=cache.stats.as_dict(),
            stage_seconds=dict(stage_seconds),
            total_seconds=time.perf_counter() - started,
            shape_notes=reference_cache.notes,
        )
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
        if int8_only(self.target) and calibration is None:  # allowed only by allow_synthetic_calibration
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
        # The one speed-up every surface shows, from the best source for this target, named with it.
        report["headline"] = headline(report)
        files = self.adapter.generate(comp.buckets, self.target, report, workdir=workdir)
        artifacts: dict[str, bytes | Path] = {**files, **toolchain_files}
        if precision is not None and precision.get("vendor_quantiser"):
            first = comp.buckets[0].name
            artifacts["calibration.npz"] = samples_npz(precision_samples[first])
            artifacts.update(samples_dataset(precision_samples[first]))
            for name, bucket_samples in list(precision_samples.items())[1:]:  # each further bucket at its shapes
                artifacts[f"calibration.{name}.npz"] = samples_npz(bucket_samples)
                artifacts.update(samples_dataset(bucket_samples, bucket=name))
        artifacts["report.json"] = json.dumps(report, indent=2, default=str).encode()
        artifacts["fusion_plan.json"] = json.dumps(comp.fusion_plans, indent=2, default=str).encode()
        # Last, over the whole bundle: every file with its role, how to load it and its checksum (the deploy
        # contract flexdsa_runtime reads).
        artifacts["manifest.json"] = complete_manifest(artifacts, report, self.target)
        report_progress.finish("adapter")
        report_progress("report", 1.0, "done")
        serialized = {b.name: kept_bytes(b.model) for b in comp.buckets}
        serialized = {name: data for name, data in serialized.items() if data is not None}
        return OptimizeResult(self.target, comp.buckets, artifacts, report, workdir, serialized)

    # ------------------------------------------------------------------ helpers for optimize
    _scratch: Path | None = None

    def _describe(self, comp: Compilation, bucket: BucketModel, cost_model: CostModel) -> None:
        """Memory plan, partition and estimates of a bucket whose model changed after ``_compile``."""
        comp.memory[bucket.name] = plan_memory(bucket.model, dims=bucket.at).as_dict()
        mapping = SubgraphMapper(self.target, self.adapter, cost_model, cost_model.cache).map(bucket.model)
        comp.partition[bucket.name] = mapping.as_dict()
        cost = cost_model.graph_cost(bucket.model)
        estimates = dict(comp.estimates.get(bucket.name) or {})
        estimates["after"] = cost.as_dict()
        estimates["on_target"] = target_estimate(self.target, mapping, cost, comp.memory[bucket.name])
        comp.estimates[bucket.name] = estimates

    def _explored(self, comp, exploration, original_source, options, references, validation, cost_model):
        """The buckets exploration chose: a changed model is validated against the original again (and kept
        only if it holds: else the bucket goes back to our plain model, said in the decision); a bucket that
        ships the original model is the original, so nothing of ours is left in it to validate."""
        chosen = {b.name: b for b in exploration.buckets}
        if options.validate_outputs and exploration.changed:
            changed = copy.copy(comp)
            changed.buckets = [chosen[b.name] for b in comp.buckets if b.name in exploration.changed]
            results = {r.bucket: r for r in self._validate_buckets(changed, original_source, options, references)}
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
                self._describe(comp, bucket, cost_model)
        for name in exploration.original:
            part = comp.partition.get(name)
            if part is not None:
                part.setdefault("notes", []).append(
                    "this bucket ships the original model (see report.vendor): the partition above is our prediction "
                    "for our model; the vendor's own placement of the original is under toolchain.buckets"
                )
        return comp, validation

    def _vendor_fallback(self, comp, exploration, failure: str):
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

    def _calibration_samples(self, model: ir.Model, options: OptimizeOptions, calibration) -> list[dict] | None:
        if options.precision == "fp32":
            return None
        inputs = _proto_without_weights(model)
        if calibration is None:
            return None
        arrays = calibration if isinstance(calibration, dict) else load_calibration(calibration)
        return check_calibration(inputs, arrays)

    def _precision(self, comp, original_source, options, samples, recompile, progress, cache=None):
        """Every shape bucket at the requested precision, each calibrated and judged at its own shapes: on the
        user's samples where they fit the bucket, else on synthetic inputs with a warning naming the bucket
        (samples that fit no bucket are refused). The report's ``precision`` section is the first bucket's,
        with ``buckets`` holding each bucket's when there are several."""
        per_bucket = self._bucket_samples(comp.buckets, options, samples)
        vendor = int8_format(self.target)
        cpu_formats = options.precision in ("int8", "mixed") and vendor is not None and vendor.vendor is None
        fp32_models, unfused_models = [b.model for b in comp.buckets], [None] * len(comp.buckets)
        if cpu_formats:
            # ONNX Runtime's offline layout pass (NCHWc, its internal fusions) is for the float graph; the
            # quantiser takes ours, and ONNX Runtime fuses the quantised graph itself when it loads it.
            fp32_models = [b.model for b in recompile(frozenset(comp.disabled | {"ort_layout"})).buckets]
            # The same model without the fusions whose com.microsoft ops hold weights the QDQ quantiser
            # leaves in float: quantising before them may be faster (measured, as a candidate).
            opaque = {r.name for r in self.rules if set(r.produces) & QDQ_OPAQUE_WEIGHT_OPS}
            if opaque & set(comp.applied):
                unfused_models = [
                    b.model for b in recompile(frozenset(comp.disabled | opaque | {"ort_layout"})).buckets
                ]
        sections, runs, models = {}, {}, []
        for index, bucket in enumerate(comp.buckets):
            bucket_samples, synthetic, misfit = per_bucket[bucket.name]
            folder = Path(tempfile.mkdtemp(prefix=f"precision-{index}-", dir=self._scratch))
            run = PrecisionRun(
                options, self.target, original_source, fp32_models[index], bucket_samples, synthetic, folder,
                unfused_models[index], progress, cache,
            )  # fmt: skip
            model, section = apply_precision(run)
            section["bucket"] = bucket.name
            if misfit:
                section["warnings"].append(
                    f"your calibration samples do not fit shape bucket {bucket.name!r} ({misfit}): it was "
                    "calibrated and judged on synthetic inputs at its shapes; upload samples at those shapes"
                )
            models.append(model)
            sections[bucket.name], runs[bucket.name] = section, run
        section = dict(sections[comp.buckets[0].name])
        if len(comp.buckets) > 1:
            section["buckets"] = sections
            section["warnings"] = [f"[{name}] {w}" for name, s in sections.items() for w in s["warnings"]]
            section["shipped"] = {name: s.get("shipped") for name, s in sections.items()}
        if any(model is not None for model in models):
            comp = copy.copy(comp)
            comp.buckets = [
                replace_model(bucket, model) if model is not None else bucket
                for bucket, model in zip(comp.buckets, models, strict=True)
            ]
        samples_by_bucket = {name: run.samples for name, run in runs.items()}
        return comp, section, samples_by_bucket, runs

    @staticmethod
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

    def _bucket_samples(self, buckets, options, samples) -> dict[str, tuple[list[dict], bool, str | None]]:
        """Per bucket: (calibration samples, synthetic?, why the user's do not fit it). The user's samples where
        they fit the bucket's shapes."""
        found, refusals = {}, []
        for bucket in buckets:
            inputs = _proto_without_weights(bucket.model)
            if samples is None:
                found[bucket.name] = (synthetic_samples(inputs, seed=options.seed), True, None)
                continue
            stacked = {name: np.concatenate([s[name] for s in samples]) for name in samples[0]}
            try:  # a bucket fixes dims the samples must have too (seq 128 on an accelerator)
                found[bucket.name] = (check_calibration(inputs, stacked), False, None)
            except CalibrationError as err:
                refusals.append((bucket.name, err))
                found[bucket.name] = (synthetic_samples(inputs, seed=options.seed), True, err.message.rstrip("."))
        if samples is not None and len(refusals) == len(buckets):
            name, err = refusals[0]
            raise CalibrationError(
                f"{err.message.rstrip('.')} (shape bucket {name!r}). Give samples at the bucket's "
                "shapes, or shape_buckets that match the samples.",
                details={**err.details, "bucket": name},
            ) from None
        return found

    def _runtime(self, model: ir.Model) -> bytes | Path | InMemoryModel:
        """What ONNX Runtime loads a finished model from: its weights read from memory, or for models with
        external data a file written with its data."""
        if not needs_external_data(model):
            return InMemoryModel.from_ir(model)
        return self._model_source(model)

    def _model_source(self, model: ir.Model) -> bytes | Path:
        """What ONNX Runtime loads: bytes, or for models with external data a file written with its data."""
        if not needs_external_data(model):
            return model_bytes(model)  # once per finished model (``serialized``)
        folder = Path(tempfile.mkdtemp(prefix="validate-", dir=self._scratch))
        return save_model(model, folder / "model.onnx")[0]

    def _validate_buckets(self, comp, original_source, options, references) -> list:
        """Every bucket's outputs against the original's at the bucket's one shape (``BucketModel.at``); a
        bucket whose dims stay symbolic is checked at a second, small shape too (batch 2, other dims 8), so
        a rewrite that holds at one size only is caught."""
        tolerances = {k: (v.atol, v.rtol) for k, v in (options.tolerances or {}).items()}
        results = []
        for bucket in comp.buckets:
            shapes = self._bucket_inputs(comp, bucket, references, second=True)
            optimized = self._runtime(bucket.model)
            if len(shapes) > 1:  # one load for both shapes (a load fails like a run: in compare, as before)
                try:
                    optimized = session(optimized)
                except Exception:  # noqa: BLE001 - compare reports ORT's refusal with its words
                    pass
            checked = [
                compare(original_source, optimized, feeds, bucket=bucket.name, tolerances=tolerances, reference=reference)
                for feeds, reference in shapes
            ]  # fmt: skip
            first = checked[0]
            if len(checked) > 1:
                first.second_shape = checked[1]
                first.ok = first.ok and checked[1].ok
            results.append(first)
        return results

    @staticmethod
    def _bucket_inputs(comp, bucket, references: _References, *, second: bool) -> list[tuple[dict, dict]]:
        """``references.inputs`` for ``bucket``; where the original refused the costed shape and ran at a
        lower one, the bucket's shape and memory plan follow it."""
        dims, shapes = references.inputs(bucket, second=second)
        if dims != bucket.at:
            bucket.at = dims
            comp.memory[bucket.name] = plan_memory(bucket.model, dims=dims).as_dict()
        return shapes

    def _validated(self, comp, original_source, options, rollbacks, references, recompile, progress):
        progress("validate", 0.0, "comparing outputs with the original in ONNX Runtime")
        results = self._validate_buckets(comp, original_source, options, references)
        if all(r.ok for r in results):
            return comp, [r.as_dict() for r in results]
        failure = "; ".join(f"[{r.bucket}] {r.describe_failure()}" for r in results if not r.ok)
        if options.allow_mismatch:
            return comp, [r.as_dict() for r in results]
        if not options.rollback_on_mismatch:
            raise ValidationFailedError(f"Optimised outputs differ from the original: {failure}")

        def numerics_ok(candidate: Compilation) -> bool:
            return all(r.ok for r in self._validate_buckets(candidate, original_source, options, references))

        for _ in range(MAX_ROLLBACKS):
            progress("validate", 0.5, "bisecting the rewrite that broke the numerics")
            culprit, comp = self._bisect(comp, numerics_ok, recompile)
            if culprit is None:
                raise ValidationFailedError(
                    "Optimised outputs differ from the original and switching off every rewrite did not restore "
                    f"them: {failure}"
                )
            rollbacks.append({"rewrite": culprit, "reason": "numerics", "detail": failure})
            results = self._validate_buckets(comp, original_source, options, references)
            if all(r.ok for r in results):
                return comp, [r.as_dict() for r in results]
            failure = "; ".join(f"[{r.bucket}] {r.describe_failure()}" for r in results if not r.ok)
        raise ValidationFailedError(
            f"Optimised outputs still differ after {MAX_ROLLBACKS} rollbacks: {failure}"
        )

    def _loadable(self, recompile, disabled: frozenset[str], rollbacks: list[dict]):
        """The first compile whose every bucket ONNX Runtime loads: a rewrite that makes an unloadable graph
        (or breaks a later stage) is found by bisection (``_bisect`` counts such a variant as bad), switched
        off and recorded (``invalid_graph``)."""
        for _ in range(MAX_ROLLBACKS + 1):
            try:
                return recompile(disabled)
            except UnloadableGraph as failure:
                culprit, _ = self._bisect(failure.comp, lambda compiled: True, recompile)
                if culprit is None:
                    if failure.error is not None:
                        raise failure.error from None
                    raise InternalGraphError(
                        f"the optimised graph does not load in ONNX Runtime ({failure.stage}: {failure.reason}) "
                        "and switching off every rewrite did not fix it"
                    ) from None
                rollbacks.append({"rewrite": culprit, "reason": "invalid_graph",
                                  "detail": f"{failure.stage}: {failure.reason}"})  # fmt: skip
                disabled = frozenset(disabled | {culprit})
        raise InternalGraphError(f"the optimised graph still does not load after {MAX_ROLLBACKS} rollbacks")

    def _bisect(self, comp, is_good, recompile):
        """Find one applied rewrite whose removal makes ``is_good`` hold.

        Invariant: switching off ``applied[:hi]`` is good and ``applied[:lo]`` is bad; the culprit is
        ``applied[hi-1]`` once ``hi == lo + 1``. Returns (culprit, compilation without it) or (None, comp).
        """
        applied = list(comp.applied)
        base = set(comp.disabled)
        recompile = functools.partial(_loadable_or_none, recompile)
        everything = recompile(frozenset(base | set(applied)))
        if not applied or everything is None or not is_good(everything):  # None: a variant that does not load
            return None, comp
        lo, hi = 0, len(applied)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            candidate = recompile(frozenset(base | set(applied[:mid])))
            if candidate is not None and is_good(candidate):
                hi = mid
            else:
                lo = mid
        culprit = applied[hi - 1]
        without = recompile(frozenset(base | {culprit}))
        return (culprit, without) if without is not None else (None, comp)

    def _never_slower(self, comp, original_source, options, rollbacks, references, recompile, progress, cache=None):
        """Time original and optimised side by side (paired rounds, a confidence bound: ``significance``);
        while the optimised model is significantly slower, bisect the rewrite that costs time and switch it
        off. Still slower at the end: ship the fastest verified variant measured on the way, unless the
        user allowed a slower model (``allow_slower``); either way a warning says so.

        A comparison that did not find the optimised model slower is kept in the kernel cache under the
        two models' bytes (sha256), the inputs, the rounds and this machine, like a kernel measurement: the
        same two models compared again (a second job on this model, a bisection's variant met twice) are
        not timed again. A slower verdict is never kept, so that every rollback rests on fresh timings."""
        bucket = comp.buckets[0]
        # The bucket's one shape (``BucketModel.at``), the inputs validation used: the shape its fusions were
        # costed at, not a toy size.
        feeds = self._bucket_inputs(comp, bucket, references, second=False)[0][0]
        # Weights in external data: one session at a time, or the measurement holds the model in memory twice.
        interleave = not needs_external_data(bucket.model)
        rounds = max(options.latency_repeats, MIN_ROUNDS)
        # Every variant timed, for the fastest-variant fallback.
        tried: list[tuple[Comparison, Compilation]] = []

        reused: set[int] = set()  # ids of comparisons read from the cache, for the report
        # Each model's bytes hashed once; the latest few held (so their ids stay theirs), as ``serialized`` does.
        hashed: OrderedDict[int, tuple[bytes | Path, str]] = OrderedDict()
        if references.digest is not None and references.original_source is original_source:
            hashed[id(original_source)] = (original_source, references.digest)

        def digest(source: bytes | Path) -> str:
            if id(source) not in hashed or hashed[id(source)][0] is not source:
                hashed[id(source)] = (source, _sha256(source))
                while len(hashed) > 4:
                    hashed.popitem(last=False)
            return hashed[id(source)][1]

        def timings(candidate: Compilation, against: Compilation | None = None) -> Comparison:
            """``candidate`` timed against the original, or against another variant (``against``)."""
            models = {
                "original": self._model_source(against.buckets[0].model) if against else original_source,
                "optimized": self._model_source(candidate.buckets[0].model),
            }
            digests = {name: digest(source) for name, source in models.items()}
            # Against the original only "slower?" decides anything; the fastest-variant switch needs "faster".
            question = "slower" if against is None else "both"
            key = _comparison_key(self.target, digests, feeds, rounds, interleave, question)
            comparison = _cached_comparison(cache, key)
            if comparison is not None:
                reused.add(id(comparison))
            else:
                loaded = None
                if interleave:  # both loaded with their weights read from memory, where they can be
                    loaded = {
                        "original": InMemoryModel.from_ir(against.buckets[0].model) if against else references.in_memory,
                        "optimized": InMemoryModel.from_ir(candidate.buckets[0].model),
                    }
                    loaded = {name: model for name, model in loaded.items() if model is not None}
                comparison = _sequential_comparison(
                    models, feeds, rounds, interleave, self.clock, question, in_memory=loaded
                )
                # As the kernel cache will hold it (rounded): a later job reading it decides the same.
                comparison = Comparison.from_dict(comparison.as_dict())
                if comparison.verdict != "slower" and cache is not None:
                    cache.put(key, json.dumps(comparison.as_dict()).encode())
            if against is None:
                tried.append((comparison, candidate))
            return comparison

        def verified(candidate: Compilation) -> bool:
            return not options.validate_outputs or all(
                r.ok for r in self._validate_buckets(candidate, original_source, options, references)
            )

        measured = timings(comp)
        warnings: list[str] = []
        if options.never_slower and self.target.calibrated:
            attempts = 0
            while measured.verdict == "slower" and attempts < MAX_ROLLBACKS:
                attempts += 1
                # Re-measure once before acting: one slow sample is noise, two are a finding.
                measured = timings(comp)
                if measured.verdict != "slower":
                    break
                progress("measure", 0.5, "optimised model is slower: bisecting the rewrite that costs time")
                culprit, candidate = self._bisect(comp, lambda c: timings(c).verdict != "slower", recompile)
                if culprit is None or not verified(candidate):
                    break
                rollbacks.append({"rewrite": culprit, "reason": "latency", "detail": _slower_text(measured)})
                comp = candidate
                measured = timings(comp)
            if measured.verdict == "slower" and not options.allow_slower:
                comp, measured = self._fastest_verified(comp, measured, tried, verified, timings, rollbacks)
        slower = measured.verdict == "slower"
        # On an accelerator this CPU's timing is a check of the graph here, not the part's latency: no warning
        # that would read as the device's (the figure stays in report.json's latency, labelled).
        if slower and self.target.calibrated:
            allowed = " (allowed by allow_slower)" if options.allow_slower else ""
            warnings.append(
                f"the optimised model is slower than the original on this machine{allowed}: {_slower_text(measured)}"
                + ("" if options.allow_slower else "; no verified variant was as fast")
            )
        return comp, {
            "measured": True,
            # These two models' comparison on this machine, read from the kernel cache (not timed again).
            "from_kernel_cache": id(measured) in reused,
            "slower_than_original": slower,
            "note": "optimised model measured slower than the original; see warnings" if slower else None,
            "warnings": warnings,
            "engine": "onnxruntime CPUExecutionProvider",
            "graph_optimization_level": "ORT_ENABLE_ALL",
            "intra_op_threads": 1,
            "repeats": measured.rounds,
            "interleaved": interleave,
            "bucket": bucket.name,
            "input_shapes": {k: list(v.shape) for k, v in feeds.items()},
            "before_s": measured.first_s,
            "after_s": measured.second_s,
            "speedup": measured.first_s / measured.second_s if measured.second_s else None,
            "comparison": measured.as_dict(),
        }

    def _fastest_verified(self, comp, measured, tried, verified, timings, rollbacks):
        """Of the variants timed during the bisection (the one with every rewrite off among them), the one
        with the lowest time ratio to the original, if it validates and is significantly faster than ``comp``
        timed side by side with it (else ``comp``: a variant within noise of it is no reason to change)."""
        others = [pair for pair in tried if pair[1] is not comp and pair[0].ratio < measured.ratio]
        if not others:
            return comp, measured
        comparison, candidate = min(others, key=lambda pair: pair[0].ratio)
        against_current = timings(candidate, against=comp)
        if against_current.verdict != "faster" or not verified(candidate):
            return comp, measured
        switched_off = sorted(set(candidate.disabled) - set(comp.disabled))
        rollbacks.append(
            {
                "rewrite": ", ".join(switched_off),
                "reason": "latency",
                "detail": f"still slower ({_slower_text(measured)}); shipped the fastest verified variant "
                f"(time ratio {comparison.ratio:.3f}, {against_current.ratio:.3f} of the variant it replaced)",
            }
        )
        return candidate, comparison


def _traffic_request(options: OptimizeOptions, buckets) -> dict | None:
    """Observed traffic and each bucket's dims, for the vendor's expected cost per request (``vendor_explore``)."""
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


def _loadable_or_none(recompile, switched_off: frozenset[str]) -> Compilation | None:
    """``recompile(switched_off)``, or None where that variant does not load in ONNX Runtime (``_bisect``)."""
    try:
        return recompile(switched_off)
    except UnloadableGraph:
        return None


def _sha256(source: bytes | Path) -> str:
    if isinstance(source, Path):
        digest = hashlib.sha256()
        with open(source, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        return digest.hexdigest()
    return hashlib.sha256(source).hexdigest()


def _comparison_key(
    target: TargetSpec,
    digests: dict,
    feeds: dict,
    rounds: int,
    interleave: bool,
    question: Question = "slower",
) -> str:
    """What a whole-model comparison's verdict rests on: both models' bytes (``digests``: name -> sha256),
    the inputs' shapes and values, the rounds asked for, the question its early stop answered, the runtime
    and this machine."""
    canonical = {
        "model_comparison": dict(sorted(digests.items())),
        "feeds": {name: [list(a.shape), a.dtype.name, hashlib.sha256(a.tobytes()).hexdigest()]
                  for name, a in sorted(feeds.items())},  # fmt: skip
        "rounds": rounds,
        "min_effect": MODEL_MIN_EFFECT,
        "interleave": interleave,
        "question": question,
        "runtime": {"ort": ort.__version__, "level": "all", "threads": 1},
        "machine": machine_fingerprint(),
    }
    return kernel_key(canonical, target.name, target.version, __version__)


def _cached_comparison(cache, key: str) -> Comparison | None:
    if cache is None:
        return None
    try:
        raw = cache.get(key)
        return Comparison.from_dict(json.loads(raw)) if raw is not None else None
    except Exception:  # noqa: BLE001 - a broken cache is a cache that misses
        return None


# Rounds at which a whole-model comparison may stop before ``rounds`` (``significance.settled_early``, 99%).
MODEL_EARLY_LOOKS = (MIN_ROUNDS, 14)


def _sequential_comparison(
    models,
    feeds,
    rounds: int,
    interleave: bool,
    clock: ModelClock,
    question: Question = "slower",
    *,
    in_memory: dict | None = None,
) -> Comparison:
    """Paired rounds of ``models['optimized']`` against ``models['original']``, each loaded once for the
    whole comparison. Stops at a look of ``MODEL_EARLY_LOOKS`` when the answer to ``question`` is already
    plain (``significance.settled_early``: "slower?" for the never-slower check, where a model at 0.98x
    need not be timed until "faster" is settled too), else runs ``rounds``; while the interval still straddles the
    slower-threshold, more rounds in the same sessions (up to 8x, ~3 s): a verdict near the threshold settles
    on the truth instead of following the noise of one short measurement. Each comparison opens its own
    sessions, so that the re-measurement before a rollback is independent of the first (a session's
    memory placement can bias all of its runs alike)."""
    if not interleave:  # weights in external data: one model in memory at a time, sessions not kept
        samples = clock.samples(models, feeds, repeats=rounds, interleave=False)

        def more(count: int) -> None:
            extra = clock.samples(models, feeds, repeats=count, interleave=False)
            for name in samples:
                samples[name].extend(extra[name])
    else:
        timer = clock.rounds(models, feeds, in_memory=in_memory) if in_memory else clock.rounds(models, feeds)
        samples = timer.more(MIN_ROUNDS)
        for look in (*MODEL_EARLY_LOOKS[1:], rounds):
            done = len(samples["original"])
            settled = settled_early(
                samples["original"], samples["optimized"], min_effect=MODEL_MIN_EFFECT, question=question
            )
            if settled or done >= rounds:
                break
            samples = timer.more(min(look, rounds) - done)

        def more(count: int) -> None:
            timer.more(count)

    started = time.perf_counter()
    while True:
        comparison = paired(samples["original"], samples["optimized"], min_effect=MODEL_MIN_EFFECT)
        threshold = 1.0 + MODEL_MIN_EFFECT
        settled = comparison.verdict != "tie" or not comparison.low <= threshold <= comparison.high
        if settled or comparison.rounds >= 8 * rounds or time.perf_counter() - started > 3.0:
            return comparison
        more(rounds)


def _slower_text(comparison: Comparison) -> str:
    low, high = comparison.low, comparison.high
    return (
        f"optimised {comparison.second_s * 1e3:.3f} ms vs original {comparison.first_s * 1e3:.3f} ms, time ratio "
        f"{comparison.ratio:.3f} (95% interval {low:.3f}-{high:.3f} over {comparison.rounds} paired rounds)"
    )


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


def _proto_without_weights(model: ir.Model) -> onnx.ModelProto:
    """The graph's inputs and Gather tables' shapes, enough to build validation inputs, without copying weights."""
    proto = onnx.ModelProto()
    graph = proto.graph
    for value in model.graph.inputs:
        graph.input.append(ir.serde.serialize_value(value))
    for name, init in model.graph.initializers.items():
        tensor = graph.initializer.add()
        tensor.name = name
        if init.shape is not None:
            tensor.dims.extend(int(d) for d in init.shape)
    for node in model.graph:
        if node.op_type == "Gather" and node.domain == "":
            copy = graph.node.add()
            copy.op_type = "Gather"
            copy.input.extend(v.name if v is not None else "" for v in node.inputs)
            axis = node.attributes.get("axis")
            if axis is not None:
                copy.attribute.append(onnx.helper.make_attribute("axis", axis.as_int()))
    return proto
