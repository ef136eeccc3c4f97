"""Task-aware accuracy of a lower-precision model against the fp32 original, with a confidence bound.

Per output, by its metric (``AccuracyTarget.outputs``, else by its look):

* ``cosine``: ``cos(a, b) = sum_i a_i.b_i / sqrt(sum_i |a_i|^2 * sum_i |b_i|^2)`` over every sample ``i``
  (and the worst single sample, reported);
* ``top1``: the cosine (over every row), and top-1 by the rule below;
* ``slices``: the cosine of the whole, and each named slice along ``axis`` judged alone (cosine or top-1):
  an output that packs boxes in pixels (0..640) with scores in 0..1 keeps a whole-tensor cosine of 0.998
  while its scores are lost; a slice cannot hide behind another.

Top-1 rule (``top1_rows``). A row where the original hesitates between two classes (most crops of a texture
photo: a top-class probability of 0.05) has an argmax the original itself would flip under any noise, so
agreement over every row lets near-ties decide. ``confident`` (the default) judges the agreement on the rows
where the original is confident, its top-class probability ``p = 1 / sum_j exp(x_j - max x)`` (softmax of the
row, or the row itself when it already is a distribution) at least ``confident_probability``; the cosine
still covers every row. With no confident row, top-1 is not judged (said: ``top1_judged``, ``top1_note``)
and the cosine decides. ``all``: every row. The all-rows figures are reported beside either way.

Labels (``labels``, from the calibration file). The labelled top-1 output is judged against them: accuracy
= the share of labelled rows whose argmax is the label, for the original and the candidate on the same rows;
the target is ``accuracy >= label_ratio * fp32_accuracy`` (MLPerf's rule, 0.99), and the agreement figures
stay beside it.

Expected top-1 (``top1_expected``): a few judged rows can all agree while the model flips one row in ten of
the next photo's (EfficientNet-Lite0 int8: 22 of 22 crops agreed, 76 of 85 crops of other photos). Each judged
row says how near it came: ``d_i``, the lead the original's top class lost over the original's runner-up,
``max(0, (a_c - a_r) - (b_c - b_r))``; each row's original margin ``m_k = a_c - a_r`` is how much lead a
row has to lose. A row flips when it loses more than its margin, so the agreement expected on rows whose
margins are like the judged ones is ``1 - mean over (i, k) of [d_i > m_k]``: every loss paired with every
margin, over the rows the rule judges. A top-1 target holds only when both the agreement found and the
agreement expected reach it.

Bounds (``*_bound``, one-sided 95%): for top-1 the Wilson lower bound of the agreement rate over its rows,
``(p + z^2/2n - z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)``, z = 1.645; for a cosine the 5th percentile of
the pooled cosine over ``BOOTSTRAP`` resamplings of the samples (seeded); when the samples name their sources,
``cos - t95(g - 1) sd(cos_g) / sqrt(g)`` from the cosines of the ``g`` groups. Decisions take the figures; the
bound says what the rows can establish (``evidence``): at a rate of 1, ``n / (n + z^2)``, so 0.99 needs 268
agreeing rows.
"""

from __future__ import annotations

import numpy as np

from flexdsa_core.accuracy_target import AccuracyTarget, OutputMetric
from flexdsa_core.errors import InvalidOptionsError

__all__ = ["check_outputs", "describe", "evidence", "labelled_output", "metrics_for", "rows_to_establish", "score"]

_CLASSIFIER_WORDS = ("logit", "prob", "score", "class")
# Outputs named like these are embeddings or features: their top-1 means nothing (cosine).
_EMBEDDING_WORDS = ("embed", "pool", "hidden", "feature", "state", "vector")
BOOTSTRAP = 400
_Z = 1.6448536269514722  # one-sided 95%
# Student's t, one-sided 95%, for 1..30 degrees of freedom.
_T95 = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, 1.796, 1.782, 1.771, 1.761, 1.753,
        1.746, 1.740, 1.734, 1.729, 1.725, 1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697)  # fmt: skip


