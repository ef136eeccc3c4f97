"""Task-aware accuracy of a lower-precision model against the fp32 original, with a confidence bound.

Per output, by its metric (``AccuracyTarget.outputs``, else by its look):

* ``cosine``: ``cos(a, b) = sum_i a_i.b_i / sqrt(sum_i |a_i|^2 * sum_i |b_i|^2)`` over every sample ``i``
  (and the worst single sample, reported);
* ``top1``: the cosine, the share of rows whose argmax along ``axis`` agrees, and the agreement expected on
  rows like these that were not among them (``top1_expected``, below);
* ``slices``: the cosine of the whole, and each named slice along ``axis`` judged alone (cosine or top-1):
  an output that packs boxes in pixels (0..640) with scores in 0..1 keeps a whole-tensor cosine of 0.998
  while its scores are lost; a slice cannot hide behind another.

Expected top-1 (``top1_expected``): a few judged rows can all agree while the model flips one row in ten of
the next photo's (EfficientNet-Lite0 int8: 22 of 22 crops agreed, 76 of 85 crops of other photos). Each judged
row says how near it came: ``d_i``, the lead the original's top class lost over the original's runner-up,
``max(0, (a_c - a_r) - (b_c - b_r))``; each row's original margin ``m_k = a_c - a_r`` is how much lead a
row has to lose. A row flips when it loses more than its margin, so the agreement expected on rows whose
margins are like the judged ones is ``1 - mean over (i, k) of [d_i > m_k]``: every loss paired with every
margin (on that model: 0.905 from the 22 crops, against 0.894 found on the 85). A top-1 target holds only
when both the agreement found and the agreement expected reach it.

Bounds (``*_bound``, one-sided 95%): for top-1 the Wilson lower bound of the agreement rate over its rows,
``(p + z^2/2n - z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)``, z = 1.645; for a cosine the 5th percentile of
the pooled cosine over ``BOOTSTRAP`` resamplings of the samples (seeded). Decisions take the figure itself;
the bound says how far a few samples can be trusted.
"""

from __future__ import annotations

import numpy as np

from flexdsa_core.errors import InvalidOptionsError
from flexdsa_core.options import AccuracyTarget, OutputMetric

__all__ = ["check_outputs", "metrics_for", "score"]

_CLASSIFIER_WORDS = ("logit", "prob", "score", "class")
# Outputs named like these are embeddings or features: their top-1 means nothing (cosine).
_EMBEDDING_WORDS = ("embed", "pool", "hidden", "feature", "state", "vector")
BOOTSTRAP = 400
_Z = 1.6448536269514722  # one-sided 95%


def check_outputs(accuracy: AccuracyTarget, outputs: dict[str, list]) -> None:
    """Refuse metrics naming outputs the model does not have, and slices past the end of a known axis
    (``outputs``: name -> shape, dims as ints or names)."""
    named = dict(accuracy.outputs or {})
    unknown = sorted(set(named) - set(outputs))
    unknown += sorted(set(accuracy.top1_outputs or []) - set(outputs) - set(unknown))
    if unknown:
        raise InvalidOptionsError(
            f"accuracy names outputs the model does not have: {', '.join(map(repr, unknown))}. Its outputs are: "
            + ", ".join(f"{n} {s}" for n, s in outputs.items())
            + ".",
            details={"unknown_outputs": unknown, "outputs": list(outputs)},
        )
    for name, spec in named.items():
        shape = outputs[name]
        if spec.metric == "cosine" or shape is None:
            continue
        rank = len(shape)
        if not -rank <= spec.axis < rank:
            raise InvalidOptionsError(
                f"accuracy.outputs[{name!r}].axis {spec.axis} is outside output {name!r} of rank {rank} {shape}.",
                details={"output": name, "axis": spec.axis, "shape": shape},
            )
        size = shape[spec.axis]
        for slice_name, part in (spec.slices or {}).items():
            if isinstance(size, int) and size > 0 and part.stop > size:
                raise InvalidOptionsError(
                    f"accuracy.outputs[{name!r}] slice {slice_name!r} ends at {part.stop}, past the {size} positions "
                    f"of axis {spec.axis} of {name!r} {shape}.",
                    details={"output": name, "slice": slice_name, "axis_size": size},
                )


def metrics_for(reference: dict[str, np.ndarray], accuracy: AccuracyTarget) -> dict[str, OutputMetric]:
    """Each output's metric: as named in ``accuracy.outputs`` / ``top1_outputs``, else by its look."""
    named = dict(accuracy.outputs or {})
    if accuracy.top1_outputs is not None:
        for name in accuracy.top1_outputs:
            named.setdefault(name, OutputMetric(metric="top1"))
        classifiers: list[str] = []
    else:
        classifiers = _classifier_outputs(reference, named)
    return {
        name: named.get(name) or OutputMetric(metric="top1" if name in classifiers else "cosine")
        for name in reference
    }


