"""Validation and the padding check: every bucket's outputs against the original's, and whether a request
smaller than its bucket may be padded up to it.

``References`` (``references.py``) makes the inputs once per job (and the original's outputs on them); ``validate_buckets``
compares every bucket at its one shape (``BucketModel.at``) and a second, small one; ``Validation`` rolls
back the rewrite that broke the numerics (``verify.roll_back``), ``Padding`` records what the runtime may pad.
"""

from __future__ import annotations

from flexdsa_core.compilation import MAX_ROLLBACKS, Compilation
from flexdsa_core.errors import ValidationFailedError
from flexdsa_core.memory_planner import plan_memory
from flexdsa_core.optimize_run import OptimizeRun
from flexdsa_core.ort_runs import compare, proto_without_weights, session
from flexdsa_core.padding_check import check_padding
from flexdsa_core.verify import Verdict, Verifier, roll_back, verifier
from flexdsa_core.verify.references import References


def validate_buckets(job: OptimizeRun, comp: Compilation) -> list:
    """Every bucket's outputs against the original's at the bucket's one shape (``BucketModel.at``); a
    bucket whose dims stay symbolic is checked at a second, small shape too (batch 2, other dims 8), so
    a rewrite that holds at one size only is caught."""
    options, references = job.options, job.references
    tolerances = {k: (v.atol, v.rtol) for k, v in (options.tolerances or {}).items()}
    results = []
    for bucket in comp.buckets:
        shapes = bucket_inputs(comp, bucket, references, second=True)
        optimized = job.runtime(bucket.model)
        if len(shapes) > 1:  # one load for both shapes (a load fails like a run: in compare, as before)
            try:
                optimized = session(optimized)
            except Exception:  # noqa: BLE001 - compare reports ORT's refusal with its words
                pass
        checked = [
            compare(job.original_source, optimized, feeds, bucket=bucket.name, tolerances=tolerances, reference=reference)
            for feeds, reference in shapes
        ]  # fmt: skip
        first = checked[0]
        if len(checked) > 1:
            first.second_shape = checked[1]
            first.ok = first.ok and checked[1].ok
        results.append(first)
    return results


def bucket_inputs(comp, bucket, references: References, *, second: bool) -> list[tuple[dict, dict]]:
    """``references.inputs`` for ``bucket``; where the original refused the costed shape and ran at a
    lower one, the bucket's shape and memory plan follow it."""
    dims, shapes = references.inputs(bucket, second=second)
    if dims != bucket.at:
        bucket.at = dims
        comp.memory[bucket.name] = plan_memory(bucket.model, dims=dims).as_dict()
    return shapes


def _failure(results) -> str:
    return "; ".join(f"[{r.bucket}] {r.describe_failure()}" for r in results if not r.ok)


@verifier("validation")
class Validation(Verifier):
    """Every bucket against the original in ONNX Runtime; on a mismatch, bisect the rewrite that broke the
    numerics and switch it off (unless the options allow the mismatch or forbid the rollback)."""

    name, stage, reason, finishes = "validation", "validate", "numerics", True
    message = None  # said by ``verify`` itself, after the references are made
    bisecting = "bisecting the rewrite that broke the numerics"

    def applies(self, job: OptimizeRun) -> bool:
        return job.options.validate_outputs

    def check(self, job: OptimizeRun, comp: Compilation) -> Verdict:
        results = validate_buckets(job, comp)
        ok = all(r.ok for r in results)
        return Verdict(ok, [r.as_dict() for r in results], None if ok else _failure(results))

    def verify(self, job: OptimizeRun) -> Verdict:
        job.progress("validate", 0.0, "comparing outputs with the original in ONNX Runtime")
        verdict = self.check(job, job.comp)
        if not verdict.ok and not job.options.allow_mismatch:
            if not job.options.rollback_on_mismatch:
                raise ValidationFailedError(f"Optimised outputs differ from the original: {verdict.failure}")
            verdict = roll_back(self, job, verdict)
            if not verdict.ok:
                raise ValidationFailedError(
                    f"Optimised outputs still differ after {MAX_ROLLBACKS} rollbacks: {verdict.failure}"
                )
        return verdict

    def gave_up(self, job: OptimizeRun, verdict: Verdict) -> Verdict:
        raise ValidationFailedError(
            "Optimised outputs differ from the original and switching off every rewrite did not restore "
            f"them: {verdict.failure}"
        )


@verifier("padding")
class Padding(Verifier):
    """Whether a request smaller than its bucket may be padded up to it (mask, causal, batch rows) or must be
    served at a bucket's exact size; the manifest tells the runtime which (``padding_check``)."""

    name, stage = "padding", "padding_check"

    def verify(self, job: OptimizeRun) -> Verdict:
        options = job.options
        padding = check_padding(
            job.references.runtime, proto_without_weights(job.tracker.model), job.tracker.manifest(),
            job.shape_report.as_dict()["outputs"], seed=options.seed,
            tolerances={k: (v.atol, v.rtol) for k, v in (options.tolerances or {}).items()},
        )  # fmt: skip
        refused = [dim for dim, found in padding["dims"].items() if found.get("tolerated") is False]
        return Verdict(not refused, padding, f"padding {', '.join(refused)} changes the outputs" if refused else None)
