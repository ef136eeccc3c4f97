"""The never-slower check (cpu-ort, where the output runs here): original and optimised timed side by
side in paired rounds with a confidence bound (``significance``); while the optimised model is
significantly slower, the rewrite that costs time is bisected and switched off (``verify.roll_back``).
Still slower at the end: the fastest verified variant measured on the way ships (the rollback's
``fallback``), unless the user allowed a slower model (``allow_slower``); either way a warning says so.
``TimedHere`` is the same timing on a target that does not run here (an accelerator): a check of the graph
on this CPU, not the part's latency, so it neither rolls back nor warns.

A comparison that did not find the optimised model slower is kept in the kernel cache under the two
models' bytes (sha256), the inputs, the rounds and this machine, like a kernel measurement: the same two
models compared again (a second job on this model, a bisection's variant met twice) are not timed again.
A slower verdict is never kept, so that every rollback rests on fresh timings.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

from flexdsa_core.cache import kernel_key
from flexdsa_core.compilation import Compilation
from flexdsa_core.in_memory import InMemoryModel
from flexdsa_core.ingest import needs_external_data
from flexdsa_core.kernel_timing import machine_fingerprint
from flexdsa_core.optimize_run import OptimizeRun
from flexdsa_core.ort_runs import LatencyRounds, latency_samples
from flexdsa_core.significance import (
    MIN_ROUNDS,
    MODEL_MIN_EFFECT,
    Comparison,
    Question,
    paired,
    settled_early,
)
from flexdsa_core.targets import TargetSpec
from flexdsa_core.verify import Verdict, Verifier, roll_back, verifier
from flexdsa_core.verify.validation import bucket_inputs, validate_buckets
from flexdsa_core.version import __version__


@dataclass(frozen=True)
class ModelClock:
    """How whole models are timed against each other for the never-slower check: ``samples(models, feeds,
    repeats=, interleave=)`` (one pass, models loaded in turn) and ``rounds(models, feeds)`` (the models
    loaded once, ``.more(n)`` adding paired rounds). Tests hand in a fake clock here."""

    samples: Callable = latency_samples
    rounds: Callable = LatencyRounds
    # Whether ``rounds`` loads ``InMemoryModel``s (the real one does): a model is then handed over so, with
    # no serialisation of it made; a clock that reads bytes (a test's) gets bytes.
    in_memory: bool = True


@verifier("never_slower")
class NeverSlower(Verifier):
    """Time original and optimised side by side; roll back what costs time (module docstring)."""

    name, stage, reason, finishes = "never_slower", "measure", "latency", True
    # Whether this machine's timing decides (rolls back, warns): where the target's output runs here.
    decides = True
    message = "timing original and optimised models in ONNX Runtime"
    bisecting = "optimised model is slower: bisecting the rewrite that costs time"

    def applies(self, job: OptimizeRun) -> bool:
        return job.options.measure_latency

    def verify(self, job: OptimizeRun) -> Verdict:
        options, references = job.options, job.references
        comp = job.comp
        bucket = comp.buckets[0]
        # The bucket's one shape (``BucketModel.at``), the inputs validation used: the shape its fusions were
        # costed at, not a toy size.
        self.feeds = feeds = bucket_inputs(comp, bucket, references, second=False)[0][0]
        # Weights in external data: one session at a time, or the measurement holds the model in memory twice.
        self.interleave = interleave = not needs_external_data(bucket.model)
        self.rounds = max(options.latency_repeats, MIN_ROUNDS)
        # Every variant timed, for the fastest-variant fallback.
        self.tried: list[tuple[Comparison, Compilation]] = []
        self.reused: set[int] = set()  # ids of comparisons read from the cache, for the report
        # Each model's bytes hashed once; the latest few held (so their ids stay theirs), as ``serialized`` does.
        self.hashed: OrderedDict[int, tuple[bytes | Path, str]] = OrderedDict()
        if references.digest is not None and references.original_source is job.original_source:
            # The upload's digest stands for the original however it is loaded (its bytes, or in memory).
            for source in (job.original_source, references.in_memory):
                if source is not None:
                    self.hashed[id(source)] = (source, references.digest)

        verdict = self.check(job, comp)
        if options.never_slower and self.decides:
            verdict = roll_back(self, job, verdict)
        measured = verdict.evidence
        warnings: list[str] = []
        slower = measured.verdict == "slower"
        # On an accelerator this CPU's timing is a check of the graph here, not the part's latency: no warning
        # that would read as the device's (the figure stays in report.json's latency, labelled).
        if slower and self.decides:
            allowed = " (allowed by allow_slower)" if options.allow_slower else ""
            warnings.append(
                f"the optimised model is slower than the original on this machine{allowed}: {_slower_text(measured)}"
                + ("" if options.allow_slower else "; no verified variant was as fast")
            )
        latency = {
            "measured": True,
            # These two models' comparison on this machine, read from the kernel cache (not timed again).
            "from_kernel_cache": id(measured) in self.reused,
            "slower_than_original": slower,
            "note": "optimised model measured slower than the original; see warnings" if slower else None,
            "warnings": warnings,
            "engine": "onnxruntime CPUExecutionProvider",
            "graph_optimization_level": "ORT_ENABLE_ALL",
            "intra_op_threads": 1,
            "repeats": measured.rounds,
            "interleaved": interleave,
            "bucket": bucket.name,
            "input_shapes": {k: list(v.shape) for k, v in feeds.items()},
            "before_s": measured.first_s,
            "after_s": measured.second_s,
            "speedup": measured.first_s / measured.second_s if measured.second_s else None,
            "comparison": measured.as_dict(),
        }
        return Verdict(not slower, latency, _slower_text(measured) if slower else None)

    # -- the rollback's hooks ----------------------------------------------------------------------
    def check(self, job: OptimizeRun, comp: Compilation) -> Verdict:
        measured = self._timings(job, comp)
        slower = measured.verdict == "slower"
        return Verdict(not slower, measured, _slower_text(measured) if slower else None)

    def confirm(self, job: OptimizeRun, comp: Compilation, verdict: Verdict) -> Verdict:
        """Re-measure once before acting: one slow sample is noise, two are a finding."""
        return self.check(job, comp)

    def accept(self, job: OptimizeRun, candidate: Compilation) -> bool:
        return self._verified(job, candidate)

    def fallback(self, job: OptimizeRun, verdict: Verdict):
        """Still slower: the fastest verified variant timed on the way, unless the user allowed a slower model."""
        if job.options.allow_slower:
            return None
        return self._fastest_verified(job, job.comp, verdict.evidence)

    # -- timing ------------------------------------------------------------------------------------
    def _digest(self, source: bytes | Path | InMemoryModel) -> str:
        if id(source) not in self.hashed or self.hashed[id(source)][0] is not source:
            digest = source.digest() if isinstance(source, InMemoryModel) else _sha256(source)
            self.hashed[id(source)] = (source, digest)
            while len(self.hashed) > 4:
                self.hashed.popitem(last=False)
        return self.hashed[id(source)][1]

    def _timings(self, job: OptimizeRun, candidate: Compilation, against: Compilation | None = None) -> Comparison:
        """``candidate`` timed against the original, or against another variant (``against``). Where the clock
        loads models from memory (``ModelClock.in_memory``, the real one) a model is hashed and loaded as an
        ``InMemoryModel``: no serialisation of it is made or held while its session runs."""
        in_memory = self.interleave and job.optimizer.clock.in_memory
        variants = {"original": against.buckets[0].model if against else None, "optimized": candidate.buckets[0].model}
        models: dict[str, bytes | Path | InMemoryModel] = {}
        for name, model in variants.items():
            loaded = None
            if in_memory:
                loaded = InMemoryModel.from_ir(model) if model is not None else job.references.in_memory
            if loaded is not None:
                models[name] = loaded
            else:
                models[name] = job.model_source(model) if model is not None else job.original_source
        digests = {name: self._digest(source) for name, source in models.items()}
        # Against the original only "slower?" decides anything; the fastest-variant switch needs "faster".
        question = "slower" if against is None else "both"
        key = _comparison_key(job.optimizer.target, digests, self.feeds, self.rounds, self.interleave, question)
        comparison = _cached_comparison(job.cache, key)
        if comparison is not None:
            self.reused.add(id(comparison))
        else:
            comparison = _sequential_comparison(
                models, self.feeds, self.rounds, self.interleave, job.optimizer.clock, question
            )
            # As the kernel cache will hold it (rounded): a later job reading it decides the same.
            comparison = Comparison.from_dict(comparison.as_dict())
            if comparison.verdict != "slower" and job.cache is not None:
                job.cache.put(key, json.dumps(comparison.as_dict()).encode())
        if against is None:
            self.tried.append((comparison, candidate))
        return comparison

    @staticmethod
    def _verified(job: OptimizeRun, candidate: Compilation) -> bool:
        return not job.options.validate_outputs or all(r.ok for r in validate_buckets(job, candidate))

    def _fastest_verified(self, job: OptimizeRun, comp: Compilation, measured: Comparison):
        """Of the variants timed during the bisection (the one with every rewrite off among them), the one
        with the lowest time ratio to the original, if it validates and is significantly faster than ``comp``
        timed side by side with it (None otherwise: a variant within noise of it is no reason to change), with
        the rollback it records and its verdict."""
        others = [pair for pair in self.tried if pair[1] is not comp and pair[0].ratio < measured.ratio]
        if not others:
            return None
        comparison, candidate = min(others, key=lambda pair: pair[0].ratio)
        against_current = self._timings(job, candidate, against=comp)
        if against_current.verdict != "faster" or not self._verified(job, candidate):
            return None
        switched_off = sorted(set(candidate.disabled) - set(comp.disabled))
        rollback = {
            "rewrite": ", ".join(switched_off),
            "reason": "latency",
            "detail": f"still slower ({_slower_text(measured)}); shipped the fastest verified variant "
            f"(time ratio {comparison.ratio:.3f}, {against_current.ratio:.3f} of the variant it replaced)",
        }
        verdict = Verdict(comparison.verdict != "slower", comparison, _slower_text(comparison))
        return candidate, rollback, verdict


@verifier("timed_here")
class TimedHere(NeverSlower):
    """The same timing where the target does not run here (an accelerator): this CPU's figure checks the
    graph, it is not the part's latency, so nothing is rolled back and no warning would read as the device's
    (the figure stays in report.json's latency, labelled)."""

    decides = False


def _sha256(source: bytes | Path) -> str:
    if isinstance(source, Path):
        digest = hashlib.sha256()
        with open(source, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        return digest.hexdigest()
    return hashlib.sha256(source).hexdigest()


def _comparison_key(
    target: TargetSpec,
    digests: dict,
    feeds: dict,
    rounds: int,
    interleave: bool,
    question: Question = "slower",
) -> str:
    """What a whole-model comparison's verdict rests on: both models' bytes (``digests``: name -> sha256),
    the inputs' shapes and values, the rounds asked for, the question its early stop answered, the runtime
    and this machine."""
    canonical = {
        "model_comparison": dict(sorted(digests.items())),
        "feeds": {name: [list(a.shape), a.dtype.name, hashlib.sha256(a.tobytes()).hexdigest()]
                  for name, a in sorted(feeds.items())},  # fmt: skip
        "rounds": rounds,
        "min_effect": MODEL_MIN_EFFECT,
        "interleave": interleave,
        "question": question,
        "runtime": {"ort": ort.__version__, "level": "all", "threads": 1},
        "machine": machine_fingerprint(),
    }
    return kernel_key(canonical, target, __version__)


def _cached_comparison(cache, key: str) -> Comparison | None:
    if cache is None:
        return None
    try:
        raw = cache.get(key)
        return Comparison.from_dict(json.loads(raw)) if raw is not None else None
    except Exception:  # noqa: BLE001 - a broken cache is a cache that misses
        return None


# Rounds at which a whole-model comparison may stop before ``rounds`` (``significance.settled_early``, 99%).
MODEL_EARLY_LOOKS = (MIN_ROUNDS, 14)


def _sequential_comparison(
    models,
    feeds,
    rounds: int,
    interleave: bool,
    clock: ModelClock,
    question: Question = "slower",
) -> Comparison:
    """Paired rounds of ``models['optimized']`` against ``models['original']``, each loaded once for the
    whole comparison. Stops at a look of ``MODEL_EARLY_LOOKS`` when the answer to ``question`` is already
    plain (``significance.settled_early``: "slower?" for the never-slower check, where a model at 0.98x
    need not be timed until "faster" is settled too), else runs ``rounds``; while the interval still straddles the
    slower-threshold, more rounds in the same sessions (up to 8x, ~3 s): a verdict near the threshold settles
    on the truth instead of following the noise of one short measurement. Each comparison opens its own
    sessions, so that the re-measurement before a rollback is independent of the first (a session's
    memory placement can bias all of its runs alike)."""
    if not interleave:  # weights in external data: one model in memory at a time, sessions not kept
        samples = clock.samples(models, feeds, repeats=rounds, interleave=False)

        def more(count: int) -> None:
            extra = clock.samples(models, feeds, repeats=count, interleave=False)
            for name in samples:
                samples[name].extend(extra[name])
    else:
        timer = clock.rounds(models, feeds)
        samples = timer.more(MIN_ROUNDS)
        for look in (*MODEL_EARLY_LOOKS[1:], rounds):
            done = len(samples["original"])
            settled = settled_early(
                samples["original"], samples["optimized"], min_effect=MODEL_MIN_EFFECT, question=question
            )
            if settled or done >= rounds:
                break
            samples = timer.more(min(look, rounds) - done)

        def more(count: int) -> None:
            timer.more(count)

    started = time.perf_counter()
    while True:
        comparison = paired(samples["original"], samples["optimized"], min_effect=MODEL_MIN_EFFECT)
        threshold = 1.0 + MODEL_MIN_EFFECT
        settled = comparison.verdict != "tie" or not comparison.low <= threshold <= comparison.high
        if settled or comparison.rounds >= 8 * rounds or time.perf_counter() - started > 3.0:
            return comparison
        more(rounds)


def _slower_text(comparison: Comparison) -> str:
    low, high = comparison.low, comparison.high
    return (
        f"optimised {comparison.second_s * 1e3:.3f} ms vs original {comparison.first_s * 1e3:.3f} ms, time ratio "
        f"{comparison.ratio:.3f} (95% interval {low:.3f}-{high:.3f} over {comparison.rounds} paired rounds)"
    )
