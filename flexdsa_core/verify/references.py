"""``References``: the inputs validation and the latency check use, and the original model's outputs on them,
made once per job (``verify.validation``)."""

from __future__ import annotations

from pathlib import Path

from flexdsa_core.in_memory import InMemoryModel
from flexdsa_core.ort_runs import make_inputs, proto_without_weights, run, second_shape_dims, session
from flexdsa_core.shape_plan import LOWERED, lowered
from flexdsa_core.targets import BucketModel

__all__ = ["References"]


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
        shorter than the default 128 that no probe met), its free dims step down ``shape_plan.LOWERED`` until it
        runs (``shape_plan.lowered``), with a note."""
        original = None

        def outputs(feeds: dict) -> dict:
            nonlocal original
            if original is None:
                original = session(self.runtime)
            return run(original, feeds)

        key = (bucket.name, tuple(sorted(bucket.at.items())))
        if key not in self._main:
            proto, error = proto_without_weights(bucket.model), None
            for ceiling in (None, *LOWERED):
                dims = bucket.at if ceiling is None else lowered(bucket.at, ceiling)
                if ceiling is not None and dims == bucket.at:
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
