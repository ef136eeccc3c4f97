"""Shape buckets chosen from traffic: at most K buckets that minimise the expected padded cost.

A runtime shape is served by the smallest bucket at least as large in every dim (padding the rest), so for
one dim with observed value counts ``c(v)`` and a cost per bucket size ``t(b)``, K buckets ``b_1 < ... < b_K``
(the largest observed value among them) cost ``sum_v c(v) * t(min{b_i >= v})``. ``optimal_buckets`` finds the
exact minimum by dynamic programming over the sorted values (``_best_per_size``: O(K n^2)); several dims are
split between them by trying every way of sharing K as a product of per-dim counts (``_splits``) and costing
the combined grid on the joint traffic (``choose_traffic_buckets``). ``evenly_spaced_buckets`` is the
baseline the report compares against. Used by the Shape Tracker when a request gives ``observed_shapes``.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TrafficChoice",
    "choose_traffic_buckets",
    "evenly_spaced_buckets",
    "expected_cost",
    "optimal_buckets",
]


def _served_by(value: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that fits ``value`` (buckets sorted; the last one is >= every value)."""
    return buckets[bisect.bisect_left(buckets, value)]


def _best_per_size(
    counts: Mapping[int, int], k: int, cost: Callable[[int], float]
) -> dict[int, tuple[float, list[int]]]:
    """For every size m <= k: (expected cost, buckets) of the best choice of at most m buckets for one dim.

    The sorted distinct values v_1 < ... < v_n (counts w_i, costs c_i) are cut into contiguous runs, each
    served by its last value. With W(i, j) = w_{i+1} + ... + w_j and F[m][j] the least cost of serving
    v_1..v_j with m buckets, the last at v_j::

        F[1][j] = c_j W(0, j)        F[m][j] = min_{i < j} F[m-1][i] + c_j W(i, j)

    and the answer for at most m buckets is min_{m' <= m} F[m'][n] (v_n is always a bucket). O(k n^2).
    """
    values = sorted(counts)
    n = len(values)
    costs = [cost(v) for v in values]
    prefix = list(itertools.accumulate((counts[v] for v in values), initial=0))
    best = [[math.inf] * n for _ in range(k + 1)]
    back = [[-1] * n for _ in range(k + 1)]
    for j in range(n):
        best[1][j] = costs[j] * prefix[j + 1]
    for m in range(2, min(k, n) + 1):
        for j in range(m - 1, n):
            for i in range(m - 2, j):
                candidate = best[m - 1][i] + costs[j] * (prefix[j + 1] - prefix[i + 1])
                if candidate < best[m][j]:
                    best[m][j], back[m][j] = candidate, i
    result: dict[int, tuple[float, list[int]]] = {}
    for m in range(1, k + 1):
        if m <= n:
            chosen, j = [], n - 1
            for size in range(m, 0, -1):
                chosen.append(values[j])
                j = back[size][j]
            current = (best[m][n - 1], sorted(chosen))
            # More buckets only where they pay: each is a compile and a model to ship.
            if m == 1 or current[0] < result[m - 1][0] * (1 - 1e-9):
                result[m] = current
                continue
        result[m] = result[m - 1]
    return result


def optimal_buckets(counts: Mapping[int, int], k: int, cost: Callable[[int], float]) -> list[int]:
    """At most ``k`` bucket values for one dim (value -> count) minimising sum(count * cost(bucket serving
    it)), each value served by the smallest bucket >= it. Exact; see ``_best_per_size``."""
    return _best_per_size(counts, k, cost)[k][1]


def evenly_spaced_buckets(values: Sequence[int], k: int) -> list[int]:
    """The baseline: ``k`` equal-width steps from min to max (lo + (hi - lo) i / k, i = 1..k), each rounded
    up to the nearest observed value; fewer when two round to the same value."""
    observed = sorted(set(values))
    lo, hi = observed[0], observed[-1]
    chosen = set()
    for i in range(1, k + 1):
        # Integer arithmetic: the smallest observed v with v k >= lo k + (hi - lo) i.
        chosen.add(next(v for v in observed if v * k >= lo * k + (hi - lo) * i))
    return sorted(chosen)


