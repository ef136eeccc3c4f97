"""Re-specialisation from served traffic: buckets proposed for a model's run-time shapes, and what they gain.

``propose`` prices three sets of buckets on the same traffic with one cost function (``ShapeTracker.
traffic_cost``: the target's cost model, never measured): the bundle's current buckets, the target's default
ones (what a submission without ``shape_buckets`` compiles), and at most ``k`` buckets the planner chooses
(``traffic_buckets.choose_traffic_buckets``). Each gets the expected cost per request and the padding waste
(``traffic_buckets.expected_cost``). The service (``POST /jobs/{id}/respecialise``) and ``bench.runtime`` both
call it.

The cost function is the model's own node-by-node cost at each shape, which is no figure the job shows; so the
service anchors it (``anchor``): scaled so that the shape of the job's headline bucket costs the job's
latency figure for that bucket (``report["figures"]``), the expected costs are in the job's own terms (a
bundle serving all its traffic from that bucket costs exactly that figure per request, and a lower bound
stays one, written ``≥``), and only how the cost changes with the shape comes from the cost model; the
ratios are the same either way. "Padding waste" here is of the cost: (expected cost - the cost of each
request at its own shape) / the latter, not the runtime's padding in input elements. Dims with more distinct values than the planner costs are rounded up first (a bucket at the rounded
value still holds each request).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import onnx_ir as ir

from flexdsa_core.errors import FlexDSAError
from flexdsa_core.figures import bound_text, seconds_text
from flexdsa_core.shape_tracker import MAX_TRAFFIC_VALUES, ShapeTracker
from flexdsa_core.targets.spec import TargetSpec
from flexdsa_core.traffic_buckets import choose_traffic_buckets, expected_cost

__all__ = ["propose", "rounded"]

Observed = list[tuple[dict[str, int], int]]


def rounded(observed: Observed, limit: int = MAX_TRAFFIC_VALUES) -> tuple[Observed, list[str]]:
    """``observed`` with each dim of more than ``limit`` distinct values rounded up to multiples of the
    smallest power of two that brings it under; with a note per rounded dim."""
    notes = []
    for name in list(observed[0][0]):
        values = {dims[name] for dims, _ in observed}
        step = 1
        while len({-(-v // step) * step for v in values}) > limit:
            step *= 2
        if step > 1:
            observed = [({**dims, name: -(-dims[name] // step) * step}, count) for dims, count in observed]
            notes.append(
                f"{name}: {len(values)} distinct values, rounded up to multiples of {step} for the planner"
            )
    return observed, notes


def _grid(buckets: Sequence[Mapping[str, Any]]) -> dict[str, list[int]]:
    grid: dict[str, set[int]] = {}
    for bucket in buckets:
        for dim, value in (bucket.get("dims") or {}).items():
            grid.setdefault(dim, set()).add(value)
    return {dim: sorted(values) for dim, values in grid.items()}


def propose(
    model: ir.Model,
    target: TargetSpec,
    observed: Observed,
    current_buckets: Sequence[Mapping[str, Any]],
    k: int,
    *,
    input_shapes: Mapping[str, Sequence[int | str]] | None = None,
    exact_dims: Sequence[str] = (),
    allow_narrower: bool = False,
    anchor: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The proposal for ``observed`` ((dims, count) per shape) served today by ``current_buckets`` (the
    manifest's ``buckets``, each with its ``dims``): ``current``, ``default``, ``proposed`` (each
    ``expected_cost``'s figures), ``gain`` (cost ratios, wastes), ``coverage``, ``cost_basis`` and ``notes``.

    A new version never serves less than the one it replaces: unless ``allow_narrower``, the proposed
    buckets reach at least as far in every dim as the current largest bucket, however short the traffic was
    (the planner is given that shape with no requests: a dim's largest candidate value is always a bucket).

    ``anchor``: the job's latency figure for one bucket (``bucket``, ``dims``, ``seconds``, ``complete``,
    ``label``), the size the expected costs are scaled to (module docstring); without one they are the cost
    model's own seconds, and the basis says so."""
    observed, notes = rounded(observed)
    tracker = ShapeTracker(model, input_shapes=input_shapes)
    tracker.infer()
    cost, basis, anchored = _anchored(*tracker.traffic_cost(target), anchor)
    memo: dict[tuple, float] = {}

    def cached(dims: Mapping[str, int]) -> float:
        key = tuple(sorted(dims.items()))
        if key not in memo:
            memo[key] = cost(dims)
        return memo[key]

    dims = list(observed[0][0])
    current_grid = _grid(current_buckets)
    reach = {d: max(current_grid[d]) for d in dims if current_grid.get(d)}
    # The current largest bucket, as a shape with no requests: the proposal keeps serving up to it.
    keep = [] if allow_narrower or set(reach) != set(dims) else [(reach, 0)]
    choice = choose_traffic_buckets(observed + keep, k, cached, basis)
    current = expected_cost(observed, current_grid, cached)
    try:
        default_grid = {
            d: v for d, v in _grid([b.as_dict() for b in tracker.buckets(None, target)]).items() if d in dims
        }
        default = expected_cost(observed, default_grid, cached)
    except FlexDSAError:
        default = {"buckets": None, "note": f"{target.name} has no default buckets for these dims"}
    proposed = expected_cost(observed, choice.chosen, cached)
    if exact_dims:
        notes.append(
            f"padding {', '.join(exact_dims)} changes this model's outputs: the runtime serves only exact bucket sizes "
            "there, so requests between the proposed values stay refused"
        )
    if current["unserved_requests"]:
        notes.append(
            f"{current['unserved_requests']} request(s) larger than every current bucket are priced at their own "
            "shape (a new exact bucket, as the run-time policy says); the runtime refused them"
        )

    coverage = _coverage(reach, choice.chosen)
    if coverage["narrower"]:
        notes.append(
            "the proposed buckets serve less than the current ones ("
            + ", ".join(f"{d} up to {coverage['proposed'][d]}, now {reach[d]}" for d in coverage["narrower"])
            + "): requests past them would be refused (allow_narrower)"
        )
    elif keep and any(coverage["proposed"][d] > max(v[d] for v, _ in observed) for d in reach):
        notes.append(
            "the proposed buckets keep serving up to "
            + ", ".join(f"{d} = {reach[d]}" for d in reach)
            + ", as the current version does, though the traffic's largest shapes were smaller"
        )

    def ratio(a: dict, b: dict) -> float | None:
        if b.get("expected_cost_s") in (None, 0) or a.get("expected_cost_s") is None:
            return None
        return a["expected_cost_s"] / b["expected_cost_s"]

    complete = anchored["complete"] if anchored else True
    for row in (current, default, proposed):
        if row.get("expected_cost_s") is not None:
            row["expected_cost_text"] = bound_text(seconds_text(row["expected_cost_s"]), complete)
    return {
        "requests": sum(count for _, count in observed),
        "max_buckets": k,
        "cost_basis": basis,
        "anchor": anchored,
        "padding_waste_of": "cost: (expected cost - the cost of each request at its own shape) / the latter",
        "current": current,
        "default": default,
        "proposed": {**proposed, "evenly_spaced": choice.evenly_spaced},
        "gain": {
            "cost_vs_current": ratio(proposed, current),
            "cost_vs_default": ratio(proposed, default),
            "waste_current": current["padding_waste"],
            "waste_proposed": proposed["padding_waste"],
            "changes_buckets": proposed["buckets"] != current["buckets"],
        },
        "coverage": coverage,
        "notes": notes,
        "cost_evaluations": len(memo),
    }


