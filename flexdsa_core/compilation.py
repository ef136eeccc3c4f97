"""What one run of the compile pipeline makes (``Compilation``) and the one bisection every rollback shares.

``bisect(comp, is_good, recompile)`` finds the applied rewrite whose removal makes ``is_good`` hold, by
recompiling with halves of ``comp.applied`` switched off; every rollback (``verify.roll_back``: validation,
the never-slower check, the loadability check of the compile) undoes a rewrite through it.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import onnx_ir as ir

from flexdsa_core.loadable import UnloadableGraph
from flexdsa_core.targets import BucketModel

MAX_ROLLBACKS = 6
# The ``stage_seconds`` key of the kernels the cost model timed inside the stages (the Fusion Switcher's paired
# timings, single-kernel measurements): timing, like the never-slower check, not graph work; each stage's own
# figure leaves it out.
KERNEL_TIMING = "kernel_timing"


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


Recompile = Callable[[frozenset[str]], Compilation]


@dataclass(frozen=True)
class Stage:
    """One stage of the per-bucket pipeline (``pipeline.stage`` registers each by the name an adapter's
    ``stages`` lists): its name for timing and progress (None: untimed bookkeeping), what runs it, the
    progress message, and whether the invariants are checked after it (``supported``: also that every op is
    in the target's table)."""

    name: str | None
    run: Callable[[BucketRun], None]
    progress: str | None = None
    check: bool = False
    supported: bool = False


@dataclass
class BucketRun:
    """What the stages of one bucket hand each other: the model as it goes, and what the report keeps."""

    bucket: object
    tracker: object
    options: object
    disabled: frozenset[str]
    cost_model: object
    passes: list
    comp: Compilation
    # The ``FlexDSAOptimizer`` running the pipeline: its target, adapter, registry and fusion rules.
    optimizer: object = None
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


def loadable_or_none(recompile: Recompile, switched_off: frozenset[str]) -> Compilation | None:
    """``recompile(switched_off)``, or None where that variant does not load in ONNX Runtime (``bisect``)."""
    try:
        return recompile(switched_off)
    except UnloadableGraph:
        return None


def bisect(comp: Compilation, is_good: Callable[[Compilation], bool], recompile: Recompile):
    """Find one applied rewrite whose removal makes ``is_good`` hold.

    Invariant: switching off ``applied[:hi]`` is good and ``applied[:lo]`` is bad; the culprit is
    ``applied[hi-1]`` once ``hi == lo + 1``. Returns (culprit, compilation without it) or (None, comp).
    """
    applied = list(comp.applied)
    base = set(comp.disabled)
    recompile = functools.partial(loadable_or_none, recompile)
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