def _classifier_outputs(reference: dict[str, np.ndarray], named: dict) -> list[str]:
    floats = {n: v for n, v in reference.items() if np.issubdtype(v.dtype, np.floating) and n not in named}
    looks = [n for n, v in floats.items() if v.ndim >= 2 and any(w in n.lower() for w in _CLASSIFIER_WORDS)]
    if looks:
        return looks
    if len(reference) == 1 and len(floats) == 1:
        (name, value), = floats.items()
        embedding = any(word in name.lower() for word in _EMBEDDING_WORDS)
        if value.ndim == 2 and value.shape[-1] >= 2 and not embedding:
            return [name]
    return []


def _cosine(want: np.ndarray, got: np.ndarray) -> float:
    want, got = want.astype(np.float64).ravel(), got.astype(np.float64).ravel()
    norms = float(np.linalg.norm(want) * np.linalg.norm(got))
    if norms == 0.0:
        return 1.0 if not want.any() and not got.any() else 0.0
    return float(want @ got / norms)


def _pooled_cosine(want: list[np.ndarray], have: list[np.ndarray]) -> tuple[float, float | None, float]:
    """(cosine over all samples, its bootstrap lower bound or None for one sample, worst single sample)."""
    dots, wants, haves, singles = [], [], [], []
    for w, h in zip(want, have, strict=True):
        w, h = w.astype(np.float64).ravel(), h.astype(np.float64).ravel()
        dots.append(float(w @ h))
        wants.append(float(w @ w))
        haves.append(float(h @ h))
        singles.append(_cosine(w, h))
    dots, wants, haves = np.array(dots), np.array(wants), np.array(haves)
    if not all(np.isfinite(h).all() for h in have):
        return 0.0, 0.0 if len(want) > 1 else None, 0.0
    whole = _cosine(np.concatenate([w.ravel() for w in want]), np.concatenate([h.ravel() for h in have]))
    if len(want) < 2:
        return whole, None, min(singles)
    picks = np.random.default_rng(0).integers(0, len(want), size=(BOOTSTRAP, len(want)))
    denominators = np.sqrt(wants[picks].sum(1) * haves[picks].sum(1))
    resampled = np.where(denominators > 0, dots[picks].sum(1) / np.where(denominators > 0, denominators, 1), 1.0)
    return whole, float(np.percentile(resampled, 5)), min(singles)


def _wilson_lower(agreement: float, rows: int) -> float:
    if rows == 0:
        return 0.0
    z2 = _Z * _Z
    centre = agreement + z2 / (2 * rows)
    spread = _Z * np.sqrt(agreement * (1 - agreement) / rows + z2 / (4 * rows * rows))
    return float((centre - spread) / (1 + z2 / rows))


def _top1(want: list[np.ndarray], have: list[np.ndarray], axis: int) -> tuple[float, int]:
    rows_want = np.concatenate([np.argmax(w, axis=axis).ravel() for w in want])
    rows_have = np.concatenate([np.argmax(h, axis=axis).ravel() for h in have])
    return float(np.mean(rows_want == rows_have)), int(rows_want.size)


