"""Validation and the padding check: every bucket's outputs against the original's, and whether a request
smaller than its bucket may be padded up to it.

``References`` makes the inputs once per job (and the original's outputs on them); ``validate_buckets``
compares every bucket at its one shape (``BucketModel.at``) and a second, small one; ``Validation`` rolls
back the rewrite that broke the numerics (``verify.roll_back``), ``Padding`` records what the runtime may pad.
"""

from __future__ import annotations

from pathlib import Path

from flexdsa_core.compilation import MAX_ROLLBACKS, Compilation
from flexdsa_core.dims import is_batch_dim
from flexdsa_core.errors import ValidationFailedError
from flexdsa_core.in_memory import InMemoryModel
from flexdsa_core.job import Job
from flexdsa_core.memory_planner import plan_memory
from flexdsa_core.padding_check import check_padding
from flexdsa_core.targets import BucketModel
from flexdsa_core.validate import compare, make_inputs, proto_without_weights, run, second_shape_dims, session
from flexdsa_core.verify import Verdict, Verifier, roll_back


class References:
    """The inputs validation and the latency check use, and the original model's outputs on them, per bucket
    shape: made once per job (every re-validation of a bisection reads them again). The original is loaded
    for the runs of one call and let go (a large model's weights are not held a second time meanwhile)."""

    def __init__(
        self,
        original_source: bytes | Path,
        seed: int,
        digest: str | None = None,
        in_memory: InMemoryModel | None = None,
    ) -> None:
        self.original_source = original_source
        self.seed = seed
        # sha256 of ``original_source`` where ingest already took it (a 200 MB model is not hashed twice).
        self.digest = digest
        # The same model for ONNX Runtime with its weights read from memory (``in_memory``), where it can be.
        self.in_memory = in_memory
        # (bucket, costed dims) -> (dims the original runs at, feeds, its outputs)
        self._main: dict[tuple, tuple[dict[str, int], dict, dict]] = {}
        self._second: dict[str, tuple[dict, dict] | None] = {}  # bucket -> the second shape's, or None
        self.notes: dict[str, str] = {}  # bucket -> why its shape is not the costed one

    def release(self) -> None:
        """Let go of the original's in-memory copy and of the reference inputs and outputs (the notes stay)."""
        self.in_memory = None
        self._main.clear()
        self._second.clear()

    @property
    def runtime(self) -> bytes | Path | InMemoryModel:
        """What ONNX Runtime loads the original from."""
        return self.in_memory if self.in_memory is not None else self.original_source

    def inputs(self, bucket: BucketModel, *, second: bool) -> tuple[dict[str, int], list[tuple[dict, dict]]]:
        """(the dims used, [(feeds, outputs)] at ``bucket.at`` and, with ``second`` and symbolic dims, at the
        small second shape). Where the original itself cannot run at the costed shape (a position table
        shorter than the default 128 that no probe met), its free dims are lowered until it runs, with a note."""
        original = None

        def outputs(feeds: dict) -> dict:
            nonlocal original
            if original is None:
                original = session(self.runtime)
            return run(original, feeds)

        key = (bucket.name, tuple(sorted(bucket.at.items())))
        if key not in self._main:
            proto, error = proto_without_weights(bucket.model), None
            for lowered in (None, 64, 32, 16, 8):
                dims = bucket.at if lowered is None else {
                    k: (v if is_batch_dim(k) else min(v, lowered)) for k, v in bucket.at.items()
                }  # fmt: skip
                if lowered is not None and dims == bucket.at:
                    continue
                feeds = make_inputs(proto, seed=self.seed, dims=dims)
                try:
                    found = (dict(dims), feeds, outputs(feeds))
                    break
                except Exception as err:  # noqa: BLE001 - ORT raises many types; the smallest shape re-raises
                    error = err
            else:
                raise error
            if dims != bucket.at:
                self.notes[bucket.name] = (
                    f"costed at {bucket.at}, but the original model does not run there "
                    f"({str(error).splitlines()[0][:160]}): validated, timed and memory-planned at {dims}"
                )
            self._main[key] = self._main[(bucket.name, tuple(sorted(dims.items())))] = found
        dims, feeds, reference = self._main[key]
        shapes = [(feeds, reference)]
        if second and bucket.at:
            if bucket.name not in self._second:
                proto = proto_without_weights(bucket.model)
                small = make_inputs(proto, seed=self.seed, dims=second_shape_dims(bucket.at))
                same = {k: v.shape for k, v in small.items()} == {k: v.shape for k, v in feeds.items()}
                self._second[bucket.name] = None if same else self._second_shape(bucket, small, outputs)
            if self._second[bucket.name] is not None:
                shapes.append(self._second[bucket.name])
        return dims, shapes

    def _second_shape(self, bucket: BucketModel, small: dict, outputs) -> tuple[dict, dict] | None:
        """The second shape's (feeds, outputs); None, with a note, where the original itself does not run
        there (a model that takes one sequence length only): nothing to compare the optimised model with."""
        try:
            return small, outputs(small)
        except Exception as err:  # noqa: BLE001 - ORT raises many types
            shapes = {k: list(v.shape) for k, v in small.items()}
            note = (
                f"not validated at a second shape: the original model does not run at {shapes} "
                f"({str(err).splitlines()[0][:160]})"
            )
            self.notes[bucket.name] = f"{self.notes[bucket.name]}; {note}" if bucket.name in self.notes else note
            return None


def validate_buckets(job: Job, comp: Compilation) -> list:
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


class Validation(Verifier):
    """Every bucket against the original in ONNX Runtime; on a mismatch, bisect the rewrite that broke the
    numerics and switch it off (unless the options allow the mismatch or forbid the rollback)."""

    name, stage, reason, finishes = "validation", "validate", "numerics", True
    message = None  # said by ``verify`` itself, after the references are made
    bisecting = "bisecting the rewrite that broke the numerics"

    def applies(self, job: Job) -> bool:
        return job.options.validate_outputs

    def check(self, job: Job, comp: Compilation) -> Verdict:
        results = validate_buckets(job, comp)
        ok = all(r.ok for r in results)
        return Verdict(ok, [r.as_dict() for r in results], None if ok else _failure(results))

    def verify(self, job: Job) -> Verdict:
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
        job.validation = verdict.evidence
        return verdict

    def gave_up(self, job: Job, verdict: Verdict) -> Verdict:
        raise ValidationFailedError(
            "Optimised outputs differ from the original and switching off every rewrite did not restore "
            f"them: {verdict.failure}"
        )


class Padding(Verifier):
    """Whether a request smaller than its bucket may be padded up to it (mask, causal, batch rows) or must be
    served at a bucket's exact size; the manifest tells the runtime which (``padding_check``)."""

    name, stage = "padding", "padding_check"

    def verify(self, job: Job) -> Verdict:
        options = job.options
        padding = check_padding(
            job.references.runtime, proto_without_weights(job.tracker.model), job.tracker.manifest(),
            job.shape_report.as_dict()["outputs"], seed=options.seed,
            tolerances={k: (v.atol, v.rtol) for k, v in (options.tolerances or {}).items()},
        )  # fmt: skip
        job.padding = padding
        refused = [dim for dim, found in padding["dims"].items() if found.get("tolerated") is False]
        return Verdict(not refused, padding, f"padding {', '.join(refused)} changes the outputs" if refused else None)
