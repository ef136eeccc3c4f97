"""The verifiers of the verified run: each judges the compiled result and answers one ``Verdict``.

    verdict = verifier.verify(job)      # Verdict(ok, evidence, failure), or a subclass with typed fields

``Verifier`` is the one contract: ``name``, the ``stage`` its time and progress are reported under,
``applies(job)`` and ``verify(job)``. Its ``Verdict`` carries its evidence (what the report shows; the
bundle is assembled from the verdicts, ``bundle.py``). A target's adapter lists the verifiers its run goes
through by the names ``@verifier`` registers (``PlatformAdapter.verifiers``); ``verifiers_named`` makes them.
The built-in ones, in the default order: ``Validation`` and ``Padding`` (``validation.py``), ``NeverSlower``
or ``TimedHere`` (``latency.py``), ``Precision`` (``precision.py``); accelerators add ``VendorExploration``,
``VendorBuild`` and ``VendorVerdicts`` (``toolchain.py``). A new cost source or check is one more ``Verifier``.

``roll_back`` is the one rollback path. A verifier that can undo a rewrite gives ``check(job, comp)`` (the
verdict on one compilation): while it fails, the culprit rewrite is bisected (``compilation.bisect``) and
switched off; where that ends without a passing verdict, the verifier's ``fallback`` may name another
compilation to ship (the fastest verified variant; the original where the vendor's build failed on ours).
Every replacement of the shipped compilation goes through ``switch``, which records it. The loadability
check of the compile itself (``Loads``) is a verifier of the same kind.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flexdsa_core.compilation import MAX_ROLLBACKS, Compilation, bisect
from flexdsa_core.loadable import InternalGraphError, UnloadableGraph

__all__ = ["VERIFIERS", "Loads", "Verdict", "Verifier", "roll_back", "switch", "verifier", "verifiers_named"]


@dataclass
class Verdict:
    """What a verifier found: ``ok``, the ``evidence`` it rests on (what the report shows) and, when not
    ok, the ``failure`` in words (what a rollback records as its detail). A verifier whose later readers need
    more than the report's evidence returns a subclass with typed fields (``PrecisionVerdict``,
    ``ExplorationVerdict``, ``BuildVerdict``, ``ShippedVerdict``), read through ``OptimizeRun.verdict``."""

    ok: bool
    evidence: Any = None
    failure: str | None = None


class Verifier:
    """One check of the verified run. Subclasses set ``name``/``stage``/``message`` and implement
    ``verify``; those that roll back also ``check`` one compilation (and may override the hooks below)."""

    name: str = ""
    stage: str = ""  # progress key
    timed_as: str | None = ...  # type: ignore[assignment]  # stage_seconds key (default: ``stage``; None: untimed)
    message: str | None = None  # progress message when it starts
    reason: str = ""  # the rollback reason it records ("numerics", "latency")
    bisecting: str = ""  # progress message while it bisects
    # Whether the run's progress counts the stage as done after it, whether it ran or not.
    finishes: bool = False

    def applies(self, job) -> bool:
        return True

    def start_message(self, job) -> str | None:
        return self.message

    @property
    def seconds_key(self) -> str | None:
        return self.stage if self.timed_as is ... else self.timed_as

    def verify(self, job) -> Verdict:
        raise NotImplementedError

    # -- for verifiers that undo rewrites (``roll_back``) --------------------------------------------
    bisects: bool = True  # whether a failing verdict is first bisected to the rewrite that makes it fail

    def check(self, job, comp: Compilation) -> Verdict:
        raise NotImplementedError

    def confirm(self, job, comp: Compilation, verdict: Verdict) -> Verdict:
        """A second look before acting on a failed verdict (a timing re-measured); by default the same one."""
        return verdict

    def accept(self, job, candidate: Compilation) -> bool:
        """Whether the compilation without the culprit may replace the current one."""
        return True

    def gave_up(self, job, verdict: Verdict) -> Verdict:
        """No culprit found (or it could not be accepted): by default the verdict stands as it is."""
        return verdict

    def fallback(self, job, verdict: Verdict) -> tuple[Compilation, dict | None, Verdict] | None:
        """Still failing after the bisection: another compilation to ship instead, the rollback it records
        (None: none, the verifier's own evidence says why) and its verdict; by default none."""
        return None


# Verifier name (what an adapter's ``verifiers`` lists) -> its class, filled by ``@verifier``.
VERIFIERS: dict[str, type[Verifier]] = {}


def verifier(name: str) -> Callable[[type[Verifier]], type[Verifier]]:
    """Register a ``Verifier`` class under the name an adapter's ``verifiers`` lists."""

    def register(cls: type[Verifier]) -> type[Verifier]:
        if VERIFIERS.get(name, cls) is not cls:
            raise ValueError(f"verifier {name!r} is registered twice ({VERIFIERS[name].__module__} and {cls.__module__})")
        VERIFIERS[name] = cls
        return cls

    return register


@functools.cache
def _discover() -> None:
    """Import every module of ``verify/``, so that each registers its verifiers (discovery, as targets are)."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


def verifiers_named(names: tuple[str, ...], target_name: str) -> tuple[Verifier, ...]:
    """Fresh verifiers for one run, in the order an adapter lists them (each may keep state for the run)."""
    _discover()
    unknown = [name for name in names if name not in VERIFIERS]
    if unknown:
        raise ValueError(
            f"target {target_name!r}: its adapter's verifiers list {unknown}, which no module registers "
            f"(``verify.verifier``); registered: {', '.join(sorted(VERIFIERS))}"
        )
    return tuple(VERIFIERS[name]() for name in names)


def switch(job, candidate: Compilation, rollback: dict | None) -> None:
    """Ship ``candidate`` from here on, recording the ``rollback`` (rewrite, reason, detail) where one is given:
    the one place the job's compilation is replaced after a verdict."""
    if rollback is not None:
        job.rollbacks.append(rollback)
    job.comp = candidate


def roll_back(verifier: Verifier, job, verdict: Verdict) -> Verdict:
    """While ``verdict`` fails: look again (``confirm``), bisect the rewrite that makes it fail, switch it off
    (``switch``: ``job.comp`` becomes the compilation without it, the rollback is recorded) and check again;
    at most ``MAX_ROLLBACKS`` times. Still failing: the verifier's ``fallback``, where it has one. Returns the
    last verdict (the caller decides what a failing one means)."""
    for _ in range(MAX_ROLLBACKS if verifier.bisects else 0):
        if verdict.ok:
            break
        verdict = verifier.confirm(job, job.comp, verdict)
        if verdict.ok:
            break
        if verifier.bisecting:
            job.progress(verifier.stage, 0.5, verifier.bisecting)
        culprit, candidate = bisect(job.comp, lambda c: verifier.check(job, c).ok, job.recompile)
        if culprit is None or not verifier.accept(job, candidate):
            verdict = verifier.gave_up(job, verdict)
            break
        switch(job, candidate, {"rewrite": culprit, "reason": verifier.reason, "detail": verdict.failure})
        verdict = verifier.check(job, job.comp)
    if not verdict.ok:
        found = verifier.fallback(job, verdict)
        if found is not None:
            candidate, rollback, verdict = found
            switch(job, candidate, rollback)
    return verdict


class Loads(Verifier):
    """The compile itself: every bucket loads in ONNX Runtime. A rewrite that makes a graph it refuses (or
    breaks a later stage) is bisected like any culprit (``bisect`` counts such a variant as bad), switched
    off and recorded (``invalid_graph``); a compilation that exists has loaded."""

    name, stage, reason = "loads", "passes", "invalid_graph"

    def __init__(self, failure: UnloadableGraph) -> None:
        self.failure = failure

    def check(self, job, comp: Compilation) -> Verdict:
        return Verdict(True)

    def gave_up(self, job, verdict: Verdict) -> Verdict:
        if self.failure.error is not None:
            raise self.failure.error from None
        raise InternalGraphError(
            f"the optimised graph does not load in ONNX Runtime ({verdict.failure}) "
            "and switching off every rewrite did not fix it"
        ) from None

    @classmethod
    def compile(cls, job, disabled: frozenset[str]) -> None:
        """``job.comp``: the first compile whose every bucket ONNX Runtime loads (``job.recompile``)."""
        try:
            job.comp = job.recompile(disabled)
            return
        except UnloadableGraph as failure:
            job.comp, loads = failure.comp, cls(failure)
        roll_back(loads, job, Verdict(False, None, f"{loads.failure.stage}: {loads.failure.reason}"))