def check_outputs(accuracy: AccuracyTarget, outputs: dict[str, list]) -> None:
    """Refuse metrics naming outputs the model does not have, and slices past the end of a known axis
    (``outputs``: name -> shape, dims as ints or names)."""
    named = dict(accuracy.outputs or {})
    unknown = sorted(set(named) - set(outputs))
    unknown += sorted(set(accuracy.top1_outputs or []) - set(outputs) - set(unknown))
    if accuracy.labels_output is not None and accuracy.labels_output not in outputs and accuracy.labels_output not in unknown:
        unknown.append(accuracy.labels_output)
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
    """Each output's metric: as named in ``accuracy.outputs`` / ``top1_outputs`` / ``labels_output``, else by
    its look."""
    named = dict(accuracy.outputs or {})
    if accuracy.labels_output is not None:  # what labels refer to is a classifier
        named.setdefault(accuracy.labels_output, OutputMetric(metric="top1"))
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


def _t95(df: int) -> float:
    """Student's t, one-sided 95%, ``df`` degrees of freedom (beyond the table: Cornish-Fisher's first term)."""
    if df <= len(_T95):
        return _T95[df - 1]
    return _Z + (_Z**3 + _Z) / (4 * df)


def _pooled_cosine(want: list[np.ndarray], have: list[np.ndarray],
                   groups: list | None = None) -> tuple[float, float | None, float]:  # fmt: skip
    """(cosine over all samples, its one-sided 95% lower bound or None for one sample, worst single sample).
    The bound: the 5th percentile of the cosine over ``BOOTSTRAP`` resamplings of the samples; with
    ``groups`` (each sample's source, two or more), from the spread between groups instead, ``cos - t95(g-1)
    sd(cos_g) / sqrt(g)`` over the ``g`` groups' own cosines: crops of one photo agree with each other, so
    resampling crops would claim the spread of one photo for all, and resampling a few groups is
    over-confident (4 photos: 256 resamplings, the worst photo rarely drawn often)."""
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
    if groups is not None and len(set(groups)) >= 2:  # each group's cosine, from its sums
        index = np.unique(np.asarray(groups), return_inverse=True)[1].ravel()
        dots, wants, haves = (np.bincount(index, weights=values) for values in (dots, wants, haves))
        norms = np.sqrt(wants * haves)
        per_group = np.where(norms > 0, dots / np.where(norms > 0, norms, 1), ((wants == 0) & (haves == 0)) * 1.0)
        spread = _t95(len(per_group) - 1) * float(np.std(per_group, ddof=1)) / np.sqrt(len(per_group))
        return whole, whole - spread, min(singles)
    picks = np.random.default_rng(0).integers(0, len(dots), size=(BOOTSTRAP, len(dots)))
    want_sums, have_sums = wants[picks].sum(1), haves[picks].sum(1)
    denominators = np.sqrt(want_sums * have_sums)
    # A resampling with a zero side: 1 where both are zero (nothing to lose), 0 where only one is (all lost).
    empty = np.where((want_sums == 0) & (have_sums == 0), 1.0, 0.0)
    resampled = np.where(denominators > 0, dots[picks].sum(1) / np.where(denominators > 0, denominators, 1), empty)
    return whole, min(float(np.percentile(resampled, 5)), whole), min(singles)


def _wilson_lower(agreement: float, rows: int) -> float:
    if rows == 0:
        return 0.0
    z2 = _Z * _Z
    centre = agreement + z2 / (2 * rows)
    spread = _Z * np.sqrt(agreement * (1 - agreement) / rows + z2 / (4 * rows * rows))
    return float((centre - spread) / (1 + z2 / rows))


def rows_to_establish(rate: float, goal: float) -> int | None:
    """The fewest rows whose one-sided 95% Wilson bound at ``rate`` reaches ``goal`` (None where it never can:
    ``rate <= goal``). At rate 1 it is ``z^2 goal / (1 - goal)``: 268 rows for 0.99."""
    if rate <= goal or goal >= 1.0:
        return None
    low, high = 1, 1
    while _wilson_lower(rate, high) < goal:
        low, high = high, high * 2
        if high > 1 << 40:
            return None
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if _wilson_lower(rate, middle) >= goal else (middle, high)
    return high if _wilson_lower(rate, low) < goal else low


def _as_rows(array: np.ndarray, axis: int) -> np.ndarray:
    """``array`` as [rows, classes]: every position but ``axis`` is a row."""
    return np.moveaxis(array, axis, -1).reshape(-1, array.shape[axis])


