"""How a precision candidate is judged: accuracy on held-out samples, time against fp32.

``PrecisionRun`` carries the fp32 result, the samples and their split (calibrate on one part, judge on the
other); ``_scored`` scores a candidate with ``accuracy.score`` against the original's outputs,
``_time_against_fp32`` times candidates in interleaved paired rounds (``significance.paired``), ``_pick``
takes the fastest that meets the target and is not slower than fp32, and ``_confirm`` checks it on every
fold. Scores and timings go through the kernel cache (``_cache_read``/``_cache_write``).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from flexdsa_core.accuracy import evidence, metrics_for, score
from flexdsa_core.cache import KernelCache, kernel_key
from flexdsa_core.calibration import MAX_SAMPLES
from flexdsa_core.holdout import SplitPlan
from flexdsa_core.kernel_timing import machine_fingerprint
from flexdsa_core.options import AccuracyTarget, OptimizeOptions
from flexdsa_core.ort_runs import latency_samples, owned, session
from flexdsa_core.precision.formats import int8_format
from flexdsa_core.significance import MIN_ROUNDS, MODEL_MIN_EFFECT, paired
from flexdsa_core.version import __version__

# Ops an output's tail may pass through back to the layers that compute it (no weights: cheap in float).
_TAIL_OPS = frozenset({"Concat", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Transpose", "Add", "Sub", "Mul", "Div",
                       "Softmax", "Sigmoid", "Slice", "Gather", "Split", "Expand", "Identity", "Cast", "Tile"})  # fmt: skip


def _classifier_outputs(reference: dict[str, np.ndarray], accuracy: AccuracyTarget) -> list[str]:
    """The outputs judged by top-1 (their metric, named or by their look)."""
    return [name for name, spec in metrics_for(reference, accuracy).items() if spec.metric == "top1"]


def _outputs(source, samples: list[dict], level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> list[dict]:
    sess = session(source, level=level)
    names = [o.name for o in sess.get_outputs()]
    # A float16 model without keep_io_types takes float16: the same samples, cast (as its caller would).
    halves = {i.name for i in sess.get_inputs() if i.type == "tensor(float16)"}
    feeds = [{k: v.astype(np.float16) if k in halves else v for k, v in feed.items()} for feed in samples]
    # Kept by the caller: copied out of the session's arena (``owned``), which then goes with the session.
    return [{n: owned(v) for n, v in zip(names, sess.run(names, feed), strict=True)} for feed in feeds]


class _Samples:
    """``onnxruntime.quantization.CalibrationDataReader``'s protocol over our list of feeds."""

    def __init__(self, samples: list[dict]) -> None:
        self._iterator = iter(samples)

    def get_next(self):
        return next(self._iterator, None)

    def __iter__(self):
        return self

    def __next__(self):
        item = self.get_next()
        if item is None:
            raise StopIteration
        return item


