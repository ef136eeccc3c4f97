"""The per-bucket stages, each one short function registered under the name an adapter's pipeline lists.

    @stage("passes", timed_as="passes", progress="generic passes", check=True)
    def generic_passes(run: BucketRun) -> None: ...

A target's adapter says which stages its buckets go through, in order (``PlatformAdapter.stages``: the
default pipeline and why each stage is there; accelerators add the Subgraph Mapper); ``FlexDSAOptimizer``
runs what it is given, once per shape bucket, with timing, progress and the invariant checks around each.
Every stage reads and writes one ``compilation.BucketRun``; ``run.optimizer`` gives the target, its adapter
and the rewrites its registry holds. A stage a target needs and no other does is one more ``@stage``
(registered before the target's pipeline is resolved: the module holding it is imported first).
"""

from __future__ import annotations

from collections.abc import Callable

from flexdsa_core.compilation import BucketRun, Stage
from flexdsa_core.delivery import check_delivery
from flexdsa_core.fusion_switcher import FusionSwitcher
from flexdsa_core.memory_planner import plan_memory as memory_plan
from flexdsa_core.passes.manager import run_passes
from flexdsa_core.subgraph_mapper import SubgraphMapper
from flexdsa_core.vendor_runs.estimate import target_estimate

__all__ = ["STAGES", "stage", "stages_named"]

# Stage name (what an adapter's ``stages`` lists) -> the stage.
STAGES: dict[str, Stage] = {}


def stage(
    name: str, *, timed_as: str | None = None, progress: str | None = None, check: bool = False,
    supported: bool = False,
) -> Callable[[Callable[[BucketRun], None]], Callable[[BucketRun], None]]:
    """Register a stage function under ``name``: ``timed_as`` is its timing and progress key (None: untimed
    bookkeeping), ``progress`` the message when it starts, ``check`` whether the invariants are checked after
    it (``supported``: every op also in the target's table)."""

    def register(run: Callable[[BucketRun], None]) -> Callable[[BucketRun], None]:
        if name in STAGES:
            raise ValueError(f"stage {name!r} is registered twice ({STAGES[name].run.__module__} and {run.__module__})")
        STAGES[name] = Stage(timed_as, run, progress, check, supported)
        return run

    return register


def stages_named(names: tuple[str, ...], target_name: str) -> tuple[Stage, ...]:
    """The registered stages an adapter's pipeline lists, in its order; a name no module registers is refused."""
    unknown = [name for name in names if name not in STAGES]
    if unknown:
        raise ValueError(
            f"target {target_name!r}: its adapter's stages list {unknown}, which no module registers "
            f"(``pipeline.stage``); registered: {', '.join(sorted(STAGES))}"
        )
    return tuple(STAGES[name] for name in names)


@stage("shapes", timed_as="shapes", check=True)
def specialize(run: BucketRun) -> None:
    run.model = run.tracker.specialize(run.bucket)


@stage("estimate")
def estimate_before(run: BucketRun) -> None:
    run.cost_before = run.cost_model.graph_cost(run.model)


@stage("passes", timed_as="passes", progress="generic passes", check=True)
def generic_passes(run: BucketRun) -> None:
    run.records = run_passes(run.model, run.passes)
    for record in run.records:
        if record.modified:
            run.applied(record.name)


@stage("fusion", timed_as="fusion", progress="choosing fusions", check=True)
def choose_fusions(run: BucketRun) -> None:
    optimizer = run.optimizer
    switcher = FusionSwitcher(
        optimizer.target, optimizer.supports, run.cost_model, objective=run.options.objective,
        disabled=run.disabled,
    )  # fmt: skip
    run.plan = switcher.run(run.model, optimizer.rules)
    for name in run.plan.applied:
        run.applied(name)
    # Fusions leave dead producers and foldable leftovers behind: one more round of the passes.
    run.records += run_passes(run.model, run.passes)


@stage("legalize", timed_as="adapter", check=True, supported=True)
def legalize(run: BucketRun) -> None:
    optimizer = run.optimizer
    run.legalized = optimizer.adapter.legalize(run.model, optimizer.target, run.disabled)
    run.model = run.legalized.model
    run.comp.legalization[run.bucket.name] = run.legalized.notes
    for name in run.legalized.applied:
        run.applied(name)


@stage("memory", timed_as="memory")
def plan_memory(run: BucketRun) -> None:
    # One shape per bucket from here on: the dims still symbolic take the values the cost model costed
    # them at (lowered where the model refused its default), and memory, validation and the latency check
    # all use them.
    run.at = run.cost_model.input_dims(run.model)
    run.comp.memory[run.bucket.name] = memory_plan(run.model, dims={**run.bucket.dims, **run.at}).as_dict()


@stage("mapper", timed_as="mapper")
def map_subgraphs(run: BucketRun) -> None:
    optimizer = run.optimizer
    mapper = SubgraphMapper(optimizer.target, optimizer.adapter, run.cost_model, run.cost_model.cache)
    run.mapping = mapper.map(run.model)
    run.comp.partition[run.bucket.name] = run.mapping.as_dict()


@stage("record")
def record(run: BucketRun) -> None:
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
                run.optimizer.target, run.mapping, cost_after, comp.memory[name]
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