def _top_probability(rows: np.ndarray) -> np.ndarray:
    """Per row, the probability of its top class: the row itself where every row already is a distribution
    (values in [0, 1] summing to 1), else its softmax (``1 / sum_j exp(x_j - max x)``)."""
    values = rows.astype(np.float64)
    if not values.size:
        return np.zeros(len(values))
    if (values >= 0).all() and (values <= 1).all() and np.allclose(values.sum(-1), 1.0, atol=1e-3):
        return values.max(-1)
    return 1.0 / np.exp(values - values.max(-1, keepdims=True)).sum(-1)


def _row_figures(want: np.ndarray, have: np.ndarray, axis: int, confident_probability: float) -> dict[str, np.ndarray]:
    """Per row of one sample: the original's top class and ``have``'s, the original's margin of its top class
    over its runner-up and how much of that lead ``have`` lost, and whether the original is confident. One
    sample at a time, so a language model's logits are never copied whole."""
    rows_want, rows_have = _as_rows(want, axis), _as_rows(have, axis)
    top = np.argmax(rows_want, axis=-1)  # the first of equal maxima, as the top-1 agreement takes it
    found = {"want": top, "have": np.argmax(rows_have, axis=-1),
             "confident": _top_probability(rows_want) >= confident_probability}  # fmt: skip
    if rows_want.shape[-1] < 2:  # one class: every row agrees, nothing to lose
        found["margin"] = found["lost"] = np.zeros(len(top))
        return found
    index = np.arange(len(rows_want))
    others = rows_want.astype(np.promote_types(rows_want.dtype, np.float32))  # a copy that can hold -inf
    others[index, top] = -np.inf
    runner_up = np.argmax(others, axis=-1)
    del others

    def lead(rows: np.ndarray) -> np.ndarray:
        return rows[index, top].astype(np.float64) - rows[index, runner_up].astype(np.float64)

    found["margin"] = lead(rows_want)
    found["lost"] = np.maximum(0.0, found["margin"] - lead(rows_have))
    return found


def _expected(margins: np.ndarray, lost: np.ndarray) -> float:
    """1 - the share of (row i, row k) pairs where row i's lost lead over its runner-up exceeds row k's
    margin (module docstring)."""
    if not np.isfinite(lost).all():
        return 0.0
    below = np.searchsorted(np.sort(margins), lost, side="left")  # margins strictly below each loss
    return float(1.0 - below.sum() / (len(margins) * len(lost)))


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 6)


def _judge_top1(want: list[np.ndarray], have: list[np.ndarray], axis: int, accuracy: AccuracyTarget,
                labels: np.ndarray | None = None) -> tuple[dict, bool, float | None, float]:  # fmt: skip
    """One top-1 output (or slice) by the rule (module docstring): (its figures, whether it holds, the figure
    the decision took or None where top-1 was not judged, the all-rows figure)."""
    per_sample = [_row_figures(w, h, axis, accuracy.confident_probability) for w, h in zip(want, have, strict=True)]
    rows = {key: np.concatenate([r[key] for r in per_sample]) for key in per_sample[0]}
    agree = rows["want"] == rows["have"]
    entry: dict = {"top1_rule": accuracy.top1_rows, "rows_all": int(agree.size)}
    all_rows = 1.0
    if agree.size:
        found_all, expected_all = float(agree.mean()), _expected(rows["margin"], rows["lost"])
        entry.update(top1_agreement_all_rows=_round(found_all), top1_expected_all_rows=_round(expected_all))
        all_rows = min(found_all, expected_all)
    judged = rows["confident"] if accuracy.top1_rows == "confident" else np.ones(agree.size, bool)
    count = int(judged.sum())
    entry.update(confident_rows=int(rows["confident"].sum()), confident_probability=accuracy.confident_probability,
                 rows=count, top1_judged=count > 0)  # fmt: skip
    figure, ok = None, True
    if count:
        found, expected = float(agree[judged].mean()), _expected(rows["margin"][judged], rows["lost"][judged])
        entry.update(top1_agreement=_round(found), top1_expected=_round(expected),
                     top1_bound=_round(_wilson_lower(found, count)))  # fmt: skip
        figure = min(found, expected)
        ok = figure >= accuracy.min_top1
    else:
        entry.update(top1_agreement=None, top1_expected=None, top1_bound=None,
                     top1_note=f"no row where the original's top class has probability >= "
                     f"{accuracy.confident_probability}: top-1 cannot be judged here, the cosine decides")  # fmt: skip
    if labels is not None:
        judged_by_labels = _judge_labels(rows, labels, accuracy)
        entry["labels"] = judged_by_labels
        if "ok" in judged_by_labels:  # the labels decide; the agreement figures stay beside them
            entry["top1_rule"] = "labels"
            ok = judged_by_labels["ok"]
            figure = min(1.0, judged_by_labels["accuracy"] / judged_by_labels["fp32_accuracy"])
    return entry, ok, figure, all_rows