def _leads(want: np.ndarray, have: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row of one sample: the original's margin of its top class over its runner-up, and how much of that
    lead ``have`` lost. One sample at a time, so a language model's logits are never copied whole."""
    rows_want = np.moveaxis(want, axis, -1).reshape(-1, want.shape[axis])
    rows_have = np.moveaxis(have, axis, -1).reshape(-1, have.shape[axis])
    top = np.argmax(rows_want, axis=-1)  # the first of equal maxima, as the top-1 agreement takes it
    index = np.arange(len(rows_want))
    others = rows_want.astype(np.promote_types(rows_want.dtype, np.float32))  # a copy that can hold -inf
    others[index, top] = -np.inf
    runner_up = np.argmax(others, axis=-1)
    del others

    def lead(rows: np.ndarray) -> np.ndarray:
        return rows[index, top].astype(np.float64) - rows[index, runner_up].astype(np.float64)

    margins = lead(rows_want)
    return margins, np.maximum(0.0, margins - lead(rows_have))


def _top1_expected(want: list[np.ndarray], have: list[np.ndarray], axis: int) -> float:
    """1 - the share of (row i, row k) pairs where row i's lost lead over its runner-up exceeds row k's
    margin (module doc-string). Rows of one class count as agreeing."""
    if not want or want[0].shape[axis] < 2 or not want[0].size:
        return 1.0
    pairs = [_leads(w, h, axis) for w, h in zip(want, have, strict=True)]
    margins = np.concatenate([m for m, _ in pairs])
    lost = np.concatenate([lo for _, lo in pairs])
    if not np.isfinite(lost).all():
        return 0.0
    below = np.searchsorted(np.sort(margins), lost, side="left")  # margins strictly below each loss
    return float(1.0 - below.sum() / (len(margins) * len(lost)))


def _cut(arrays: list[np.ndarray], axis: int, start: int, stop: int) -> list[np.ndarray]:
    size = arrays[0].shape[axis]
    if stop > size:
        raise InvalidOptionsError(
            f"an accuracy slice {start}:{stop} runs past the {size} positions of its output's axis {axis}.",
            details={"start": start, "stop": stop, "axis_size": size},
        )
    return [np.take(a, np.arange(start, stop), axis=axis) for a in arrays]


def score(reference: list[dict], got: list[dict], accuracy: AccuracyTarget) -> dict:
    """Accuracy of ``got`` against ``reference`` (outputs per sample) by each output's metric
    (``metrics_for``): the figures with their bounds, whether the target holds, ``samples`` (how many it was
    measured on) and ``loss`` (1 - the worst figure: what a layer's sensitivity is)."""
    metrics = metrics_for(reference[0], accuracy) if reference else {}
    outputs, worst = {}, 1.0
    for name, spec in metrics.items():
        want = [sample[name] for sample in reference]
        have = [sample[name] for sample in got]
        if any(w.shape != h.shape for w, h in zip(want, have, strict=True)):
            outputs[name] = {"ok": False, "detail": "shape differs from the original"}
            worst = 0.0
            continue
        entry: dict = {"metric": spec.metric}
        if np.issubdtype(want[0].dtype, np.floating):
            whole, bound, single = _pooled_cosine(want, have)
            entry.update(cosine=round(whole, 6), cosine_bound=None if bound is None else round(bound, 6),
                         worst_sample_cosine=round(single, 6))  # fmt: skip
            ok = whole >= accuracy.min_cosine
            worst = min(worst, whole)
        else:  # integer outputs (ids, argmax) must agree like a top-1
            agree = float(np.mean([np.mean(w == h) for w, h in zip(want, have, strict=True)]))
            entry["agreement"] = round(agree, 6)
            ok = agree >= accuracy.min_top1
            worst = min(worst, agree)
        if spec.metric == "top1" and want[0].ndim >= 1:
            top1, rows = _top1(want, have, spec.axis)
            expected = _top1_expected(want, have, spec.axis)
            entry.update(top1_agreement=round(top1, 6), rows=rows, top1_bound=round(_wilson_lower(top1, rows), 6),
                         top1_expected=round(expected, 6))  # fmt: skip
            ok = ok and min(top1, expected) >= accuracy.min_top1
            worst = min(worst, top1, expected)
        if spec.metric == "slices":
            entry["slices"] = {}
            for slice_name, part in (spec.slices or {}).items():
                cut_want = _cut(want, spec.axis, part.start, part.stop)
                cut_have = _cut(have, spec.axis, part.start, part.stop)
                if part.metric == "top1":
                    found, rows = _top1(cut_want, cut_have, spec.axis)
                    expected = _top1_expected(cut_want, cut_have, spec.axis)
                    piece = {"top1_agreement": round(found, 6), "rows": rows, "top1_expected": round(expected, 6),
                             "top1_bound": round(_wilson_lower(found, rows), 6)}  # fmt: skip
                    figure = min(found, expected)
                    piece_ok = figure >= accuracy.min_top1
                else:
                    figure, bound, _ = _pooled_cosine(cut_want, cut_have)
                    piece = {"cosine": round(figure, 6), "cosine_bound": None if bound is None else round(bound, 6)}
                    piece_ok = figure >= accuracy.min_cosine
                piece.update(range=[part.start, part.stop], ok=piece_ok)
                entry["slices"][slice_name] = piece
                ok = ok and piece_ok
                worst = min(worst, figure)
        entry["ok"] = ok
        outputs[name] = entry
    return {
        "ok": all(entry["ok"] for entry in outputs.values()),
        "loss": round(1.0 - worst, 6),
        "samples": len(reference),
        "outputs": outputs,
    }


def describe(accuracy_score: dict, target: AccuracyTarget) -> str:
    """The outputs (and slices) below the target, with their figures and what they need."""
    parts = []
    for name, entry in accuracy_score["outputs"].items():
        if entry["ok"]:
            continue
        figures = []
        if "cosine" in entry and entry["cosine"] < target.min_cosine:
            figures.append(f"cosine {entry['cosine']:.4f} (needs {target.min_cosine})")
        if "top1_agreement" in entry and entry["top1_agreement"] < target.min_top1:
            figures.append(f"top-1 {entry['top1_agreement']:.3f} (needs {target.min_top1})")
        elif entry.get("top1_expected", 1.0) < target.min_top1:
            figures.append(f"top-1 expected on unseen rows {entry['top1_expected']:.3f} (needs {target.min_top1}; "
                           f"{entry['top1_agreement']:.3f} on the {entry['rows']} judged)")  # fmt: skip
        if "agreement" in entry:
            figures.append(f"agreement {entry['agreement']:.3f} (needs {target.min_top1})")
        for slice_name, piece in (entry.get("slices") or {}).items():
            if piece["ok"]:
                continue
            if "cosine" in piece:
                figures.append(f"slice {slice_name!r} cosine {piece['cosine']:.4f} (needs {target.min_cosine})")
            else:
                figure = min(piece["top1_agreement"], piece["top1_expected"])
                figures.append(f"slice {slice_name!r} top-1 {figure:.3f} (needs {target.min_top1})")
        parts.append(f"{name!r}: {', '.join(figures) or entry.get('detail', '')}")
    return "; ".join(parts) or "meets the target"
