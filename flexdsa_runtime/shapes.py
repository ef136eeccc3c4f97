"""The manifest's run-time shape policy: read a request's dims, pick its bucket, pad up to it, crop back.

Policy ``fewest_padded_elements`` (the Shape Tracker's ``update``): among the buckets whose every dim is >= the
request's, the one with the fewest padded input elements, sum over inputs of prod(shape padded to the bucket);
ties go to a bucket that fixes dims over a dynamic one, then to the name. A dim the compiler found padding
changes (``runtime.padding[dim].tolerated`` false) must match a bucket exactly; one nothing pads (every
bucket 1) likewise. Padding goes at the end of each bucketed axis, with the input's pad value (0: an
attention mask 0 there, so the padded keys are ignored); outputs are cropped back along ``runtime.crop``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from flexdsa_runtime.bundle import BucketSpec
from flexdsa_runtime.errors import ShapeRefused


@dataclass(frozen=True)
class Choice:
    """The bucket for one request: the request's dims, and its input elements before and after padding."""

    bucket: BucketSpec
    dims: dict[str, int]
    elements: int
    padded_elements: int

    @property
    def padded(self) -> bool:
        return self.padded_elements != self.elements


class ShapePolicy:
    """The manifest's ``runtime`` section, ready to answer per request (no per-request parsing)."""

    def __init__(self, runtime: Mapping[str, Any], buckets: list[BucketSpec]) -> None:
        if runtime.get("policy") != "fewest_padded_elements":
            raise ShapeRefused(
                f"unknown bucket policy {runtime.get('policy')!r}: this runtime is older than the bundle"
            )
        self.buckets = buckets
        self.places: dict[str, list[tuple[str, int]]] = {
            dim: [(p["input"], p["axis"]) for p in where]
            for dim, where in (runtime.get("dims") or {}).items()
        }
        padding = runtime.get("padding") or {}
        bucketed = {d for b in buckets for d in b.dims}
        # Padded only where the compiler checked that padding keeps the outputs; anything else exactly.
        self.exact = {d for d in bucketed if (padding.get(d) or {}).get("tolerated") is not True}
        self.reasons = {d: rule.get("reason") or rule.get("note", "") for d, rule in padding.items()}
        self.pad_values: dict[str, Any] = dict(runtime.get("pad_values") or {})
        self.crop: dict[str, dict[str, list[int]]] = dict(runtime.get("crop") or {})
        self.inputs: list[str] = list((runtime.get("inputs") or {}).keys())
        # The largest value the model itself takes per dim, where it has one (older bundles: none known).
        self.limits: dict[str, int] = dict(runtime.get("limits") or {})
        # Per input, per axis: the dim it carries (for counting padded elements).
        self.axes: dict[str, dict[int, str]] = {}
        for dim, places in self.places.items():
            for name, axis in places:
                self.axes.setdefault(name, {})[axis] = dim

    # ---- reading a request -----------------------------------------------------------------------
    def dims_of(self, inputs: Mapping[str, np.ndarray]) -> dict[str, int]:
        """The value of each dynamic dim in this request; inputs that disagree on a dim are refused."""
        missing = [name for name in self.inputs if name not in inputs]
        unknown = [name for name in inputs if self.inputs and name not in self.inputs]
        if missing or unknown:
            raise ShapeRefused(
                f"the model takes inputs {self.inputs}; missing {missing}, unknown {unknown}",
                details={"missing": missing, "unknown": unknown, "inputs": self.inputs},
            )
        dims: dict[str, int] = {}
        for dim, places in self.places.items():
            for name, axis in places:
                array = inputs[name]
                if array.ndim <= axis:
                    raise ShapeRefused(
                        f"input {name!r} has rank {array.ndim}; dim {dim!r} sits on its axis {axis}",
                        details={"input": name, "shape": list(array.shape)},
                    )
                size = int(array.shape[axis])
                if dims.setdefault(dim, size) != size:
                    raise ShapeRefused(
                        f"dim {dim!r} is {dims[dim]} on one input and {size} on {name!r}: inputs sharing a dim must agree",
                        details={"dim": dim},
                    )
        return dims

    # ---- choosing ----------------------------------------------------------------------------------
    def _elements(self, shapes: Mapping[str, tuple[int, ...]], bucket: BucketSpec | None) -> int:
        total = 0
        for name, shape in shapes.items():
            axes = self.axes.get(name, {})
            total += math.prod(
                bucket.dims.get(axes[a], size) if bucket is not None and a in axes else size
                for a, size in enumerate(shape)
            )
        return total

    def fits(self, bucket: BucketSpec, dims: Mapping[str, int]) -> bool:
        for dim, value in bucket.dims.items():
            size = dims.get(dim)
            if size is None:
                continue
            if size > value or (dim in self.exact and size != value):
                return False
        return True

    def choose(self, inputs: Mapping[str, np.ndarray]) -> Choice:
        dims = self.dims_of(inputs)
        past = {d: v for d, v in dims.items() if d in self.limits and v > self.limits[d]}
        if past:
            named = ", ".join(f"{d} = {v} (this model takes at most {self.limits[d]})" for d, v in past.items())
            raise ShapeRefused(
                f"the request has {named}: past the model's own limit, which no bucket and no re-specialisation "
                "can serve. Truncate or split the input to fit.",
                details={"dims": dict(dims), "limits": {d: self.limits[d] for d in past}, "over_limit": past},
            )
        shapes = {name: array.shape for name, array in inputs.items()}
        fitting = [b for b in self.buckets if self.fits(b, dims)]
        if not fitting:
            raise self._refusal(dims)
        best = min(fitting, key=lambda b: (self._elements(shapes, b), len(b.dims) == 0, b.name))
        return Choice(best, dims, self._elements(shapes, None), self._elements(shapes, best))

    def _refusal(self, dims: Mapping[str, int]) -> ShapeRefused:
        values = {d: sorted({b.dims[d] for b in self.buckets if d in b.dims}) for d in self.places}
        over = {d: v for d, v in dims.items() if values.get(d) and v > max(values[d])}
        details = {"dims": dict(dims), "bucket_values": values}
        if over:
            named = ", ".join(
                f"{d} = {v} (largest bucket {max(values[d])}"
                + (f"; the model takes up to {self.limits[d]})" if d in self.limits else ")")
                for d, v in over.items()
            )
            return ShapeRefused(
                f"the request has {named}: larger than every bucket of this static-shape bundle. Re-specialise "
                "with this shape (send the traffic and POST /jobs/{id}/respecialise), or truncate the input.",
                details={**details, "over": over},
            )
        blocked = [d for d in self.exact if d in dims and values.get(d) and dims[d] not in values[d]]
        named = ", ".join(
            f"{d} = {dims[d]} (buckets {values[d]}: {self.reasons.get(d) or 'not padded'})" for d in blocked
        )
        return ShapeRefused(
            f"the request has {named}: this model's outputs change when that dim is padded, so it is served only "
            "at a bucket's exact size. Send one of those sizes, or re-specialise with this one.",
            details={**details, "exact_only": blocked},
        )

    # ---- padding and cropping ------------------------------------------------------------------------
    def pad(
        self, inputs: Mapping[str, np.ndarray], choice: Choice, dtypes: Mapping[str, np.dtype]
    ) -> dict[str, np.ndarray]:
        """The inputs padded up to the bucket (a new array only where an axis grows), in the model's dtypes."""
        feeds = {}
        for name, array in inputs.items():
            dtype = dtypes.get(name)
            if dtype is not None and array.dtype != dtype:
                array = array.astype(dtype)
            axes = self.axes.get(name)
            if axes:
                shape = tuple(
                    choice.bucket.dims.get(axes[a], size) if a in axes else size
                    for a, size in enumerate(array.shape)
                )
                if shape != array.shape:
                    grown = np.full(shape, self.pad_values.get(name, 0), dtype=array.dtype)
                    grown[tuple(slice(0, size) for size in array.shape)] = array
                    array = grown
            feeds[name] = array
        return feeds

    def crop_outputs(self, outputs: dict[str, np.ndarray], choice: Choice) -> dict[str, np.ndarray]:
        """Outputs sliced back to the request's dims along the axes the manifest names (views, no copies)."""
        if not choice.padded:
            return outputs
        for name, per_dim in self.crop.items():
            value = outputs.get(name)
            if value is None:
                continue
            index = [slice(None)] * value.ndim
            for dim, axes in per_dim.items():
                size = choice.dims.get(dim)
                if size is None or choice.bucket.dims.get(dim, size) == size:
                    continue
                for axis in axes:
                    index[axis] = slice(0, size)
            outputs[name] = value[tuple(index)]
        return outputs