def _judge_labels(rows: dict[str, np.ndarray], labels: np.ndarray, accuracy: AccuracyTarget) -> dict:
    """Accuracy against the labels (negative: no label) for the original and the candidate, on the same rows,
    and MLPerf's rule ``accuracy >= label_ratio * fp32_accuracy``. Its evidence: the share of the rows the
    original gets right that the candidate keeps right (``kept_correct``; the candidate's accuracy is at
    least the original's times it), with its Wilson bound."""
    labelled = labels >= 0
    fp32_right = labelled & (rows["want"] == labels)
    right = labelled & (rows["have"] == labels)
    count, fp32_count = int(labelled.sum()), int(fp32_right.sum())
    found: dict = {"rows": count, "fp32_correct_rows": fp32_count, "ratio": accuracy.label_ratio}
    if not fp32_count:
        found["note"] = (
            f"the original gets none of the {count} labelled judged rows right: the labels cannot judge the "
            f"candidate, the agreement rule ({accuracy.top1_rows} rows) decides"
            if count else "no judged row has a label: the agreement rule decides"
        )
        return found
    kept = float((fp32_right & right).sum() / fp32_count)
    found.update(
        fp32_accuracy=_round(fp32_count / count), accuracy=_round(right.sum() / count),
        needs=_round(accuracy.label_ratio * fp32_count / count), kept_correct=_round(kept),
        kept_correct_bound=_round(_wilson_lower(kept, fp32_count)),
        ok=bool(right.sum() >= accuracy.label_ratio * fp32_count - 1e-9),
    )  # fmt: skip
    return found


def labelled_output(metrics: dict[str, OutputMetric], accuracy: AccuracyTarget) -> str:
    """The top-1 output the calibration file's labels refer to: ``accuracy.labels_output``, else the one
    output judged by top-1; refused where that is ambiguous or absent."""
    top1 = [name for name, spec in metrics.items() if spec.metric == "top1"]
    if accuracy.labels_output is not None:
        if accuracy.labels_output not in metrics:
            raise InvalidOptionsError(
                f"accuracy.labels_output names {accuracy.labels_output!r}, not an output of the model (its outputs: "
                f"{', '.join(map(repr, metrics))}).", details={"labels_output": accuracy.labels_output},
            )  # fmt: skip
        if metrics[accuracy.labels_output].metric != "top1":
            raise InvalidOptionsError(
                f"accuracy.labels_output {accuracy.labels_output!r} is judged by {metrics[accuracy.labels_output].metric}"
                f", not top-1: labels need a classifier output (name it in accuracy.outputs as 'top1').",
                details={"labels_output": accuracy.labels_output},
            )
        return accuracy.labels_output
    if len(top1) != 1:
        raise InvalidOptionsError(
            "the calibration file has 'labels', but "
            + (f"{len(top1)} outputs are judged by top-1 ({', '.join(map(repr, top1))}): name the one the labels "
               "refer to with accuracy.labels_output." if top1 else
               "no output is judged by top-1: name the classifier output with accuracy.outputs ({name: 'top1'}) "
               "or accuracy.labels_output."),
            details={"top1_outputs": top1},
        )  # fmt: skip
    return top1[0]


