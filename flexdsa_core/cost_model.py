"""The cost model: what one kernel (one ONNX node) costs on a target, in FLOPs, bytes, seconds and joules.

Work per op (FLOPs and bytes moved) comes from the registry in ``op_costs.py`` (``@op_cost("MatMul")``,
one short function per op, each returning a ``Cost``); this module turns work into seconds and joules,
with the timing pieces of ``kernel_timing.py`` where it measures.

Seconds and joules, per kernel:

* vendor targets (a roofline estimate from the ``TargetSpec``)::

      seconds = max(flops / peak_ops_per_s[dtype], bytes / mem_bandwidth_bytes_per_s) + launch_overhead_s
      joules  = power_w * (flops / peak + bytes / bandwidth + launch_overhead_s)

  The energy line charges the module's power for the compute and for the memory traffic separately (the
  sources give no split of power between them), so it is an upper-bound estimate. A figure the spec
  leaves ``None`` is never guessed: its term is left out and ``CostModel.notes`` says so; with no
  ``power_w`` there is no energy estimate at all (``joules`` is ``None``: unavailable).

* ``cpu-ort`` (``target.calibrated``): measured. The node is cut out into a one-node model (same op,
  domain, opset, attributes, input shapes and dtypes; constant inputs kept as initializers so ONNX
  Runtime pre-packs them as it would in the real model) and run in ONNX Runtime here: one intra-op
  thread, sequential execution, ``ORT_ENABLE_BASIC`` (a single node has nothing to fuse, and the NCHWc
  layout pass of ``ORT_ENABLE_ALL`` would wrap one Conv in reorders that a real graph amortises),
  inputs and outputs bound once (IOBinding). Each run is timed in CPU time of the calling thread (a
  one-thread session runs its kernels there): time spent preempted on a busy shared machine does not
  count, memory contention still does. Of 5 to 50 runs (within ``measure_budget_s``) the figure is
  the median of the faster half (the lower quartile), less the same figure for an empty run (the
  Python and session overhead a real graph does not pay per node), plus ``launch_overhead_s`` (what a
  real graph does pay per node). The plain median is cached alongside. A choice between two node sets
  is timed side by side (``compare_paired``), both sets and the empty run interleaved round by round (the
  empty run's cost moves with the machine's state, so it is taken from the same rounds), and judged with
  a confidence bound (``significance.py``). The clock is injectable (``timer``): tests hand in a noisy one.
  Fused kernels are the reason to measure: at [1,128,768] ONNX Runtime 1.31's CPU
  SkipLayerNormalization is several times slower than Add + LayerNormalization, while BiasGelu and
  SimplifiedLayerNormalization are faster than their unfused forms, whatever a roofline says.
  A node that cannot be measured alone (control flow, a shape-tensor input that is not constant, an op
  ONNX Runtime refuses) falls back to a roofline built on this host's measured SGEMM peak and copy
  bandwidth, and is counted as estimated, not measured.

Every measurement goes through the ``KernelCache``: the key is ``kernel_key(canonical, target,
compiler_version)`` (the target's name, version and the hash of its whole spec) where ``canonical`` holds
op, domain, opset, attributes, input shapes/dtypes/constness, the values of small integer constants (they
are shapes and axes, not weights), the ONNX Runtime version and settings, and a fingerprint of this CPU:
never weight values. Identical
layers in one model, and across jobs sharing a cache, are measured once. ``CostModel.stats`` counts
hits, misses and the measuring time hits saved.

Symbolic dims are specialised before costing: a dim named in ``dims`` (the Shape Tracker's plan,
``shape_plan``: the optimizer passes every open dim's value) takes that value; any other takes
``shape_plan.open_dim_value``: a batch dim (``batch``, ``batch_size``, ``N``, ``B``...) and an anonymous
leading dim become 1, any other symbolic dim 128, stepped down ``shape_plan.LOWERED`` where a probe's nodes
refuse it. The whole graph's shapes come from ONNX shape inference at those values
(``shape_plan.static_shapes``, nothing allocated); only what it leaves open is probed by running nodes,
never with a dim nobody could size (reported unknown) nor with inputs over ``memory_budget_bytes``.

Over 500 lines because ``CostModel`` keeps, for one job, the shapes it costs at, the kernel cache and
the side-by-side comparisons that all decisions share; the work per op is in ``op_costs.py`` and the
timing pieces are in ``kernel_timing.py``.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from flexdsa_core.cache import CacheStats, KernelCache, LRUCache, kernel_key
from flexdsa_core.cost import Cost
from flexdsa_core.in_memory import EXTERNAL_MIN_BYTES, declare, session_with, weight_constant
from flexdsa_core.kernel_timing import (
    LEVELS,
    ProbeTooLarge,
    Timer,
    bound_runner,
    empty_runner,
    host_rates,
    machine_fingerprint,
    random_array,
    session_options,
    single_node_session,
    steady,
    thread_empty_runner,
    time_beside_empty,
    timed,
)
from flexdsa_core.op_costs import OpView, TensorInfo, work
from flexdsa_core.ort_runs import guarded_run
from flexdsa_core.shape_plan import (
    LOWERED,
    REPRESENTATIVE_BATCH,
    REPRESENTATIVE_DIM,
    open_dim_value,
    static_shapes,
)
from flexdsa_core.significance import (
    KERNEL_MIN_EFFECT,
    MIN_ROUNDS,
    Comparison,
    Question,
    paired,
    settled_early,
    straddles,
)
from flexdsa_core.targets.spec import TargetSpec, op_key
from flexdsa_core.version import __version__

__all__ = ["CostModel"]

# Constant integer inputs up to this many elements are shapes/axes/pads: their values enter the key.
_SMALL_CONST = 64
_PROBE_CONSTANT_BUDGET_BYTES = 64 * 1024 * 1024
_DEFAULT_OPSETS = {"": 21, "com.microsoft": 1}


BORDERLINE_MAX_ROUNDS = 250
BORDERLINE_BUDGET_FACTOR = 4


# Rounds after which a side-by-side timing may stop before its budget, when its verdict is already plain
# (``significance.settled_early``): few looks, each at a stricter confidence than the verdict's.
EARLY_LOOKS = frozenset({MIN_ROUNDS, 19, 29})


class CostModel:
    """Costs nodes and graphs on one target: measured for calibrated targets (cpu-ort), a roofline
    estimate from the spec otherwise. ``dims`` maps symbolic dim names to the values to cost them at
    (a shape bucket); ``measure_budget_s`` bounds the timing loop of one kernel."""

    def __init__(
        self,
        target: TargetSpec,
        *,
        cache: KernelCache | None = None,
        calibrate: bool = True,
        dims: Mapping[str, int] | None = None,
        ort_level: str = "basic",
        measure_budget_s: float = 0.05,
        timer: Timer | None = None,
    ) -> None:
        if ort_level not in LEVELS:
            raise ValueError(f"ort_level must be one of {sorted(LEVELS)}, not {ort_level!r}")
        self.target = target
        self.cache: KernelCache = cache if cache is not None else LRUCache()
        self.measuring = bool(calibrate and target.calibrated)
        self.dims = dict(dims or {})
        self.ort_level = ort_level
        self.measure_budget_s = measure_budget_s
        # Seconds one call of a function takes; the default is this thread's CPU time (``timed``).
        self.timer: Timer | None = timer
        self.stats = CacheStats()
        self.measure_seconds = 0.0
        # Lowered (128 -> 64 -> ...) when a model refuses the default, e.g. a position table of 64.
        self.representative_dim = REPRESENTATIVE_DIM
        # No shape probe may feed more than this (``shape_plan.memory_budget``; None: not bounded here).
        self.memory_budget_bytes: int | None = None
        self._notes: dict[str, None] = {}
        self._memo: dict[str, dict] = {}
        # Shape probes by what decides their result (``_probe_key``): the same subgraph at the same shapes
        # (twelve identical layers, the recompiles of a bisection, the next job) is run in ONNX Runtime once.
        self._probes: dict[str, list | None] = {}
        self.probe_stats = {"run": 0, "reused": 0}
        self.compiler_version = f"{__version__}+ort{ort.__version__}"

    # -- public ------------------------------------------------------------------------------------

    @property
    def basis(self) -> str:
        if self.measuring:
            return f"measured with ONNX Runtime {ort.__version__} on this machine (1 thread, lower quartile of runs)"
        return f"roofline estimate from the {self.target.name} spec"

    @property
    def energy_available(self) -> bool:
        return self.target.power_w is not None and not self.measuring

    @property
    def notes(self) -> list[str]:
        return list(self._notes)

    def node_cost(
        self,
        node: ir.Node,
        *,
        opsets: Mapping[str, int] | None = None,
        shapes: Mapping[ir.Value, TensorInfo] | None = None,
        measure: bool = True,
    ) -> Cost:
        """Cost of one node. ``shapes`` overrides what the node's values say (see ``nodes_cost``);
        ``measure=False``: the work and the roofline only, for a caller that times the node otherwise."""
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            return Cost()
        view = self._view(node, shapes or {})
        if view is None:
            self._note(f"{node.op_type}: input shapes unknown; costed as one launch")
            return self._timed_cost(Cost(), None)
        base = work(view)
        if self.measuring and measure:
            seconds = self._measured_seconds(node, view, opsets or self._opsets_of(node))
            if seconds is not None:
                return Cost(base.flops, base.bytes, seconds=seconds, joules=None, kernels=1, measured=1)
        return self._timed_cost(base, view)

    def nodes_cost(
        self,
        nodes: Iterable[ir.Node],
        *,
        opsets: Mapping[str, int] | None = None,
        shapes: Mapping[ir.Value, TensorInfo] | None = None,
        measure: bool = True,
    ) -> Cost:
        """Cost of a set of nodes. Values with no static shape in the graph (a rewrite's new
        intermediates, contrib-op outputs, symbolic dims) and not in ``shapes`` are found first by
        running the nodes once in ONNX Runtime, so that every shape is consistent with its inputs."""
        nodes = list(nodes)
        known = dict(shapes or {})
        known.update(self.infer_shapes(nodes, opsets=opsets, known=known))
        return sum((self.node_cost(n, opsets=opsets, shapes=known, measure=measure) for n in nodes), Cost())

    def nodes_work(
        self,
        nodes: Iterable[ir.Node],
        *,
        opsets: Mapping[str, int] | None = None,
        shapes: Mapping[ir.Value, TensorInfo] | None = None,
    ) -> Cost:
        """The work of a set of nodes (FLOPs, bytes, kernels; shapes found as ``nodes_cost`` finds them) with no
        seconds or joules: for a caller that timed the nodes itself (the Fusion Switcher's side-by-side
        comparisons), so nothing is measured or costed by a roofline (whose host rates take 0.25 s to measure)."""
        nodes = list(nodes)
        known = dict(shapes or {})
        known.update(self.infer_shapes(nodes, opsets=opsets, known=known))
        total = Cost(seconds=None, joules=None)
        for node in nodes:
            if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
                continue
            view = self._view(node, known)
            if view is None:
                self._note(f"{node.op_type}: input shapes unknown; costed as one launch")
                total += Cost(seconds=None, joules=None, kernels=1)
                continue
            base = work(view)
            total += Cost(base.flops, base.bytes, seconds=None, joules=None, kernels=1)
        return total

    def graph_cost(self, model: ir.Model) -> Cost:
        """Cost of the model's main graph (subgraphs of control-flow nodes are not descended into)."""
        return self.nodes_cost(list(model.graph), opsets=model.opset_imports)

    def compare(
        self,
        first: Sequence[ir.Node],
        second: Sequence[ir.Node],
        *,
        opsets: Mapping[str, int] | None = None,
        shapes: Mapping[ir.Value, TensorInfo] | None = None,
    ) -> tuple[float, float] | None:
        """Seconds of two node sets timed side by side (``compare_paired``'s medians), or None."""
        comparison = self.compare_paired(first, second, opsets=opsets, shapes=shapes)
        return None if comparison is None else (comparison.first_s, comparison.second_s)

    def compare_paired(
        self,
        first: Sequence[ir.Node],
        second: Sequence[ir.Node],
        *,
        opsets: Mapping[str, int] | None = None,
        shapes: Mapping[ir.Value, TensorInfo] | None = None,
        min_effect: float = KERNEL_MIN_EFFECT,
        question: Question = "both",
        found: dict[ir.Value, TensorInfo] | None = None,
    ) -> Comparison | None:
        """Two node sets timed side by side and compared with a confidence bound (``significance.paired``):
        each round runs every kernel of both sets once (in alternating order), so that load on a shared
        machine falls on both sides alike; at least ``MIN_ROUNDS`` rounds, up to 50 within four kernel
        budgets. Per kernel and round the same figure as a measurement (run time less the empty run, plus
        ``launch_overhead_s``). None when not measuring or a kernel cannot be run alone. Cached like a
        measurement, under the pair of kernel keys: the same choice at twelve identical layers, or in the
        next job, is timed once and decided the same way. ``question``: the threshold that can change the
        caller's decision (``significance``); timing stops once that one is settled. ``found``, when given,
        takes the shapes both sides were sized at, for a caller that costs the same nodes next (``nodes_work``)."""
        if not self.measuring:
            return None
        started = time.perf_counter()
        kernels: list[tuple[int, ir.Node, OpView, int, Mapping[str, int]]] = []
        for side, nodes in enumerate((first, second)):
            nodes = [n for n in nodes if not (n.op_type == "Constant" and n.domain in ("", "ai.onnx"))]
            known = dict(shapes or {})
            known.update(self.infer_shapes(nodes, opsets=opsets, known=known))
            if found is not None:
                found.update(known)
            for node in nodes:
                view = self._view(node, known)
                if view is None or not self._measurable(node, view):
                    return None
                node_opsets = opsets or self._opsets_of(node)
                opset = node_opsets.get(node.domain, _DEFAULT_OPSETS.get(node.domain, 1))
                kernels.append((side, node, view, opset, node_opsets))
        keys = ([], [])
        for side, node, view, opset, _ in kernels:
            keys[side].append(self._key(node, view, opset))
        key = self.pair_key(*keys, min_effect=min_effect, question=question)
        entry = self._cache_get(key)
        if entry is not None:
            return Comparison.from_dict(entry)
        self.stats.misses += 1
        runners: list[tuple[int, Callable[[], None]]] = []
        for side, node, view, opset, node_opsets in kernels:
            run = self._kernel_runner(node, view, opset, node_opsets)
            if run is None:
                return None
            runners.append((side, run))
        timer = self.timer or timed
        empty_run = empty_runner()
        # Per round: each kernel's seconds, and the empty run's at both ends of the round (alternating order).
        # The empty run's figure comes from the same rounds (``_local_empty``): the fixed cost of a run moves
        # with the machine's state (seen: 5 us, then 10 us), and a figure from another time, taken off three
        # kernels on one side and one on the other, moved this ratio from ~1.8 to ~0.7 (issue 8).
        samples: list[tuple[list[float], list[float]]] = []
        order = [None, *range(len(runners)), None]
        budget = 4 * self.measure_budget_s
        timing_started = time.perf_counter()

        def one_round() -> None:
            seconds, empty_s = [0.0] * len(runners), []
            for index in order if len(samples) % 2 == 0 else reversed(order):
                if index is None:
                    empty_s.append(timer(empty_run))
                else:
                    seconds[index] = timer(runners[index][1])
            samples.append((seconds, empty_s))

        def per_round() -> tuple[list[float], list[float]]:
            empties = _local_empty([empty_s for _, empty_s in samples])
            sides: tuple[list[float], list[float]] = ([], [])
            for (seconds, _), empty in zip(samples, empties, strict=True):
                totals = [0.0, 0.0]
                for (side, _), kernel_s in zip(runners, seconds, strict=True):
                    totals[side] += max(kernel_s - empty, 0.0) + self.target.launch_overhead_s
                sides[0].append(totals[0])
                sides[1].append(totals[1])
            return sides

        while len(samples) < MIN_ROUNDS or (
            len(samples) < 50 and time.perf_counter() - timing_started < budget
        ):
            one_round()
            if len(samples) in EARLY_LOOKS and settled_early(
                *per_round(), min_effect=min_effect, question=question
            ):
                break
        comparison = paired(*per_round(), min_effect=min_effect)
        # An interval that straddles a threshold would let the verdict follow noise from one cold run to the
        # next (seen: SkipLayerNormalization at 1.2-1.3x, its bound either side of 1.1). More rounds narrow it
        # onto one side unless the effect really sits on the threshold; bounded by rounds and time. Only the
        # threshold the caller's decision turns on counts (``question``).
        while (
            straddles(comparison, question)
            and len(samples) < BORDERLINE_MAX_ROUNDS
            and time.perf_counter() - timing_started < BORDERLINE_BUDGET_FACTOR * budget
        ):
            for _ in range(10):
                one_round()
            comparison = paired(*per_round(), min_effect=min_effect)
        elapsed = time.perf_counter() - started
        self.measure_seconds += elapsed
        # The threshold asked about travels with the entry: a comparison stopped once "slower?" was settled
        # may read "tie" or "faster" alike, and only that one threshold decided anything.
        self._cache_put(key, {**comparison.as_dict(), "question": question, "measure_s": elapsed})
        # Decided on what the cache holds (ratios rounded to 4 places), so that the next job reading it decides
        # the same even where a bound sits within rounding of a threshold.
        return Comparison.from_dict(comparison.as_dict())

    def pair_key(
        self,
        first: Sequence[str],
        second: Sequence[str],
        *,
        min_effect: float = KERNEL_MIN_EFFECT,
        question: Question = "both",
    ) -> str:
        """The cache key of a side-by-side comparison of two sets of kernels (their ``kernel_key``s)."""
        pair = [[0, key] for key in first] + [[1, key] for key in second]
        # "empty": where the fixed cost of a run comes from; a comparison cached before it was timed in the
        # same rounds (issue 8) may hold a verdict that followed the machine's state, so it is not reused.
        # "question": a comparison stopped once one threshold was settled does not answer the other.
        paired_how = {
            "min_effect": min_effect,
            "min_rounds": MIN_ROUNDS,
            "empty": "in_round",
            "question": question,
        }
        return kernel_key(
            {"compare": pair, "paired": paired_how}, self.target, self.compiler_version
        )

    def describe(self) -> dict:
        """What the figures rest on, for reports."""
        return {
            "target": self.target.name,
            "basis": self.basis,
            "energy_available": self.energy_available,
            "representative_dims": {
                "batch": REPRESENTATIVE_BATCH,
                "other": self.representative_dim,
                **self.dims,
            },
            "cache": self.stats.as_dict(),
            "measuring_seconds": round(self.measure_seconds, 4),
            "notes": self.notes,
        }

    # -- shapes ------------------------------------------------------------------------------------

    def concrete(self, value: ir.Value) -> TensorInfo | None:
        """The value with every dim made concrete, or None when its shape or dtype is unknown."""
        if value.shape is None or value.dtype is None:
            return None
        try:
            dtype = value.dtype.numpy().name
        except (TypeError, ValueError):
            return None
        dims = tuple(self._dim(dim, axis) for axis, dim in enumerate(value.shape))
        if any(d < 0 for d in dims):  # a dim nobody could size (an exporter's -1): unknown, never allocated
            return None
        const = value.const_value is not None
        small = None
        if const and np.dtype(dtype).kind in "iu" and math.prod(dims) <= _SMALL_CONST:
            small = value.const_value.numpy()
        return TensorInfo(dims, dtype, const, small)

    def input_dims(self, model: ir.Model) -> dict[str, int]:
        """The value each named symbolic dim of ``model``'s inputs is costed at (a bucket's ``dims`` where
        it names one, else the batch/other rule, with ``representative_dim`` as lowered so far): the one
        shape the rest of the pipeline plans memory, validates and times at (``BucketModel.at``)."""
        found: dict[str, int] = {}
        for value in model.graph.inputs:
            for axis, dim in enumerate(value.shape or ()):
                name = getattr(dim, "value", None)
                if not isinstance(dim, int) and name is not None:
                    found.setdefault(str(name), self._dim(dim, axis))
        return found

    def _bound(self, value: ir.Value) -> bool:
        """Whether ``value``'s dtype is known and every dim of its shape is a number or a dim the plan binds."""
        if value.dtype is None or value.shape is None:
            return False
        return all((d >= 0) if isinstance(d, int) else getattr(d, "value", None) in self.dims for d in value.shape)

    def _dim(self, dim: object, axis: int) -> int:
        if isinstance(dim, int):
            return dim
        name = getattr(dim, "value", None)
        if name is not None and name in self.dims:
            return int(self.dims[name])
        return open_dim_value(name, axis, size=self.representative_dim)

    def infer_shapes(
        self,
        nodes: Sequence[ir.Node],
        *,
        opsets: Mapping[str, int] | None = None,
        known: Mapping[ir.Value, TensorInfo] | None = None,
    ) -> dict[ir.Value, TensorInfo]:
        """Concrete shapes for the values the nodes produce that have no static shape (and are not in
        ``known``): the nodes are run once in ONNX Runtime (no optimisation) on representative inputs,
        symbolic dims of the external inputs specialised as the module docstring says. Best effort:
        when the run fails, nothing is returned and the graph's own (specialised) shapes are used."""
        known = known or {}
        produced = [out for n in nodes for out in n.outputs]
        if all(v in known or _is_static(v) for v in produced):
            return {}
        # Dims the plan binds (an input's named dim, carried through by shape inference) are known without a
        # run: where they are all a value's symbolic dims, its shape is the plan's.
        bound = {v: self.concrete(v) for v in produced if v not in known and not _is_static(v) and self._bound(v)}
        if all(v in known or _is_static(v) or v in bound for v in produced):
            return bound
        # The Shape Tracker's answer first (ONNX shape inference at the plan's dims, nothing allocated): for the
        # whole graph at once, what it sizes is not probed.
        found_static: dict[ir.Value, TensorInfo] = {}
        graph = nodes[0].graph
        if not known and graph is not None and len(nodes) == len(graph) and isinstance(graph, ir.Graph):
            found_static = self._static_infos(graph, produced)
            produced = [v for v in produced if v not in found_static]
            if not produced:
                return found_static
        produced_set = {out for n in nodes for out in n.outputs}
        # The graph's own names where it has them: control-flow subgraphs refer to outer values by name.
        names: dict[ir.Value, str] = {}
        used: set[str] = set()

        def name_of(value: ir.Value) -> str:
            name = value.name if value.name and value.name not in used else f"_probe_{len(names)}"
            names[value] = name
            used.add(name)
            return name

        external: list[ir.Value] = []
        for n in nodes:
            for value in n.inputs:
                if value is not None and value not in produced_set and value not in names:
                    name_of(value)
                    external.append(value)
        for value in (out for n in nodes for out in n.outputs):
            if value not in names:
                name_of(value)
        # Running the nodes copies every constant they read into the probe; past this budget (a model with
        # gigabytes of weights) the graph's own specialised shapes have to do.
        constant_bytes = sum(
            v.const_value.nbytes for v in external if v.const_value is not None and v.const_value.nbytes
        )
        if constant_bytes > _PROBE_CONSTANT_BUDGET_BYTES:
            return found_static
        opsets = dict(opsets or self._opsets_of(nodes[0]))
        for n in nodes:
            opsets.setdefault(n.domain, _DEFAULT_OPSETS.get(n.domain, 1))
        infos = {value: known.get(value) or self.concrete(value) for value in external}
        if any(info is None for info in infos.values()):
            self._note("shapes not probed: an input's shape could not be sized (reported unknown)")
            return found_static
        fed_bytes = sum(
            math.prod(infos[v].shape) * np.dtype(infos[v].dtype).itemsize for v in external if v.const_value is None
        )
        if self.memory_budget_bytes and fed_bytes > self.memory_budget_bytes:
            self._note(
                f"a shape probe was skipped: its inputs would take {fed_bytes / 2**20:.0f} MiB, over the memory "
                f"budget of {self.memory_budget_bytes / 2**20:.0f} MiB"
            )
            return found_static
        key = _probe_key(nodes, external, infos, known, opsets, self.representative_dim)
        if key is not None:
            results = self._reused_probe(key)
            if results is not _NOT_PROBED:
                return {**found_static, **_probe_found(produced, results)}
        started = time.perf_counter()
        dim_before = self.representative_dim
        proto_nodes, graph_inputs, initializers, fed = [], [], [], []
        weights: dict[str, ir.TensorProtocol] = {}  # large constants, handed to ONNX Runtime from memory
        for value in external:
            info = infos[value]
            if value.const_value is not None and value.const_value.nbytes >= EXTERNAL_MIN_BYTES:
                weights[names[value]] = value.const_value
                tensor = value.const_value
                initializers.append(declare(names[value], tensor.dtype.numpy(), tensor.shape.numpy()))
            elif value.const_value is not None:
                initializers.append(onnx.numpy_helper.from_array(value.const_value.numpy(), names[value]))
            else:
                elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype))
                dims = list(info.shape) if value in known else [_dim_proto(d) for d in value.shape]
                graph_inputs.append(onnx.helper.make_tensor_value_info(names[value], elem, dims))
                fed.append(value)
        for n in nodes:
            tensor = weight_constant(n)
            if tensor is not None:  # a weight written as a Constant (paddle2onnx): from memory, not serialised
                weights[names[n.outputs[0]]] = tensor
                initializers.append(declare(names[n.outputs[0]], tensor.dtype.numpy(), tensor.shape.numpy()))
                continue
            proto_nodes.append(_node_proto(n, [names.get(v, "") if v is not None else "" for v in n.inputs],
                                           [names[v] for v in n.outputs]))  # fmt: skip
        outputs = list(dict.fromkeys(names[v] for v in produced))
        graph_outputs = []
        for name in outputs:
            value_info = onnx.ValueInfoProto()
            value_info.name = name
            graph_outputs.append(value_info)
        graph = onnx.helper.make_graph(proto_nodes, "probe", graph_inputs, graph_outputs, initializers)
        model = onnx.helper.make_model(
            graph, opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in opsets.items()], ir_version=10
        )
        results = self._probe(model, outputs, fed, names, known, nodes, weights)
        self.probe_stats["run"] += 1
        if key is not None:
            self._probes[key] = results
            if results is not None and self.representative_dim == dim_before:
                # Shared like a measurement (a probe at a lowered dim is this model's story, not the key's).
                self._cache_put_raw(key, {"outputs": results, "measure_s": time.perf_counter() - started})
        return {**found_static, **_probe_found(produced, results)}

    def _static_infos(self, graph: ir.Graph, produced: Sequence[ir.Value]) -> dict[ir.Value, TensorInfo]:
        """``shape_plan.static_shapes`` of the graph at this model's dims, for the values in ``produced``."""
        shapes = static_shapes(graph, self.dims)
        found = {}
        for value in produced:
            entry = shapes.get(value.name) if value.name else None
            if entry is None:
                continue
            shape, dtype = entry
            small = None
            if value.const_value is not None and np.dtype(dtype).kind in "iu" and math.prod(shape) <= _SMALL_CONST:
                small = value.const_value.numpy()
            found[value] = TensorInfo(tuple(shape), dtype, value.const_value is not None, small)
        return found

    def _reused_probe(self, key: str):
        """A probe's outputs from this job's memo or the shared cache; ``_NOT_PROBED`` when neither has it."""
        if key in self._probes:
            self.probe_stats["reused"] += 1
            return self._probes[key]
        try:
            raw = self.cache.get(key)
            entry = json.loads(raw) if raw is not None else None
        except Exception:  # noqa: BLE001 - a broken cache is a cache that misses
            entry = None
        if not isinstance(entry, dict) or not isinstance(entry.get("outputs"), list):
            return _NOT_PROBED
        report_saved = getattr(self.cache, "saved", None)
        if callable(report_saved):
            report_saved(float(entry.get("measure_s", 0.0)))
        self.probe_stats["reused"] += 1
        self._probes[key] = entry["outputs"]
        return entry["outputs"]

    def _cache_put_raw(self, key: str, entry: dict) -> None:
        try:
            self.cache.put(key, json.dumps(entry).encode())
        except Exception:  # noqa: BLE001 - a broken cache is a cache that misses
            self._note("kernel cache refused a write; measurements are not shared")

    def _probe(self, model, outputs, fed, names, known, nodes, weights=None) -> list | None:
        """Run the probe model (``_probed`` of each output); where symbolic dims are fed, retry with smaller
        representative values if the model refuses the current one (keeping the first that works for all
        later costing)."""
        symbolic = any(v not in known and not _is_static(v) for v in fed)
        candidates = [self.representative_dim]
        if symbolic:
            candidates += [d for d in LOWERED if d < self.representative_dim]
        try:
            session = session_with(model, weights or {}, session_options(LEVELS["disabled"]))
        except Exception as error:  # noqa: BLE001 - ORT raises many types; an unknown shape is not fatal
            self._note(f"could not infer shapes: {str(error).splitlines()[0][:160]}")
            return None
        chosen = self.representative_dim
        for candidate in candidates:
            self.representative_dim = candidate
            rng = np.random.default_rng(0)
            feeds = {}
            try:
                for value in fed:
                    info = known.get(value) or self.concrete(value)
                    feeds[names[value]] = random_array(info.shape, info.dtype, rng)
            except ProbeTooLarge:
                self._note("shapes not probed: an input would be too large to allocate")
                return None
            try:
                arrays = guarded_run(session, outputs, feeds, what="a shape probe of the cost model")
                results = [_probed(array) for array in arrays]
            except Exception as error:  # noqa: BLE001
                last_error = str(error).splitlines()[0][:160]
                continue
            if candidate != chosen:
                self._note(f"symbolic dims costed at {candidate}, not {chosen}: the model refused {chosen}")
            return results
        self.representative_dim = chosen
        ops = ", ".join(sorted({n.op_type for n in nodes}))
        self._note(f"could not infer shapes by running {ops}: {last_error}")
        return None

    def _opsets_of(self, node: ir.Node) -> Mapping[str, int]:
        graph = node.graph
        opsets = dict(graph.opset_imports) if graph is not None else {}
        return opsets or dict(_DEFAULT_OPSETS)

    def _view(self, node: ir.Node, shapes: Mapping[ir.Value, TensorInfo]) -> OpView | None:
        def info(value: ir.Value | None) -> TensorInfo | None:
            if value is None:
                return None
            if value in shapes:
                return shapes[value]
            return self.concrete(value)

        inputs = tuple(info(v) for v in node.inputs)
        if any(v is not None and i is None for v, i in zip(node.inputs, inputs, strict=True)):
            return None
        outputs = tuple(info(v) for v in node.outputs)
        if any(o is None for o in outputs) and inputs and inputs[0] is not None:
            # Unknown outputs: assume element-wise (the shape of the first input) for the work estimate.
            outputs = tuple(o if o is not None else inputs[0] for o in outputs)
        attrs = {name: _attr_value(attr) for name, attr in node.attributes.items()}
        return OpView(node.op_type, node.domain, attrs, inputs, outputs)

    # -- seconds and joules --------------------------------------------------------------------------

    def _timed_cost(self, base: Cost, view: OpView | None) -> Cost:
        """Roofline seconds and joules for ``base`` (flops, bytes) run as one kernel."""
        target = self.target
        dtype = _compute_dtype(view) if view is not None else "float32"
        if self.measuring:
            peak, bandwidth = host_rates()
        else:
            peak = self.peak(dtype)
            bandwidth = target.mem_bandwidth_bytes_per_s
            if peak is None and base.flops:
                self._note(f"{target.name}: no sourced {dtype} peak; compute time not counted")
            if bandwidth is None and base.bytes:
                self._note(f"{target.name}: no sourced memory bandwidth; memory time not counted")
        compute_s = base.flops / peak if peak else 0.0
        memory_s = base.bytes / bandwidth if bandwidth else 0.0
        seconds = max(compute_s, memory_s) + target.launch_overhead_s
        joules = None
        if target.power_w is not None and not self.measuring:
            joules = target.power_w * (compute_s + memory_s + target.launch_overhead_s)
        return Cost(flops=base.flops, bytes=base.bytes, seconds=seconds, joules=joules, kernels=1)

    def peak(self, dtype: str) -> float | None:
        """The target's sourced peak for ``dtype`` (ops/s). Accelerators without a float32 figure compute float
        graphs in float16 (RKNN, QNN HTP, Ascend's fp16 precision mode, TensorRT --fp16): float32 is costed at
        the float16 peak, and the notes say so. An int8-only part (the Vitis AI DPU) runs a float graph only once
        it is quantised: floats are costed at its int8 peak."""
        peak = self.target.peak_ops_per_s.get(dtype)
        int8_only = self.target.dtypes == ["int8"]
        if peak is None and int8_only and dtype in ("float32", "float16") and self.target.peak_ops_per_s.get("int8"):
            self._note(f"{self.target.name}: {dtype} costed at the int8 peak (int8-only: it runs once quantised)")
            return self.target.peak_ops_per_s["int8"]
        if peak is None and dtype == "float32" and self.target.peak_ops_per_s.get("float16"):
            self._note(
                f"{self.target.name}: float32 costed at the float16 peak (the part computes floats in fp16)"
            )
            return self.target.peak_ops_per_s["float16"]
        return peak

    def _measurable(self, node: ir.Node, view: OpView) -> bool:
        if any(
            attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
            for attr in node.attributes.values()
        ):
            return False  # control flow: its cost is its subgraphs', not one kernel's
        if any(
            value is not None and value.const_value is None and info is not None and info.value is None
            and np.dtype(info.dtype).kind in "iu" and node.op_type in _SHAPE_INPUT_OPS
            for value, info in zip(node.inputs, view.inputs, strict=True)
        ):  # fmt: skip
            self._note(f"{node.op_type}: a shape input is neither constant nor known; not measured alone")
            return False
        return True

    def _measured_seconds(self, node: ir.Node, view: OpView, opsets: Mapping[str, int]) -> float | None:
        if not self._measurable(node, view):
            return None
        opset = opsets.get(node.domain, _DEFAULT_OPSETS.get(node.domain, 1))
        key = self._key(node, view, opset)
        entry = self._cache_get(key)
        if entry is not None:
            return entry["seconds"] + self.target.launch_overhead_s
        self.stats.misses += 1
        entry = self._measure(node, view, opset, opsets)
        if entry is None:
            return None
        self._cache_put(key, entry)
        return entry["seconds"] + self.target.launch_overhead_s

    def kernel_key(
        self,
        node: ir.Node,
        *,
        opsets: Mapping[str, int] | None = None,
        shapes: Mapping[ir.Value, TensorInfo] | None = None,
    ) -> str | None:
        """The cache key a measurement of ``node`` is stored under (None when its shapes are unknown).
        Lets a caller pre-seed the cache, e.g. with measurements from the target machine."""
        view = self._view(node, shapes or {})
        if view is None:
            return None
        opsets = opsets or self._opsets_of(node)
        return self._key(node, view, opsets.get(node.domain, _DEFAULT_OPSETS.get(node.domain, 1)))

    def _key(self, node: ir.Node, view: OpView, opset: int) -> str:
        canonical = self._canonical(node, view, opset)
        return kernel_key(canonical, self.target, self.compiler_version)

    def _canonical(self, node: ir.Node, view: OpView, opset: int) -> dict:
        return {
            "op": view.op_type,
            "domain": view.domain,
            "opset": opset,
            "attrs": {name: _canonical_attr(value) for name, value in sorted(view.attrs.items())},
            "inputs": [
                None if t is None else {
                    "shape": list(t.shape), "dtype": t.dtype, "const": t.const,
                    "value": None if t.value is None else t.value.tolist(),
                }
                for t in view.inputs
            ],
            "outputs": _live_outputs(node),
            "runtime": {"ort": ort.__version__, "level": self.ort_level, "threads": 1},
            "machine": machine_fingerprint(),
            "empty_run": "beside",  # the fixed cost of a run timed with the kernel (older figures: once a process)
        }  # fmt: skip

    def _measure(self, node: ir.Node, view: OpView, opset: int, opsets: Mapping[str, int]) -> dict | None:
        started = time.perf_counter()
        run = self._kernel_runner(node, view, opset, opsets)
        if run is None:
            return None
        # The fixed cost of a run is timed beside the kernel's runs, not once per process: it moves with the
        # machine's state (issue 8).
        runs, empties = time_beside_empty(run, thread_empty_runner(), self.measure_budget_s, self.timer)
        elapsed = time.perf_counter() - started
        self.measure_seconds += elapsed
        return {
            "seconds": max(steady(runs) - steady(empties), 0.0),
            "raw_steady_s": steady(runs),
            "raw_median_s": statistics.median(runs),
            "runs": len(runs),
            "measure_s": elapsed,
        }

    def _kernel_runner(
        self, node: ir.Node, view: OpView, opset: int, opsets: Mapping[str, int]
    ) -> Callable[[], None] | None:
        """The node alone in an ONNX Runtime session, bound and warmed up, as a function running it once."""
        rng = np.random.default_rng(0)
        inputs, feeds = [], {}
        for index, (value, info) in enumerate(zip(node.inputs, view.inputs, strict=True)):
            name = f"i{index}" if value is not None else ""
            constant = None
            if value is not None and value.const_value is not None:
                constant = value.const_value  # handed to ONNX Runtime from memory when large (``in_memory``)
            elif value is not None and info is not None:
                known = info.value is not None
                try:
                    feeds[name] = (
                        np.asarray(info.value) if known else random_array(info.shape, info.dtype, rng)
                    )
                except ProbeTooLarge:
                    return None
            inputs.append((name, info, constant))
        outputs = [f"o{index}" if live else "" for index, live in enumerate(_live_outputs(node))]
        proto = _node_proto(node, [name for name, _, _ in inputs], outputs)
        domains = {"": opsets.get("", _DEFAULT_OPSETS[""]), node.domain: opset}
        try:
            session = single_node_session(
                proto, inputs, [o for o in outputs if o], domains, LEVELS[self.ort_level]
            )
            return bound_runner(session, feeds)
        except Exception as error:  # noqa: BLE001 - any ORT failure means "not measurable alone"
            self._note(f"{op_key(node.op_type, node.domain)} not measurable alone in ONNX Runtime: "
                       f"{str(error).splitlines()[0][:160]}")  # fmt: skip
            return None

    def _count_hit(self, entry: dict, layer: str) -> None:
        saved = float(entry.get("measure_s", 0.0))
        self.stats.hits += 1
        self.stats.seconds_saved += saved
        report_saved = getattr(self.cache, "saved", None)  # a StatsCache keeps the job's total
        if callable(report_saved) and layer != "memo":
            # Only the caller's cache counted this hit: a memo hit saved there would read "0 hits, 0.1 s saved".
            report_saved(saved)

    def _cache_get(self, key: str) -> dict | None:
        """This model's own memo first (identical layers of one job measure once even when the caller
        passes no cache, or a NullCache), then the shared cache. A hit is counted here."""
        layer = "memo"
        entry = self._memo.get(key)
        if entry is None:
            layer = getattr(self.cache, "name", "cache")
            try:
                raw = self.cache.get(key)
                entry = json.loads(raw) if raw is not None else None
            except Exception:  # noqa: BLE001 - a broken cache is a cache that misses
                entry = None
            if entry is None:
                return None
            self._memo[key] = entry
        self.stats.by_layer[layer] = self.stats.by_layer.get(layer, 0) + 1
        self._count_hit(entry, layer)
        return entry

    def _cache_put(self, key: str, entry: dict) -> None:
        self.stats.puts += 1
        self._memo[key] = entry
        try:
            self.cache.put(key, json.dumps(entry).encode())
        except Exception:  # noqa: BLE001 - a broken cache is a cache that misses
            self._note("kernel cache refused a write; measurements are not shared")

    def _note(self, text: str) -> None:
        self._notes[text] = None


