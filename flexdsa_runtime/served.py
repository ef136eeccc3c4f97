"""Outputs a bucket's compiled artifact leaves to the runtime (``manifest.json`` → ``buckets[i].served_by_runtime``):
a graph output that is a graph input passed through, or its shape or a cast of it. rknn-toolkit2 2.5.0 dies
building a model that passes an input it consumes through to an output, so the compiler leaves such outputs out
of the ``.rknn`` and lists them here; the runtime makes each from the request's own input, by the steps listed
(``Identity``, ``Cast`` to a numpy dtype, ``Shape`` from ``start`` to ``end``), at the request's own shape.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from flexdsa_runtime.errors import BundleError

_STEPS = ("Identity", "Cast", "Shape")


def checked(served: object, bucket: str) -> list[dict]:
    """The bucket's ``served_by_runtime`` list, refused when a step is not one the runtime knows."""
    entries = list(served or [])
    for entry in entries:
        steps = entry.get("steps") if isinstance(entry, Mapping) else None
        if (
            not isinstance(steps, list)
            or not isinstance(entry.get("output"), str)
            or not isinstance(entry.get("input"), str)
        ):
            raise BundleError(f"bucket {bucket!r}: a served_by_runtime entry is malformed: {entry!r}")
        for step in steps:
            if not isinstance(step, Mapping) or step.get("op") not in _STEPS:
                raise BundleError(
                    f"bucket {bucket!r}: served output {entry['output']!r} has an unknown step {step!r}"
                )
            if step["op"] == "Cast":
                np.dtype(step.get("to"))  # raises TypeError on a dtype numpy does not know
    return entries


def serve(served: list[dict], inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each served output, made from ``inputs`` (the request's arrays, by input name)."""
    found = {}
    for entry in served:
        value = np.asarray(inputs[entry["input"]])
        for step in entry["steps"]:
            if step["op"] == "Cast":
                value = value.astype(step["to"])
            elif step["op"] == "Shape":
                value = np.array(value.shape[step.get("start") or 0 : step.get("end")], dtype=np.int64)
        found[entry["output"]] = (
            value.astype(entry["dtype"]) if entry.get("dtype") else value
        )  # the model's dtype
    return found