def _row_labels(labels: list[np.ndarray], want: list[np.ndarray], axis: int, name: str) -> np.ndarray:
    """The labels of every row of output ``name`` (samples in order), checked against its rows and classes."""
    for index, (sample_labels, sample) in enumerate(zip(labels, want, strict=True)):
        rows = sample.size // max(sample.shape[axis], 1)
        if sample_labels.size != rows:
            raise InvalidOptionsError(
                f"sample {index} has {sample_labels.size} labels, output {name!r} {list(sample.shape)} has {rows} rows "
                f"per sample (every position but axis {axis}): give one label per row, -1 for none.",
                details={"output": name, "labels": int(sample_labels.size), "rows": rows},
            )
        if sample_labels.size and sample_labels.max() >= sample.shape[axis]:
            raise InvalidOptionsError(
                f"sample {index} has label {int(sample_labels.max())}, past the {sample.shape[axis]} classes of output "
                f"{name!r}.", details={"output": name, "classes": int(sample.shape[axis])},
            )  # fmt: skip
    return np.concatenate(labels) if labels else np.zeros(0, np.int64)


def _cut(arrays: list[np.ndarray], axis: int, start: int, stop: int) -> list[np.ndarray]:
    size = arrays[0].shape[axis]
    if stop > size:
        raise InvalidOptionsError(
            f"an accuracy slice {start}:{stop} runs past the {size} positions of its output's axis {axis}.",
            details={"start": start, "stop": stop, "axis_size": size},
        )
    return [np.take(a, np.arange(start, stop), axis=axis) for a in arrays]


def score(reference: list[dict], got: list[dict], accuracy: AccuracyTarget,
          labels: list[np.ndarray] | None = None, groups: list | None = None,
          cosine_by_bound: bool = False) -> dict:  # fmt: skip
    """Accuracy of ``got`` against ``reference`` (outputs per sample) by each output's metric
    (``metrics_for``): the figures with their bounds, whether the target holds, ``samples`` (how many it was
    measured on), ``loss`` (1 - the worst figure the decision took: what a layer's sensitivity is) and
    ``loss_all_rows`` (the same with top-1 over every row, near-ties included: how near a model brings rows to
    flipping, which ranks layers where the decision's figures tie). ``labels``: per sample, the class of each
    row of the labelled top-1 output (``labelled_output``), -1 where none. ``groups``: per sample, its source;
    the cosine bounds then resample whole groups (``cosine_bound_over``). ``cosine_by_bound``: a cosine meets
    ``min_cosine`` only where its one-sided 95% bound does (samples of the user's data: a claim must hold on
    more of them), not only its figure (``cosine_decided_by``)."""
    metrics = metrics_for(reference[0], accuracy) if reference else {}
    labelled = labelled_output(metrics, accuracy) if labels is not None and metrics else None
    if groups is not None and len(groups) != len(reference):
        raise ValueError(f"{len(groups)} groups for {len(reference)} samples")
    over = "groups" if groups is not None and len(set(groups)) >= 2 else "samples"
    outputs, worst, worst_all_rows = {}, 1.0, 1.0
    for name, spec in metrics.items():
        want = [sample[name] for sample in reference]
        have = [sample[name] for sample in got]
        if any(w.shape != h.shape for w, h in zip(want, have, strict=True)):
            outputs[name] = {"ok": False, "detail": "shape differs from the original"}
            worst = worst_all_rows = 0.0
            continue
        entry: dict = {"metric": spec.metric}
        if np.issubdtype(want[0].dtype, np.floating):
            whole, bound, single = _pooled_cosine(want, have, groups)
            by_bound = cosine_by_bound and bound is not None
            entry.update(cosine=round(whole, 6), cosine_bound=None if bound is None else round(bound, 6),
                         worst_sample_cosine=round(single, 6), cosine_bound_over=over,
                         cosine_decided_by="bound" if by_bound else "figure")  # fmt: skip
            ok = (bound if by_bound else whole) >= accuracy.min_cosine
            worst, worst_all_rows = min(worst, whole), min(worst_all_rows, whole)
            if accuracy.min_sample_cosine is not None:
                ok = ok and single >= accuracy.min_sample_cosine
                worst, worst_all_rows = min(worst, single), min(worst_all_rows, single)
        else:  # integer outputs (ids, argmax) must agree like a top-1
            agree = float(np.mean([np.mean(w == h) for w, h in zip(want, have, strict=True)]))
            entry["agreement"] = round(agree, 6)
            ok = agree >= accuracy.min_top1
            worst, worst_all_rows = min(worst, agree), min(worst_all_rows, agree)
        if spec.metric == "top1" and want[0].ndim >= 1:
            row_labels = _row_labels(labels, want, spec.axis, name) if name == labelled else None
            figures, top1_ok, figure, all_rows = _judge_top1(want, have, spec.axis, accuracy, row_labels)
            entry.update(figures)
            ok = ok and top1_ok
            worst = min(worst, 1.0 if figure is None else figure)
            worst_all_rows = min(worst_all_rows, all_rows)
        if spec.metric == "slices":
            entry["slices"] = {}
            for slice_name, part in (spec.slices or {}).items():
                cut_want = _cut(want, spec.axis, part.start, part.stop)
                cut_have = _cut(have, spec.axis, part.start, part.stop)
                if part.metric == "top1":
                    piece, piece_ok, figure, all_rows = _judge_top1(cut_want, cut_have, spec.axis, accuracy)
                    figure = 1.0 if figure is None else figure
                else:
                    figure, bound, _ = _pooled_cosine(cut_want, cut_have, groups)
                    by_bound = cosine_by_bound and bound is not None
                    piece = {"cosine": round(figure, 6), "cosine_bound": None if bound is None else round(bound, 6),
                             "cosine_decided_by": "bound" if by_bound else "figure"}  # fmt: skip
                    piece_ok, all_rows = (bound if by_bound else figure) >= accuracy.min_cosine, figure
                piece.update(range=[part.start, part.stop], ok=piece_ok)
                entry["slices"][slice_name] = piece
                ok = ok and piece_ok
                worst, worst_all_rows = min(worst, figure), min(worst_all_rows, all_rows)
        entry["ok"] = ok
        outputs[name] = entry
    return {
        "ok": all(entry["ok"] for entry in outputs.values()),
        "loss": round(1.0 - worst, 6),
        "loss_all_rows": round(1.0 - worst_all_rows, 6),
        "samples": len(reference),
        "outputs": outputs,
    }