def _anchored(cost, basis: str, anchor: Mapping[str, Any] | None):
    """The cost function scaled to the job's figure (``propose``'s ``anchor``), its basis, and what it was
    anchored to; unchanged, with the basis saying so, where the job gives no figure."""
    if not anchor or not anchor.get("seconds"):
        return cost, f"{basis}; the cost model's own seconds (the job has no latency figure to anchor them to)", None
    at = cost(anchor["dims"])
    if not at:
        return cost, f"{basis}; the cost model's own seconds (it prices bucket {anchor['bucket']} at zero)", None
    scale = anchor["seconds"] / at
    found = {"bucket": anchor["bucket"], "dims": dict(anchor["dims"]), "figure": anchor.get("label"),
             "complete": bool(anchor.get("complete", True)), "model_cost_s": at, "scale": scale}  # fmt: skip
    basis = (
        f"{basis}; scaled so that bucket {anchor['bucket']} costs the job's latency figure for it "
        f"({anchor.get('label') or seconds_text(anchor['seconds'])}): the cost model gives how the cost changes "
        "with the shape, the job's figure its size"
    )
    return (lambda dims: cost(dims) * scale), basis, found


def _coverage(reach: Mapping[str, int], chosen: Mapping[str, Sequence[int]]) -> dict[str, Any]:
    """How far the current and the proposed buckets reach per dim, and the dims the proposal serves less of."""
    proposed = {d: max(values) for d, values in chosen.items() if values}
    narrower = sorted(d for d, value in reach.items() if proposed.get(d, value) < value)
    return {"current": dict(reach), "proposed": proposed, "narrower": narrower}