# ---- what a version serves ----------------------------------------------------------------------------

_UNBOUNDED = None


def _served_values(policy: ShapePolicy, dim: str) -> set[int] | int | None:
    """What ``policy`` serves of ``dim``: None (any value: no bucket fixes it), an int n (every value 1..n,
    padded up), or a set (exact values only)."""
    values = sorted({b.dims[dim] for b in policy.buckets if dim in b.dims})
    if not values or any(dim not in b.dims for b in policy.buckets):
        return _UNBOUNDED
    return set(values) if dim in policy.exact else values[-1]


def _ranges(values: list[int]) -> str:
    runs, start = [], None
    for index, value in enumerate(values):
        if start is None:
            start = value
        if index + 1 == len(values) or values[index + 1] != value + 1:
            runs.append(f"{start}" if start == value else f"{start}-{value}")
            start = None
    return ", ".join(runs)


def lost_shapes(old: ShapePolicy, new: ShapePolicy) -> dict[str, str]:
    """Per dim, the values ``old`` serves that ``new`` refuses (``{"seq": "57-64"}``); empty when ``new``
    serves at least everything ``old`` does."""
    lost = {}
    for dim in old.places:
        before, after = _served_values(old, dim), _served_values(new, dim)
        if after is _UNBOUNDED or before == after:
            continue
        if before is _UNBOUNDED:
            top = after if isinstance(after, int) else max(after)
            lost[dim] = f"above {top}" if isinstance(after, int) else f"every value but {_ranges(sorted(after))}"
            continue
        wanted = set(range(1, before + 1)) if isinstance(before, int) else before
        kept = set(range(1, after + 1)) if isinstance(after, int) else after
        missing = sorted(wanted - kept)
        if missing:
            lost[dim] = _ranges(missing)
    return lost