def _cosine_shortfall(entry: dict, target: AccuracyTarget) -> str | None:
    """What a cosine figure (an output's or a slice's) misses, in words (None: nothing)."""
    if entry["cosine"] < target.min_cosine:
        return f"cosine {entry['cosine']:.4f} (needs {target.min_cosine})"
    if entry.get("cosine_decided_by") == "bound" and entry["cosine_bound"] < target.min_cosine:
        over = entry.get("cosine_bound_over", "samples")
        return (f"cosine {entry['cosine']:.4f} bounded at {entry['cosine_bound']:.4f} over resampled {over} "
                f"(one-sided 95%; needs {target.min_cosine})")  # fmt: skip
    single = entry.get("worst_sample_cosine")
    if target.min_sample_cosine is not None and single is not None and single < target.min_sample_cosine:
        return f"worst sample's cosine {single:.4f} (needs {target.min_sample_cosine} on every sample)"
    return None


def _top1_shortfall(entry: dict, target: AccuracyTarget) -> str | None:
    """What a top-1 entry (an output's or a slice's) misses, in words (None: nothing)."""
    if entry.get("top1_rule") == "labels":
        labels = entry["labels"]
        if labels["ok"]:
            return None
        return (f"accuracy on the labels {labels['accuracy']:.3f} over {labels['rows']} labelled rows (needs "
                f"{labels['ratio']} of the original's {labels['fp32_accuracy']:.3f}: {labels['needs']:.3f})")  # fmt: skip
    if not entry.get("top1_judged", True):
        return None
    which = "confident rows" if entry.get("top1_rule") == "confident" else "rows"
    if entry["top1_agreement"] < target.min_top1:
        return f"top-1 {entry['top1_agreement']:.3f} on {entry['rows']} {which} (needs {target.min_top1})"
    if entry["top1_expected"] < target.min_top1:
        return (f"top-1 expected on unseen rows {entry['top1_expected']:.3f} (needs {target.min_top1}; "
                f"{entry['top1_agreement']:.3f} on the {entry['rows']} judged {which})")  # fmt: skip
    return None


