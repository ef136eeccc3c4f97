"""Does the model tolerate padding? Checked on the original model, per bucketed dim, before a bundle ships.

A deployed bundle serves a request smaller than its bucket by padding each bucketed axis at the end up to
the bucket's size and cropping the outputs back (``flexdsa_runtime``). That is only right when the outputs at
the real positions do not change: true for a transformer whose attention mask covers the padded keys (the
mask padded with 0 "ignore"), for a causal decoder (later positions never reach earlier ones), for rows of a
batch; false for a CNN over a padded image, or mean pooling without the mask. So, per dim ``d`` that some
bucket fixes to ``V >= 2``::

    y_small = original(x at d = v)                 v = V // 2, other dims at their smallest bucket value
    y_pad   = original(pad(x, d -> V)) cropped back to v along every output axis that carries d
    tolerated  <=>  y_pad == y_small within the validation tolerances (exact for integer outputs)

Pad values: 0 for every input (False for booleans), which is "ignore" for 0/1 attention masks; where that
fails and the model has mask-like inputs (``mask`` in the name), the other convention is tried for them
(1/True for integer and boolean masks, the dtype's lowest value for an additive float mask). The crop axes
come from the original model's symbolic output shapes (an output axis named ``d``), and where inference left
an output dim unknown, from the two runs (the axis that is ``v`` in one and ``V`` in the other). An output
axis that depends on ``d`` through an expression (``seq + 1``) cannot be cropped: the dim is then not
tolerated, with that reason. The result goes to ``manifest.json`` (``runtime``), where the runtime reads which
dims it may pad, with which values, and which output axes to crop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

__all__ = ["check_padding", "pad_to"]

# The second pad value tried for mask-like inputs, by kind, when zeros change the outputs.
_MASK_NAME = "mask"


def pad_to(array: np.ndarray, axis: int, size: int, value: Any) -> np.ndarray:
    """``array`` padded at the end of ``axis`` up to ``size`` with ``value``."""
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, size - array.shape[axis])
    return np.pad(array, widths, mode="constant", constant_values=value)


def _mask_alternative(dtype: np.dtype) -> Any:
    if dtype == np.bool_:
        return True
    if np.issubdtype(dtype, np.integer):
        return 1
    return float(np.finfo(dtype).min)


def _zero(dtype: np.dtype) -> Any:
    return False if dtype == np.bool_ else 0


def check_padding(
    original,
    inputs_proto: onnx.ModelProto,
    shape_manifest: Mapping[str, Any],
    output_shapes: Mapping[str, list | None],
    *,
    seed: int = 0,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
) -> dict[str, Any]:
    """Per bucketed dim: whether padding it keeps the outputs, the pad value per input, the output axes to crop.

    ``original``: what ``validate.run`` takes (the original model); ``inputs_proto``: its inputs (and Gather
    tables' shapes) for ``validate.make_inputs``; ``shape_manifest``: ``ShapeTracker.manifest()``;
    ``output_shapes``: the Shape Tracker's symbolic output shapes of the original model.
    """
    from flexdsa_core.ort_runs import _check_output, make_inputs, run, session

    where: dict[str, list[dict]] = dict(shape_manifest.get("dims") or {})
    buckets = shape_manifest.get("buckets") or []
    values = {d: sorted({b["dims"][d] for b in buckets if d in b.get("dims", {})}) for d in where}
    padded_dims = {d: v for d, v in values.items() if v}
    result: dict[str, Any] = {"dims": {}, "pad_values": {}, "crop": {}}
    if not padded_dims:
        result["note"] = "no bucket fixes a dynamic dim: requests run at their own shape, nothing is padded"
        return result
    base = {d: v[0] for d, v in padded_dims.items()}
    dtypes = {
        v.name: onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
        for v in inputs_proto.graph.input
    }
    initializers = {init.name for init in inputs_proto.graph.initializer}
    runtime_inputs = [name for name in dtypes if name not in initializers]
    pad_values = {name: _zero(np.dtype(dtypes[name])) for name in runtime_inputs}
    masks = [name for name in runtime_inputs if _MASK_NAME in name.lower()]
    tolerances = dict(tolerances or {})
    model_session = None

    def outputs(feeds: dict) -> dict[str, np.ndarray]:
        nonlocal model_session
        if model_session is None:
            model_session = session(original)
        return run(model_session, feeds, what="padding check")

    for dim, sizes in padded_dims.items():
        big = next((s for s in sizes if s >= 2), None)
        if big is None:
            result["dims"][dim] = {
                "tolerated": None,
                "note": f"never padded: every bucket has {dim} = {sizes[0]}",
            }
            continue
        small = big // 2
        dims = {**base, dim: small}
        try:
            feeds = make_inputs(inputs_proto, seed=seed, dims=dims)
            want = outputs(feeds)
        except Exception as err:  # noqa: BLE001 - a shape the model refuses is a finding, not a crash
            result["dims"][dim] = {  # unchecked means not padded: the runtime serves exact sizes only
                "tolerated": False,
                "reason": f"the original model could not be run at {dim} = {small} to check ({err})",
            }
            continue
        candidates = [dict(pad_values)]
        if masks:
            candidates.append({**pad_values, **{m: _mask_alternative(np.dtype(dtypes[m])) for m in masks}})
        found: dict[str, Any] | None = None
        for values_tried in candidates:
            verdict = _padded_matches(
                outputs, feeds, want, where[dim], dim, small, big, values_tried, output_shapes, tolerances,
                _check_output,
            )  # fmt: skip
            if verdict["tolerated"]:
                found = verdict
                pad_values = values_tried
                break
            found = found or verdict
        result["dims"][dim] = found
        if found["tolerated"]:
            for output, axes in found.pop("crop").items():
                result["crop"].setdefault(output, {})[dim] = axes
        else:
            found.pop("crop", None)
    result["pad_values"] = {name: _plain(value) for name, value in pad_values.items()}
    return result


def _padded_matches(
    outputs, feeds, want, where, dim, small, big, pad_values, output_shapes, tolerances, check_output
) -> dict[str, Any]:
    padded = dict(feeds)
    for place in where:
        name, axis = place["input"], place["axis"]
        padded[name] = pad_to(padded[name], axis, big, pad_values[name])
    checked = {"runtime": small, "bucket": big, "pad_values": {m: _plain(pad_values[m]) for m in pad_values}}
    try:
        got = outputs(padded)
    except Exception as err:  # noqa: BLE001
        return {"tolerated": False, "checked": checked, "reason": f"the padded input does not run: {err}"}
    crop: dict[str, list[int]] = {}
    worst = 0.0
    for name, expected in want.items():
        value = got[name]
        axes, reason = _crop_axes(output_shapes.get(name), dim, expected.shape, value.shape, small, big)
        if reason:
            return {"tolerated": False, "checked": checked, "reason": f"output {name!r}: {reason}"}
        index = tuple(slice(0, small) if a in axes else slice(None) for a in range(value.ndim))
        cropped = value[index]
        check = check_output(name, expected, cropped, tolerances)
        if not check.ok:
            return {
                "tolerated": False,
                "checked": {**checked, "max_abs": check.max_abs},
                "reason": (
                    f"padding {dim} from {small} to {big} changes output {name!r} at the real positions (max |Δ| "
                    f"{check.max_abs:.3g}, tolerance atol {check.atol:g} rtol {check.rtol:g})"
                ),
            }
        worst = max(worst, check.max_abs)
        if axes:
            crop[name] = axes
    return {"tolerated": True, "checked": {**checked, "max_abs": worst}, "crop": crop}


def _crop_axes(
    symbolic, dim: str, small_shape, big_shape, small: int, big: int
) -> tuple[list[int], str | None]:
    """The output axes that carry ``dim`` (cropped back after a padded run), or a reason they cannot be."""
    if len(small_shape) != len(big_shape):
        return [], f"rank {len(big_shape)} when padded, {len(small_shape)} unpadded"
    axes = []
    for axis, (a, b) in enumerate(zip(small_shape, big_shape, strict=True)):
        named = symbolic[axis] if symbolic is not None and axis < len(symbolic) else None
        if isinstance(named, str) and named == dim:
            axes.append(axis)
        elif isinstance(named, str) and dim in _symbols(named):
            return [], f"axis {axis} is {named!r}, an expression of {dim!r} the runtime cannot crop back"
        elif a != b:
            if (a, b) == (small, big):
                axes.append(axis)  # inference left this dim unknown; the runs say it follows dim
            else:
                return [], f"axis {axis} is {b} when padded and {a} unpadded: not a crop of {dim!r}"
    return axes, None


def _symbols(expression: str) -> set[str]:
    import re

    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", expression))


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return value