@dataclass
class TrafficChoice:
    """What ``choose_traffic_buckets`` chose, its expected cost and padding waste, and the baseline's."""

    observed: dict[str, Any]
    k: int
    chosen: dict[str, list[int]]
    expected_cost_s: float
    padding_waste: float
    evenly_spaced: dict[str, Any]
    cost_basis: str
    cost_evaluations: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "observed": self.observed,
            "k": self.k,
            "chosen": self.chosen,
            "expected_cost_s": self.expected_cost_s,
            "padding_waste": self.padding_waste,
            "evenly_spaced": self.evenly_spaced,
            "cost_basis": self.cost_basis,
            "cost_evaluations": self.cost_evaluations,
        }


def choose_traffic_buckets(
    observed: Sequence[tuple[Mapping[str, int], int]],
    k: int,
    cost: Callable[[Mapping[str, int]], float],
    cost_basis: str = "",
) -> TrafficChoice:
    """At most ``k`` buckets for traffic ``observed`` ((dims, count) pairs, every entry naming the same dims)
    minimising the expected cost sum(count * cost(bucket serving the shape)), where a shape is served by the
    smallest bucket that fits it in every dim (padded up to it); buckets are the product of per-dim values.

    Dims are chosen per dim, independently, with ``k`` shared out among the dims that vary (every split
    whose product is <= k is tried). Only observed values are candidates, so a dim's largest observed value
    is always a bucket. ``cost`` is evaluated once per distinct value per dim, every other dim at its
    largest observed value (the reference r), and cached: c_d(v) = cost(r with d = v). A shape x is then
    costed as cost(r) * prod_d c_d(x_d) / cost(r), exact when one dim varies (the usual case: seq) and for
    costs of the form f(batch) g(seq); otherwise an estimate, and the per-dim choice is exact for that model
    only when the dims are independent in the traffic.

    Reported: expected_cost_s, the mean cost per request, sum(count * cost(served)) / sum(count), and
    padding_waste = sum(count * (cost(served) - cost(own))) / sum(count * cost(own)); the same figures for
    ``evenly_spaced_buckets`` with the same number of values per dim.
    """
    names = list(observed[0][0])
    merged: Counter = Counter()
    for dims, count in observed:  # the same shape listed twice is one shape with the counts added
        merged[tuple(dims[name] for name in names)] += count
    observed = [(dict(zip(names, shape, strict=True)), count) for shape, count in merged.items()]
    reference = {name: max(dims[name] for dims, _ in observed) for name in names}
    marginal: dict[str, Counter] = {name: Counter() for name in names}
    for dims, count in observed:
        for name in names:
            marginal[name][dims[name]] += count

    evaluated: dict[tuple[tuple[str, int], ...], float] = {}

    def cost_of(dims: dict[str, int]) -> float:
        key = tuple(sorted(dims.items()))
        if key not in evaluated:
            evaluated[key] = float(cost(dims))
        return evaluated[key]

    def cost_at(name: str, value: int) -> float:
        return cost_of({**reference, name: value})

    base = cost_of(reference)

    def shape_cost(point: Mapping[str, int]) -> float:
        if base <= 0:
            return sum(cost_at(name, point[name]) for name in names)
        return base * math.prod(cost_at(name, point[name]) / base for name in names)

    requests = sum(count for _, count in observed)

    def expected(buckets: Mapping[str, Sequence[int]]) -> tuple[float, float]:
        """Seconds per request on average, and the padding waste."""
        total = own = 0.0
        for dims, count in observed:
            total += count * shape_cost({name: _served_by(dims[name], buckets[name]) for name in names})
            own += count * shape_cost(dims)
        return total / requests, (total - own) / own if own > 0 else 0.0

    per_dim = {name: _best_per_size(marginal[name], k, functools.partial(cost_at, name)) for name in names}
    varying = [name for name in names if len(marginal[name]) > 1]
    best: tuple[float, int, dict[str, int]] | None = None
    for sizes in _splits([min(k, len(marginal[name])) for name in varying], k):
        split = dict(zip(varying, sizes, strict=True))
        buckets = {name: per_dim[name][split.get(name, 1)][1] for name in names}
        total = expected(buckets)[0]
        count = math.prod(len(b) for b in buckets.values())
        if (
            best is None
            or total < best[0] * (1 - 1e-9)
            or (total <= best[0] * (1 + 1e-9) and count < best[1])
        ):
            best = (total, count, split)
    split = best[2]
    chosen = {name: per_dim[name][split.get(name, 1)][1] for name in names}
    chosen_cost, chosen_waste = expected(chosen)
    even = {name: evenly_spaced_buckets(list(marginal[name]), split.get(name, 1)) for name in names}
    even_cost, even_waste = expected(even)
    return TrafficChoice(
        observed={
            "requests": requests,
            "distinct_shapes": len({tuple(sorted(dims.items())) for dims, _ in observed}),
            "dims": {
                name: {
                    "min": min(marginal[name]),
                    "max": max(marginal[name]),
                    "distinct": len(marginal[name]),
                }
                for name in names
            },
        },
        k=k,
        chosen=chosen,
        expected_cost_s=chosen_cost,
        padding_waste=chosen_waste,
        evenly_spaced={"buckets": even, "expected_cost_s": even_cost, "padding_waste": even_waste},
        cost_basis=cost_basis,
        cost_evaluations=len(evaluated),
    )


