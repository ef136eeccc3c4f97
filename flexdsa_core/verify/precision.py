"""Precision as a verifier: the verified, timed fp32 result quantised (cpu-ort) or halved (accelerators),
judged by the accuracy target on held-out samples (``flexdsa_core.precision``); never slower than fp32,
never below the target. Its verdict is the shipped precision's; a bucket that ships fp32 instead says why.
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from flexdsa_core.calibration import CalibrationError, check_calibration, synthetic_samples
from flexdsa_core.optimize_run import OptimizeRun
from flexdsa_core.ort_runs import proto_without_weights
from flexdsa_core.precision import (
    QDQ_OPAQUE_WEIGHT_OPS,
    PrecisionRun,
    apply_precision,
    int8_format,
    replace_model,
)
from flexdsa_core.verify import Verdict, Verifier, switch, verifier


@verifier("precision")
class Precision(Verifier):
    """Every bucket at the requested precision (``precision_buckets``). Its evidence is the report's
    ``precision`` section; its ``PrecisionVerdict`` also holds each bucket's samples and ``PrecisionRun``."""

    name, stage = "precision", "precision"

    def applies(self, job: OptimizeRun) -> bool:
        return job.options.precision != "fp32"

    def start_message(self, job: OptimizeRun) -> str:
        return f"{job.options.precision}: calibrating, scoring and timing"

    def verify(self, job: OptimizeRun) -> Verdict:
        comp, section, samples, runs = precision_buckets(
            job, job.comp, job.original_source, job.options, job.samples, job.recompile, job.progress, job.cache
        )
        switch(job, comp, None)  # each bucket's model at the precision it ships
        shipped = section.get("shipped")
        return PrecisionVerdict(shipped not in (None, "fp32") or job.options.precision == "fp32", section,
                                None if shipped not in (None, "fp32") else f"{job.options.precision} not shipped",
                                samples=samples, runs=runs)  # fmt: skip


@dataclass
class PrecisionVerdict(Verdict):
    """The precision search's verdict: beside the report's section, each bucket's samples (``samples``: the
    bundle's calibration files) and its ``PrecisionRun`` (``runs``: what the vendor's quantiser and simulator
    are given)."""

    samples: dict[str, list[dict]] = field(default_factory=dict)
    runs: dict[str, PrecisionRun] = field(default_factory=dict)


def precision_buckets(job: OptimizeRun, comp, original_source, options, samples, recompile, progress, cache=None):
    """Every shape bucket at the requested precision, each calibrated and judged at its own shapes: on the
    user's samples where they fit the bucket, else on synthetic inputs with a warning naming the bucket
    (samples that fit no bucket are refused). The report's ``precision`` section is the first bucket's,
    with ``buckets`` holding each bucket's when there are several."""
    per_bucket = _bucket_samples(comp.buckets, options, samples)
    vendor = int8_format(job.optimizer.target)
    cpu_formats = options.precision in ("int8", "mixed") and vendor is not None and vendor.vendor is None
    fp32_models, unfused_models = [b.model for b in comp.buckets], [None] * len(comp.buckets)
    if cpu_formats:
        # Rewrites for the float model only (ONNX Runtime's offline layout pass: NCHWc, its internal
        # fusions) are left out: the quantiser takes our graph, and ONNX Runtime fuses the quantised graph
        # itself when it loads it.
        float_only = job.optimizer.registry.float_only()
        fp32_models = [b.model for b in recompile(frozenset(comp.disabled | float_only)).buckets]
        # The same model without the fusions whose com.microsoft ops hold weights the QDQ quantiser
        # leaves in float: quantising before them may be faster (measured, as a candidate).
        opaque = {r.name for r in job.optimizer.rules if set(r.produces) & QDQ_OPAQUE_WEIGHT_OPS}
        if opaque & set(comp.applied):
            unfused_models = [
                b.model for b in recompile(frozenset(comp.disabled | opaque | float_only)).buckets
            ]
    sections, runs, models = {}, {}, []
    for index, bucket in enumerate(comp.buckets):
        bucket_samples, synthetic, misfit = per_bucket[bucket.name]
        folder = Path(tempfile.mkdtemp(prefix=f"precision-{index}-", dir=job.workdir))
        run = PrecisionRun(
            options, job.optimizer.target, original_source, fp32_models[index], bucket_samples, synthetic, folder,
            unfused_models[index], progress, cache,
        )  # fmt: skip
        if not synthetic:  # what the calibration file said of the samples: their labels and sources
            run.labels, run.groups = getattr(samples, "labels", None), getattr(samples, "groups", None)
        model, section = apply_precision(run)
        section["bucket"] = bucket.name
        if misfit:
            section["warnings"].append(
                f"your calibration samples do not fit shape bucket {bucket.name!r} ({misfit}): it was "
                "calibrated and judged on synthetic inputs at its shapes; upload samples at those shapes"
            )
        models.append(model)
        sections[bucket.name], runs[bucket.name] = section, run
    section = dict(sections[comp.buckets[0].name])
    if len(comp.buckets) > 1:
        section["buckets"] = sections
        section["warnings"] = [f"[{name}] {w}" for name, s in sections.items() for w in s["warnings"]]
        section["shipped"] = {name: s.get("shipped") for name, s in sections.items()}
    if any(model is not None for model in models):
        comp = copy.copy(comp)
        comp.buckets = [
            replace_model(bucket, model) if model is not None else bucket
            for bucket, model in zip(comp.buckets, models, strict=True)
        ]
    samples_by_bucket = {name: run.samples for name, run in runs.items()}
    return comp, section, samples_by_bucket, runs


def _bucket_samples(buckets, options, samples) -> dict[str, tuple[list[dict], bool, str | None]]:
    """Per bucket: (calibration samples, synthetic?, why the user's do not fit it). The user's samples where
    they fit the bucket's shapes."""
    found, refusals = {}, []
    for bucket in buckets:
        inputs = proto_without_weights(bucket.model)
        if samples is None:
            found[bucket.name] = (synthetic_samples(inputs, seed=options.seed), True, None)
            continue
        stacked = {name: np.concatenate([s[name] for s in samples]) for name in samples[0]}
        try:  # a bucket fixes dims the samples must have too (seq 128 on an accelerator)
            found[bucket.name] = (check_calibration(inputs, stacked), False, None)
        except CalibrationError as err:
            refusals.append((bucket.name, err))
            found[bucket.name] = (synthetic_samples(inputs, seed=options.seed), True, err.message.rstrip("."))
    if samples is not None and len(refusals) == len(buckets):
        name, err = refusals[0]
        raise CalibrationError(
            f"{err.message.rstrip('.')} (shape bucket {name!r}). Give samples at the bucket's "
            "shapes, or shape_buckets that match the samples.",
            details={**err.details, "bucket": name},
        ) from None
    return found
