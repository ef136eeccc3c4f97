"""``OptimizeRun``: the state of one ``FlexDSAOptimizer.optimize`` call, handed from stage to stage and verifier to
verifier (the optimizer instance itself holds only what every call shares: target, adapter, registry).

Each stage reads what the earlier ones left here and adds its own part; each verifier answers a
``verify.Verdict`` (``verdicts``, by verifier name) whose evidence later verifiers and the bundle read
(``evidence``, ``extra``), and replaces the compilation that ships only through ``verify.switch``. ``timed``
and ``progress`` are the one set of timing and progress hooks they all go through.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import onnx_ir as ir

from flexdsa_core.cache import StatsCache
from flexdsa_core.compilation import Compilation
from flexdsa_core.in_memory import InMemoryModel
from flexdsa_core.ingest import Ingested, needs_external_data, save_model
from flexdsa_core.options import OptimizeOptions
from flexdsa_core.serialized import model_bytes

if TYPE_CHECKING:
    from flexdsa_core.cost_model import CostModel
    from flexdsa_core.registry import Registry
    from flexdsa_core.shape_tracker import Bucket, ShapeReport, ShapeTracker
    from flexdsa_core.targets import PlatformAdapter, TargetSpec
    from flexdsa_core.verify import Verdict
    from flexdsa_core.verify.references import References

Progress = Callable[[str, float, str], None]
V = TypeVar("V", bound="Verdict")

# Share of the whole run each stage takes, for one overall progress fraction.
STAGE_WEIGHTS = {
    "ingest": 0.05, "shapes": 0.05, "passes": 0.15, "fusion": 0.30, "memory": 0.05,
    "adapter": 0.05, "validate": 0.20, "measure": 0.10, "report": 0.05, "precision": 0.0,
}  # fmt: skip


class StageProgress:
    """Turns stage-local progress into one overall fraction for the caller's callback."""

    def __init__(self, callback: Progress | None) -> None:
        self.callback = callback
        self.done = 0.0

    def __call__(self, stage: str, local: float = 0.0, message: str = "") -> None:
        if self.callback is not None:
            overall = min(1.0, self.done + STAGE_WEIGHTS.get(stage, 0.0) * max(0.0, min(local, 1.0)))
            self.callback(stage, overall, message)

    def finish(self, stage: str) -> None:
        self.done = min(1.0, self.done + STAGE_WEIGHTS.get(stage, 0.0))


class Runner(Protocol):
    """What stages and verifiers read of the ``FlexDSAOptimizer`` running them (the optimizer imports this
    module, so it is named by what it offers)."""

    target: TargetSpec
    adapter: PlatformAdapter
    registry: Registry
    rules: list
    toolchain_root: Path | None
    clock: Any  # ``verify.latency.ModelClock``

    def supports(self, key: str) -> bool: ...


@dataclass
class OptimizeRun:
    """One optimisation in flight. ``optimizer``: the ``FlexDSAOptimizer`` (target, adapter, registry, clock)."""

    optimizer: Runner
    options: OptimizeOptions
    cache: StatsCache
    progress: StageProgress
    workdir: Path
    calibration: dict | bytes | str | Path | None = None
    started: float = field(default_factory=time.perf_counter)
    stage_seconds: Counter = field(default_factory=Counter)
    # ingest
    ingested: Ingested | None = None
    original_source: bytes | Path | None = None
    original_digest: str | None = None
    original_in_memory: InMemoryModel | None = None
    nodes_before: dict[str, int] = field(default_factory=dict)
    samples: list[dict] | None = None
    # shapes and compile
    tracker: ShapeTracker | None = None
    shape_report: ShapeReport | None = None
    buckets: list[Bucket] = field(default_factory=list)
    cost_model: CostModel | None = None
    recompile: Callable[[frozenset[str]], Compilation] | None = None
    comp: Compilation | None = None
    rollbacks: list[dict] = field(default_factory=list)
    # The inputs validation and the latency check use, and the original's outputs on them.
    references: References | None = None
    # What the verifiers found, by verifier name: each verdict holds its evidence.
    verdicts: dict[str, Verdict] = field(default_factory=dict)

    def evidence(self, verifier: str, default: Any = None) -> Any:
        """The evidence of ``verifier``'s verdict, or ``default`` where it did not run."""
        verdict = self.verdicts.get(verifier)
        return default if verdict is None else verdict.evidence

    def verdict(self, verifier: str, kind: type[V]) -> V | None:
        """``verifier``'s verdict where it ran and returned a ``kind`` (a ``Verdict`` subclass with the typed
        fields its readers need), else None."""
        verdict = self.verdicts.get(verifier)
        return verdict if isinstance(verdict, kind) else None

    @contextmanager
    def timed(self, stage: str):
        """Adds the seconds the block takes to ``stage_seconds[stage]``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.stage_seconds[stage] += time.perf_counter() - start

    def runtime(self, model: ir.Model) -> bytes | Path | InMemoryModel:
        """What ONNX Runtime loads a finished model from: its weights read from memory, or for models with
        external data a file written with its data."""
        if not needs_external_data(model):
            return InMemoryModel.from_ir(model)
        return self.model_source(model)

    def model_source(self, model: ir.Model) -> bytes | Path:
        """What ONNX Runtime loads: bytes, or for models with external data a file written with its data."""
        if not needs_external_data(model):
            return model_bytes(model)  # once per finished model (``serialized``)
        folder = Path(tempfile.mkdtemp(prefix="validate-", dir=self.workdir))
        return save_model(model, folder / "model.onnx")[0]