def _splits(limits: Sequence[int], k: int, product: int = 1) -> Iterator[tuple[int, ...]]:
    """Every tuple (k_1, ..., k_n) with 1 <= k_i <= limits[i] and k_1 ... k_n <= k / product."""
    if not limits:
        yield ()
        return
    for first in range(1, min(limits[0], k // product) + 1):
        for rest in _splits(limits[1:], k, product * first):
            yield (first, *rest)


def expected_cost(
    observed: Sequence[tuple[Mapping[str, int], int]],
    buckets: Mapping[str, Sequence[int]],
    cost: Callable[[Mapping[str, int]], float],
) -> dict[str, Any]:
    """The expected cost per request and padding waste of serving ``observed`` with given ``buckets`` (per-dim
    values, the grid of their product), costed as ``choose_traffic_buckets`` costs its choice (the same per-dim
    factorisation around the largest observed shape), so the two compare. A shape no bucket holds is served
    as the run-time policy says (``ShapeTracker.update``): by a new bucket of its exact shape, so it costs its
    own and wastes nothing; ``unserved`` counts those requests. A dim the buckets leave out stays dynamic."""
    names = list(observed[0][0])
    reference = {name: max(dims[name] for dims, _ in observed) for name in names}
    memo: dict[tuple[str, int], float] = {}

    def cost_at(name: str, value: int) -> float:
        if (name, value) not in memo:
            memo[(name, value)] = float(cost({**reference, name: value}))
        return memo[(name, value)]

    base = float(cost(reference))

    def shape_cost(point: Mapping[str, int]) -> float:
        if base <= 0:
            return sum(cost_at(name, point[name]) for name in names)
        return base * math.prod(cost_at(name, point[name]) / base for name in names)

    grid = {name: sorted(values) for name, values in buckets.items() if name in reference}
    total = own = 0.0
    requests = unserved = 0
    for dims, count in observed:
        requests += count
        fits = all(dims[name] <= values[-1] for name, values in grid.items())
        served = {name: _served_by(dims[name], grid[name]) if fits and name in grid else dims[name] for name in names}
        unserved += 0 if fits else count
        total += count * shape_cost(served)
        own += count * shape_cost(dims)
    return {
        "buckets": {name: list(values) for name, values in grid.items()},
        "expected_cost_s": total / requests if requests else 0.0,
        "padding_waste": (total - own) / own if own > 0 else 0.0,
        "unserved_requests": unserved,
    }