def _named(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every node named, uniquely: the quantiser includes and excludes layers by node name."""
    seen: set[str] = set()
    for index, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{index}"
        seen.add(node.name)
    return model


def packed_tails(model: onnx.ModelProto, accuracy: AccuracyTarget) -> dict:
    """The outputs that pack unlike quantities, and the nodes kept float so each quantity keeps its own scale.

    A packed output is one the user judges by ``slices``, or one a ``Concat`` assembles from computed parts
    (boxes and scores stacked: YOLO-style heads, ``[x1, y1, x2, y2, score]``). Static QDQ gives a Concat one
    scale for all its inputs, so scores in 0..1 beside boxes in pixels round to a few levels. Its tail, every
    weightless node between the output and the layers that compute its parts, stays float (elementwise work,
    cheap); the layers themselves stay int8, each with its own output scale."""
    producers = {out: node for node in model.graph.node for out in node.output}
    initializers = {init.name for init in model.graph.initializer}
    constants = {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    named = {name for name, spec in (accuracy.outputs or {}).items() if spec.metric == "slices"}
    found: dict = {"nodes": set(), "outputs": {}}
    for output in model.graph.output:
        tail, stack, concat = [], [output.name], False
        while stack:
            node = producers.get(stack.pop())
            if node is None or node.op_type not in _TAIL_OPS or node.name in tail:
                continue
            tail.append(node.name)
            computed = [i for i in node.input if i and i not in initializers and i not in constants]
            concat |= node.op_type == "Concat" and len(computed) > 1
            # Through a Concat to each part; through elementwise ops only along a single computed input (a
            # residual Add of two computed branches is the network itself, not a head's decode).
            if node.op_type == "Concat" or len(computed) == 1:
                stack.extend(computed)
        if tail and (concat or output.name in named):
            why = "judged by slices" if output.name in named else "a Concat packs its computed parts"
            found["outputs"][output.name] = {"kept_float": tail, "why": why}
            found["nodes"].update(tail)
    found["nodes"] = sorted(found["nodes"])
    return found


def _digest(source: bytes | Path) -> str:
    if not isinstance(source, Path):
        return hashlib.sha256(source).hexdigest()
    digest = hashlib.sha256()
    with open(source, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _key(run: PrecisionRun, canonical: dict) -> str:
    return kernel_key(canonical, run.target, __version__)


def _cache_read(run: PrecisionRun, key: str):
    try:
        raw = run.cache.get(key) if run.cache is not None else None
        return json.loads(raw) if raw is not None else None
    except Exception:  # noqa: BLE001 - a broken cache (or entry) is a cache that misses
        return None


def _cache_write(run: PrecisionRun, key: str, entry) -> None:
    if run.cache is not None:
        try:
            run.cache.put(key, json.dumps(entry).encode())
        except Exception:  # noqa: BLE001 - a cache that cannot write is a cache that misses next time
            pass


@dataclass
class _Candidate:
    name: str
    path: Path
    how: str
    accuracy: dict = field(default_factory=dict)
    timing: dict | None = None
    ratio: float | None = None
    verdict: str | None = None
    error: str | None = None
    # The nodes this candidate asks the quantiser to compute in int8 (None: every one it can).
    int8_nodes: frozenset[str] | None = None
    # How to make it again from other calibration samples: ``recipe(samples, fold_tag, out) -> out`` (k-fold).
    recipe: object = None
    # Its figures on the samples it calibrated on (reported beside the held-out ``accuracy``).
    calibration_accuracy: dict | None = None

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "how": self.how,
            "accuracy": self.accuracy,
            **({"calibration_accuracy": self.calibration_accuracy} if self.calibration_accuracy else {}),
            "meets_target": bool(self.accuracy.get("ok")),
            "time_ratio_vs_fp32": None if self.ratio is None else round(self.ratio, 4),
            "verdict_vs_fp32": self.verdict,
            "timing_vs_fp32": self.timing,
            **({"error": self.error} if self.error else {}),
        }


@dataclass
class PrecisionRun:
    """What ``apply_precision`` needs from the optimizer: the fp32 result and how to make more of it."""

    options: OptimizeOptions
    target: object
    original: bytes | Path
    fp32_model: ir.Model
    samples: list[dict]
    synthetic: bool
    workdir: Path
    # The first bucket's model compiled with the com.microsoft fusions off (None: not available).
    unfused_model: ir.Model | None = None
    # The optimizer's progress callback (stage, fraction, message): also where a cancel request lands.
    progress: object = None
    # The job's kernel cache: per-op int8/fp32 timings are kept there as kernel measurements are (``cache``).
    cache: KernelCache | None = None
    # How ``samples`` split between calibrating and judging (``holdout.plan``; set by ``apply_precision``), and
    # the first fold's two parts: every quantiser calibrates on ``calibration``, every decision is on ``judged``.
    split: SplitPlan | None = None
    calibration: list[dict] = field(default_factory=list)
    judged: list[dict] = field(default_factory=list)
    # The calibration method of the static candidates (MinMax; Percentile or Entropy where they judge better).
    method: str = "MinMax"
    # What the calibration file said about the samples (``calibration.CalibrationSamples``), per sample: the
    # class of each row of the labelled top-1 output (None: no labels), and its source (None: not named).
    labels: list[np.ndarray] | None = None
    groups: list | None = None
    # The labels of ``calibration`` and ``judged``, and the groups of ``judged`` (set by ``use_fold``).
    calibration_labels: list[np.ndarray] | None = None
    judged_labels: list[np.ndarray] | None = None
    judged_groups: list | None = None
    _tails: dict = field(default_factory=dict)
    _reference: list[dict] | None = None
    _calibration_reference: list[dict] | None = None

    def use_fold(self, index: int) -> None:
        fold = self.split.folds[index]
        self.calibration = [self.samples[i] for i in fold.calibrate]
        self.judged = [self.samples[i] for i in fold.judge]
        self.calibration_labels = self.labels_of(fold.calibrate)
        self.judged_labels = self.labels_of(fold.judge)
        self.judged_groups = self.groups_of(fold.judge)
        self._reference = self._calibration_reference = None

    @property
    def claims(self) -> bool:
        """Whether the figures make an accuracy claim (samples of the user's data): then a cosine must meet the
        target by its one-sided 95% bound, not only its figure. Synthetic inputs check numerics only."""
        return not self.synthetic

    def labels_of(self, indices) -> list[np.ndarray] | None:
        return None if self.labels is None else [self.labels[i] for i in indices]

    def groups_of(self, indices) -> list | None:
        """The groups of samples ``indices``, where the split held out whole groups (else None)."""
        if self.groups is None or self.split is None or self.split.group_of is None:
            return None
        return [self.groups[i] for i in indices]

    def score_judged(self, path: Path, count: int | None = None) -> dict:
        """``accuracy.score`` of the model at ``path`` on the judged samples (the first ``count``), against the
        original's outputs, with their labels."""
        labels = None if self.judged_labels is None else self.judged_labels[:count]
        groups = None if self.judged_groups is None else self.judged_groups[:count]
        got = _outputs(path, self.judged[:count], level=self.judge_level)
        return score(self.reference()[:count], got, self.options.accuracy, labels=labels, groups=groups,
                     cosine_by_bound=self.claims)

    def calibration_reference(self) -> list[dict]:
        """The original model's outputs on the calibration samples (graph as written)."""
        if self._calibration_reference is None:
            self._calibration_reference = _outputs(
                self.original, self.calibration, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            )
        return self._calibration_reference

    def reference(self) -> list[dict]:
        """The original model's outputs on the judged samples (graph as written)."""
        if self._reference is None:
            self._reference = _outputs(self.original, self.judged, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        return self._reference

    def tail(self, fp32: Path) -> frozenset[str]:
        """The nodes of ``fp32`` that stay float in every static candidate: the tails of its packed outputs."""
        if fp32 not in self._tails:
            self._tails[fp32] = packed_tails(onnx.load(str(fp32), load_external_data=False), self.options.accuracy)
        return frozenset(self._tails[fp32]["nodes"])

    def packed(self, fp32: Path) -> dict:
        self.tail(fp32)
        return self._tails[fp32]["outputs"]

    def measured_on(self, judged: bool = True) -> str:
        """What a figure was measured on, in words."""
        kind = "synthetic random inputs (numerics only: no accuracy claim)" if self.synthetic else "samples of yours"
        if self.split is None or self.split.mode == "none":
            return f"{len(self.samples)} calibration {kind}: none could be held out"
        if not judged:
            return f"the {len(self.calibration)} calibration {kind} (the ones the quantiser saw)"
        groups = self.split.groups_in(self.split.first.judge)
        sources = f" from {groups} groups, none of which calibrated" if groups else ""
        if self.split.mode == "kfold":
            return f"{len(self.judged)} held-out {kind}{sources} (fold 1 of {len(self.split.folds)})"
        return f"{len(self.judged)} held-out {kind}{sources or ', never calibrated on'}"

    def report(self, fraction: float, message: str) -> None:
        if self.progress is not None:
            self.progress("precision", fraction, message)

    @property
    def judge_level(self) -> ort.GraphOptimizationLevel:
        """How a quantised model is run to judge its accuracy. On cpu-ort the int8 kernels of this CPU are what
        ships, so they are what is judged (ORT_ENABLE_ALL: QDQ fused into QLinearConv, MatMulInteger...). A
        vendor's int8 model is judged as the quantisation it describes (ORT_DISABLE_ALL: each Q/DQ pair run as
        written, the op in float on int8-grid values), which is what an accelerator's int32 accumulation
        computes; this CPU's int8 kernels would add their own error (without AVX-512 VNNI, ONNX Runtime's
        u8s8 path saturates 16-bit pair sums), so the verdict would depend on the machine that judged it."""
        fmt = int8_format(self.target)
        if fmt is None or fmt.runs_here:
            return ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.GraphOptimizationLevel.ORT_DISABLE_ALL


def _save(model: ir.Model | onnx.ModelProto, path: Path) -> Path:
    proto = ir.to_proto(model) if isinstance(model, ir.Model) else model
    onnx.save(_named(proto), str(path))
    return path


def _time_against_fp32(run: PrecisionRun, fp32: Path, candidates: list[_Candidate]) -> dict:
    """Interleaved paired rounds of the original, fp32 and every candidate; each candidate's comparison
    with fp32 (and fp32's with the original) on the first calibration sample."""
    models: dict = {"original": run.original, "fp32": fp32}
    models.update({c.name: c.path for c in candidates})
    rounds = max(run.options.latency_repeats, MIN_ROUNDS)
    feed = run.samples[0]
    key = _key(run, {
        "int8_candidates_vs_fp32": {name: _digest(source) for name, source in sorted(models.items())},
        "feed": {name: [list(np.shape(a)), np.asarray(a).dtype.name, _digest(np.ascontiguousarray(a).tobytes())]
                 for name, a in sorted(feed.items())},
        "rounds": rounds,
        "min_effect": MODEL_MIN_EFFECT,
        "runtime": {"ort": ort.__version__, "level": "all", "threads": 1},
        "machine": machine_fingerprint(),
    })  # fmt: skip
    cached = _cache_read(run, key)
    from_cache = isinstance(cached, dict) and set(cached) == set(models)
    samples = cached if from_cache else latency_samples(models, feed, repeats=rounds)
    for candidate in candidates:
        comparison = paired(samples["fp32"], samples[candidate.name], min_effect=MODEL_MIN_EFFECT)
        candidate.timing = comparison.as_dict()
        candidate.ratio, candidate.verdict = comparison.ratio, comparison.verdict
        versus_original = paired(samples["original"], samples[candidate.name], min_effect=MODEL_MIN_EFFECT)
        candidate.timing["speedup_vs_original"] = round(1.0 / versus_original.ratio, 4)
        candidate.timing["vs_original"] = versus_original.as_dict()  # the headline's interval and verdict
    fp32_vs_original = paired(samples["original"], samples["fp32"], min_effect=MODEL_MIN_EFFECT)
    # Kept only when a candidate may ship (``_fast_enough``): these same models are then picked alike
    # by the next compile; "nothing is as fast as fp32" is never kept, so that fallback rests on fresh timings.
    if not from_cache and any(_fast_enough(c) for c in candidates):
        _cache_write(run, key, samples)
    return {
        "engine": "onnxruntime CPUExecutionProvider, ORT_ENABLE_ALL, 1 thread",
        # These models' rounds on this machine read from the kernel cache (timed by an earlier compile).
        "from_kernel_cache": from_cache,
        "interleaved": True,
        "rounds": fp32_vs_original.rounds,
        "input_shapes": {k: list(v.shape) for k, v in run.samples[0].items()},
        "original_s": fp32_vs_original.first_s,
        "fp32_s": fp32_vs_original.second_s,
    }


def _pick(candidates: list[_Candidate], measured: bool) -> _Candidate | None:
    """The fastest candidate that meets the target, is not significantly slower than fp32 and whose median time
    ratio to fp32 is a gain (at most 1 - MODEL_MIN_EFFECT): a lower precision costs accuracy, so it ships only
    for speed; a tie at a ratio above that (a "lower precision" 6% slower than fp32 on a noisy run) does not."""
    good = [c for c in candidates if c.accuracy.get("ok") and c.error is None]
    if measured:
        good = [c for c in good if _fast_enough(c)]
        return min(good, key=lambda c: c.ratio, default=None)
    return good[0] if good else None


def _fast_enough(candidate: _Candidate) -> bool:
    """Measured not significantly slower than fp32, with a median time ratio of at most 1 - MODEL_MIN_EFFECT."""
    return candidate.verdict != "slower" and candidate.ratio is not None and candidate.ratio <= 1 - MODEL_MIN_EFFECT


def _confirm(run: PrecisionRun, candidate: _Candidate) -> bool:
    """The candidate about to ship, judged beyond the first fold. ``split``: its figures on the calibration
    samples are added (the held-out ones decided). ``kfold``: made again for every other fold from that fold's
    calibration samples and judged on its held-out ones; the held-out figure pools all folds (every sample
    judged once by a model that never saw it) and decides; the model that ships is then calibrated on every
    sample (its figure on them is the calibration figure). Returns whether the pooled figure holds."""
    accuracy = run.options.accuracy
    level = run.judge_level
    split = run.split
    if split.mode != "kfold" or candidate.recipe is None:
        if candidate.calibration_accuracy is None:
            _score_on_calibration(run, candidate)
        return bool(candidate.accuracy.get("ok"))
    judged_ids, reference, got = [], [], []
    for index, fold in enumerate(split.folds):
        feeds = [run.samples[i] for i in fold.judge]
        if index == 0:
            path = candidate.path
        else:
            run.report(0.9, f"{candidate.name}: judging fold {index + 1} of {len(split.folds)}")
            path = candidate.recipe([run.samples[i] for i in fold.calibrate], f"fold{index}",
                                    run.workdir / f"{candidate.name}.fold{index}.onnx")  # fmt: skip
        judged_ids.extend(fold.judge)
        reference.extend(_outputs(run.original, feeds, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL))
        got.extend(_outputs(path, feeds, level=level))
    pooled = score(reference, got, accuracy, labels=run.labels_of(judged_ids), groups=run.groups_of(judged_ids),
                   cosine_by_bound=run.claims)  # fmt: skip
    groups = f" ({split.groups_in(judged_ids)} groups, each held out whole)" if split.group_of is not None else ""
    pooled["measured_on"] = (
        f"all {len(judged_ids)} samples{groups}, each held out from the model that judged it ({len(split.folds)}-fold)"
    )
    pooled["first_fold"] = {k: candidate.accuracy.get(k) for k in ("ok", "loss", "samples")}
    candidate.accuracy = pooled
    if not pooled["ok"]:
        return False
    final = candidate.recipe(run.samples, "all", run.workdir / f"{candidate.name}.all.onnx")
    candidate.path = final
    candidate.calibration_accuracy = score(
        _outputs(run.original, run.samples, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
        _outputs(final, run.samples, level=level), accuracy, labels=run.labels,
    )  # fmt: skip
    candidate.calibration_accuracy["measured_on"] = f"all {len(run.samples)} samples, the ones the shipped model calibrated on"
    return True


def _cosine_kept(accuracy_score: dict) -> float:
    """The worst output cosine of a score (1.0 where no output has one)."""
    return min((entry["cosine"] for entry in accuracy_score["outputs"].values() if "cosine" in entry), default=1.0)


def sensitivity_order(accuracy_score: dict) -> tuple[float, float, float]:
    """How a layer quantised alone ranks, most sensitive first (a sort key): by the loss the decision takes
    (top-1 on the rows the rule judges), then, where those tie (on 8 samples a layer alone seldom flips a
    confident row), by the loss over every row (how near it brings near-ties to flipping: the finer signal
    of how much it moves the logits), then by the cosine it keeps."""
    loss = accuracy_score["loss"]
    return -loss, -accuracy_score.get("loss_all_rows", loss), _cosine_kept(accuracy_score)


def _scored(run: PrecisionRun, candidate: _Candidate, build, reference: list[dict]) -> _Candidate:
    """Build a candidate and score it; a quantiser failing is the candidate's error, said in the report."""
    started = time.perf_counter()
    try:
        build()
        candidate.accuracy = run.score_judged(candidate.path)
        _score_on_calibration(run, candidate)
    except Exception as err:  # noqa: BLE001 - one quantiser failing leaves the others; said in the report
        candidate.error = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
    candidate.accuracy["seconds"] = round(time.perf_counter() - started, 3)
    return candidate


def _score_on_calibration(run: PrecisionRun, candidate: _Candidate) -> None:
    """The candidate's figures on the samples it calibrated on, beside the held-out ones that decide: where
    they differ, the calibration samples flattered it."""
    if run.split is None or run.split.mode == "none" or not run.calibration:
        return
    reference = run.calibration_reference()
    candidate.calibration_accuracy = score(
        reference, _outputs(candidate.path, run.calibration, level=run.judge_level), run.options.accuracy,
        labels=run.calibration_labels,
    )
    candidate.calibration_accuracy["measured_on"] = run.measured_on(judged=False)


def _scored_search(search) -> _Candidate:
    """A candidate that scores itself while searching (``_dynamic_mixed``); a quantiser failing is its error."""
    started = time.perf_counter()
    try:
        candidate = search()
    except Exception as err:  # noqa: BLE001 - one quantiser failing leaves the others; said in the report
        candidate = _Candidate("searched", Path("searched.onnx"), "a searched candidate")
        candidate.error = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
    candidate.accuracy["seconds"] = round(time.perf_counter() - started, 3)
    return candidate


def claim(run: PrecisionRun, accuracy_score: dict) -> tuple[dict, list[str]]:
    """What the shipped figure rests on and what it can establish (``accuracy.evidence``), with the samples
    and groups it was judged on; and a warning for each figure the evidence cannot establish, naming how many
    more judged rows, and samples of your data, would (at the rate found, or at a rate of 1)."""
    target = run.options.accuracy
    judged = accuracy_score.get("samples") or 0
    split = run.split
    found: dict = {"samples": judged, "measured_on": accuracy_score.get("measured_on") or run.measured_on()}
    judged_ids = [i for fold in split.folds for i in fold.judge] if split.mode == "kfold" else list(split.first.judge)
    if split.group_of is not None:
        found["groups"] = split.groups_in(judged_ids)
    found["outputs"] = evidence(accuracy_score, target)
    found["established"] = all(
        figure.get("established", True) for item in found["outputs"].values() for figure in item.values()
    )
    if not run.claims:  # synthetic inputs: numerics only, said once by apply_precision
        found["established"] = False
        found["note"] = "synthetic random inputs: numerics only, no accuracy claim"
        return found, []
    warnings = []
    share = run.options.holdout.share if split.mode == "split" else 1.0
    for name, item in found["outputs"].items():
        top1 = item.get("top1")
        if top1 and not top1["rows"]:
            warnings.append(
                f"output {name!r}: no judged row where the original is confident (top-class probability >= "
                f"{target.confident_probability}), so top-1 was not judged and the claim rests on the cosine alone; "
                "send samples the original classifies with confidence, or labels, to judge top-1"
            )
        elif top1 and not top1["established"] and top1.get("rows_to_establish"):
            per_sample = top1["rows"] / judged if judged else 0.0
            more_rows = top1["rows_to_establish"] - top1["rows"]
            samples = math.ceil(top1["rows_to_establish"] / per_sample / share) if per_sample else None
            rate = "if every further row agreed" if top1["at_rate"] == 1.0 else f"at the rate found, {top1['rate']:.3f}"
            ask = (f"; at {per_sample:.2f} such rows per sample, about {samples} samples in all"
                   + (f", more than the {MAX_SAMPLES} one job takes" if samples > MAX_SAMPLES else "")
                   if samples else "")  # fmt: skip
            warnings.append(
                f"output {name!r}: the top-1 figure ({top1['rule']} rows) rests on {top1['rests_on']}"
                f"{' from ' + str(found['groups']) + ' groups' if 'groups' in found else ''}, which establish only "
                f"{top1['bound']:.3f} (one-sided 95%) against the {top1['goal']} asked; establishing it takes "
                f"{top1['rows_to_establish']} such rows ({more_rows} more) {rate}{ask}. The job decided on the "
                "agreement found and expected there, and on the cosine's bound; send more samples of your data, "
                "from more sources, for a figure that establishes the target"
            )
        cosine = item.get("cosine")
        if cosine and not cosine["established"] and cosine.get("samples_to_establish"):
            warnings.append(
                f"output {name!r}: its cosine over {cosine['samples']} judged samples is bounded at {cosine['bound']:.4f} "
                f"(5th percentile of resamplings), under the {cosine['goal']} asked; about "
                f"{math.ceil(cosine['samples_to_establish'] / share)} samples in all would establish it"
            )
        entry = (accuracy_score.get("outputs") or {}).get(name) or {}
        single = entry.get("worst_sample_cosine")
        if target.min_sample_cosine is None and entry.get("ok") and single is not None and single < target.min_cosine:
            warnings.append(
                f"output {name!r}: its cosine over the judged samples meets the {target.min_cosine} asked, but one "
                f"sample alone is at {single:.4f}; accuracy.min_sample_cosine holds every sample to a floor"
            )
    return found, warnings