# Ops whose integer inputs are shapes, sizes or indices into shapes: random data would not do.
_SHAPE_INPUT_OPS = frozenset(
    {"Reshape", "Expand", "Tile", "Slice", "ConstantOfShape", "Range", "Resize", "Pad", "TopK", "Squeeze",
     "Unsqueeze", "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "Split", "OneHot", "Upsample"}
)  # fmt: skip


def _dim_proto(dim: object) -> int | str | None:
    if isinstance(dim, int):
        return dim
    return getattr(dim, "value", None)


# Rounds either side of a round whose empty runs give its fixed cost (``_local_empty``).
_EMPTY_RADIUS = 2


def _local_empty(per_round: Sequence[Sequence[float]]) -> list[float]:
    """The fixed cost of a run at each round: the median of the empty runs timed in that round and the
    ``_EMPTY_RADIUS`` rounds either side. Local, because that cost moves with the machine's state within one
    comparison too; a median of several, because one empty run is as noisy as any other run."""
    empties = []
    for index in range(len(per_round)):
        near = per_round[max(0, index - _EMPTY_RADIUS) : index + _EMPTY_RADIUS + 1]
        empties.append(statistics.median(seconds for round_ in near for seconds in round_))
    return empties


def _is_static(value: ir.Value) -> bool:
    return value.dtype is not None and value.shape is not None and value.shape.is_static()


def _live_outputs(node: ir.Node) -> list[bool]:
    """Which outputs the kernel must produce: the first, and any the graph uses. A node not yet in a
    graph (a rewrite's replacement) produces all of them, since its uses are not wired yet."""
    if node.graph is None:
        return [True] * len(node.outputs)
    return [i == 0 or bool(v.uses()) or v.is_graph_output() for i, v in enumerate(node.outputs)]


def _compute_dtype(view: OpView) -> str:
    """The dtype whose peak bounds the node: its first float tensor, else its first input's (8-bit
    integers of either sign count as 'int8', the key the specs use)."""
    for tensor in (*view.inputs, *view.outputs):
        if tensor is not None and np.dtype(tensor.dtype).kind == "f":
            return tensor.dtype
    for tensor in view.inputs:
        if tensor is not None:
            return "int8" if tensor.dtype in ("int8", "uint8") else tensor.dtype
    return "float32"


def _attr_value(attr: ir.Attr) -> object:
    if attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
        return f"<{attr.type.name.lower()}>"
    value = attr.value
    if attr.type == ir.AttributeType.TENSOR:
        return value
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return list(value)
    return value


def _canonical_attr(value: object) -> object:
    # Plain values are settled before the Protocol check at the end: isinstance against a runtime Protocol
    # walks its attributes (10k calls, 0.3 s of a warm MobileNetV2 compile when lists went through it).
    if isinstance(value, int | str | bytes) or value is None:
        return value
    if isinstance(value, float):
        return repr(float(np.float32(value)))  # as stored in a model: 1e-5 and float32(1e-5) are one kernel
    if isinstance(value, list):
        return [repr(float(np.float32(v))) for v in value] if value and isinstance(value[0], float) else value
    if isinstance(value, ir.TensorProtocol):
        array = value.numpy()
        described = {"tensor": array.dtype.name, "shape": list(array.shape)}
        if array.size <= _SMALL_CONST:
            described["value"] = array.tolist()
        return described
    return value


def _node_proto(node: ir.Node, input_names: Sequence[str], output_names: Sequence[str]) -> onnx.NodeProto:
    proto = onnx.NodeProto()
    proto.op_type = node.op_type
    proto.domain = node.domain
    proto.input.extend(input_names)
    proto.output.extend(output_names)
    for attr in node.attributes.values():
        if isinstance(attr, ir.Attr) and not attr.is_ref():
            proto.attribute.append(ir.serde.serialize_attribute(attr))
    return proto


# -- shape probes, reused ------------------------------------------------------------------------------

_NOT_PROBED = object()


def _probed(array) -> list | None:
    """What a probe keeps of one output: [shape, dtype, small integer values or None]; None if not a tensor."""
    if not isinstance(array, np.ndarray):
        return None
    # Small integers are shapes and axes: keep what the run computed, so that a Reshape fed by shape
    # arithmetic can still be measured with its real target shape.
    small = array.tolist() if array.dtype.kind in "iu" and array.size <= _SMALL_CONST else None
    return [list(array.shape), array.dtype.name, small]


def _probe_found(produced: Sequence[ir.Value], results: list | None) -> dict[ir.Value, TensorInfo]:
    if results is None:
        return {}
    found = {}
    for value, result in zip(dict.fromkeys(produced), results, strict=True):
        if result is not None:
            shape, dtype, small = result
            array = None if small is None else np.asarray(small, dtype=dtype).reshape(shape)
            found[value] = TensorInfo(tuple(shape), dtype, value.const_value is not None, array)
    return found


def _probe_key(
    nodes: Sequence[ir.Node],
    external: Sequence[ir.Value],
    infos: Mapping[ir.Value, TensorInfo],
    known: Mapping[ir.Value, TensorInfo],
    opsets: Mapping[str, int] | None,
    representative_dim: int,
) -> str | None:
    """What decides a shape probe's outputs: the nodes (ops, attributes, wiring), the concrete shapes and
    dtypes of what they read, and the values of small constants (shapes, axes, Range bounds); never
    weight values. None for nodes with subgraphs, which the key cannot describe."""
    position = {value: ("x", index) for index, value in enumerate(external)}
    described = []
    for index, node in enumerate(nodes):
        if any(attr.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS) for attr in node.attributes.values()):
            return None
        inputs = [None if value is None else position.get(value, ("?", value.name)) for value in node.inputs]
        for out_index, value in enumerate(node.outputs):
            position[value] = ("n", index, out_index)
        attrs = {name: _canonical_attr(_attr_value(attr)) for name, attr in sorted(node.attributes.items())}
        described.append([node.op_type, node.domain, node.overload, attrs, inputs, len(node.outputs)])
    reads = []
    for value in external:
        info = infos[value]
        constant = value.const_value
        small = None
        if constant is not None and info.numel <= _SMALL_CONST:
            small = constant.numpy().tolist()
        # A fed value not in ``known`` may be re-specialised at a lower dim if the model refuses this one.
        symbolic = None if value in known or value.shape is None else [_dim_proto(d) for d in value.shape]
        reads.append([list(info.shape), info.dtype, constant is not None, small, symbolic])
    canonical = {
        "probe": described,
        "reads": reads,
        "opsets": sorted((opsets or {}).items()),
        "representative_dim": representative_dim,
        "runtime": {"ort": ort.__version__},
    }
    return "probe:" + kernel_key(canonical, None, __version__)  # what a node's shapes are holds on any target