def describe(accuracy_score: dict, target: AccuracyTarget) -> str:
    """The outputs (and slices) below the target, with their figures and what they need; and the top-1
    outputs that could not be judged (no confident row), whose cosine alone decided."""
    parts, unjudged = [], []
    for name, entry in accuracy_score["outputs"].items():
        if entry.get("top1_judged") is False and entry.get("top1_rule") != "labels":
            unjudged.append(name)
        if entry["ok"]:
            continue
        figures = []
        if "cosine" in entry and (cosine := _cosine_shortfall(entry, target)):
            figures.append(cosine)
        if "top1_rule" in entry and (shortfall := _top1_shortfall(entry, target)):
            figures.append(shortfall)
        if "agreement" in entry:
            figures.append(f"agreement {entry['agreement']:.3f} (needs {target.min_top1})")
        for slice_name, piece in (entry.get("slices") or {}).items():
            if piece["ok"]:
                continue
            if "cosine" in piece:
                figures.append(f"slice {slice_name!r} {_cosine_shortfall(piece, target)}")
            else:
                figures.append(f"slice {slice_name!r} {_top1_shortfall(piece, target)}")
        parts.append(f"{name!r}: {', '.join(figures) or entry.get('detail', '')}")
    found = "; ".join(parts) or "meets the target"
    if unjudged:
        found += (f"; top-1 of {', '.join(map(repr, unjudged))} not judged: no row where the original is confident "
                  f"(top-class probability >= {target.confident_probability}), the cosine alone decided")  # fmt: skip
    return found


def evidence(accuracy_score: dict, target: AccuracyTarget) -> dict:
    """What a score rests on and what it can establish, per output: the rows (or samples) a figure is over, its
    one-sided 95% bound, whether that bound reaches the target (``established``) and, where not, how many rows
    would (``rows_to_establish``: at the rate found, else at a rate of 1, every further row agreeing).

    Top-1 by agreement: the Wilson bound of the agreement over the judged rows. By labels: the Wilson bound of
    the share of the original's correct rows the candidate keeps (its accuracy is at least the original's
    times that share). Cosine: the bootstrap bound over the samples; more samples narrow it roughly as
    ``1 / sqrt(n)``, so ``samples_to_establish`` is ``n ((cosine - bound) / (cosine - min_cosine))^2``."""
    found = {}
    for name, entry in accuracy_score.get("outputs", {}).items():
        item: dict = {}
        if entry.get("cosine_bound") is not None:
            cosine, bound = entry["cosine"], entry["cosine_bound"]
            item["cosine"] = {"samples": accuracy_score.get("samples"), "bound": bound, "goal": target.min_cosine,
                              "established": bound >= target.min_cosine}  # fmt: skip
            if bound < target.min_cosine < cosine:
                samples = accuracy_score.get("samples") or 0
                item["cosine"]["samples_to_establish"] = int(np.ceil(samples * ((cosine - bound) / (cosine - target.min_cosine)) ** 2))
        if "top1_rule" in entry:
            item["top1"] = _top1_evidence(entry, target)
        found[name] = item
    return found


def _top1_evidence(entry: dict, target: AccuracyTarget) -> dict:
    if entry["top1_rule"] == "labels":
        labels = entry["labels"]
        rows, rate, bound, goal = labels["fp32_correct_rows"], labels["kept_correct"], labels["kept_correct_bound"], labels["ratio"]
        what = f"{labels['rows']} labelled rows, {rows} of them right in the original"
    elif not entry["top1_judged"]:
        return {"rule": entry["top1_rule"], "rows": 0, "established": False, "rests_on": "no confident row: top-1 "
                "was not judged (the cosine decided)"}  # fmt: skip
    else:
        rows, rate, bound, goal = entry["rows"], entry["top1_agreement"], entry["top1_bound"], target.min_top1
        what = f"{rows} {'confident ' if entry['top1_rule'] == 'confident' else ''}rows of {entry['rows_all']}"
    found = {"rule": entry["top1_rule"], "rows": rows, "rate": rate, "bound": bound, "goal": goal,
             "established": bound >= goal, "rests_on": what}  # fmt: skip
    if bound < goal:
        needed = rows_to_establish(rate, goal) or rows_to_establish(1.0, goal)
        found.update(rows_to_establish=needed, at_rate=rate if rows_to_establish(rate, goal) else 1.0)
    return found
