"""The verifiers of the verified run: each judges the compiled result and answers one ``Verdict``.

    verdict = verifier.verify(job)      # Verdict(ok, evidence, failure)

``Verifier`` is the one contract: ``name``, the ``stage`` its time and progress are reported under,
``applies(job)`` and ``verify(job)``. A verifier that can undo a rewrite also gives ``check(job, comp)``
(the verdict on one compilation) and goes through ``roll_back``: the one rollback loop, over the one
bisection (``compilation.bisect``), that validation and the never-slower check share. The verifiers, in the
order the optimizer runs them: ``Validation`` and ``Padding`` (``validation.py``), ``NeverSlower``
(``latency.py``), ``Precision`` (``precision.py``), ``Toolchain`` (``toolchain.py``). A new cost source or
check (vendor-scored exploration is one, inside ``Toolchain``) is one more ``Verifier``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from flexdsa_core.compilation import MAX_ROLLBACKS, Compilation, bisect

__all__ = ["Verdict", "Verifier", "roll_back"]


@dataclass
class Verdict:
    """What a verifier found: ``ok``, the ``evidence`` it rests on (what the report shows) and, when not
    ok, the ``failure`` in words (what a rollback records as its detail)."""

    ok: bool
    evidence: Any = None
    failure: str | None = None
    extra: dict = field(default_factory=dict)


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


def roll_back(verifier: Verifier, job, verdict: Verdict) -> Verdict:
    """While ``verdict`` fails: look again (``confirm``), bisect the rewrite that makes it fail, switch it off
    (``job.comp`` becomes the compilation without it, the rollback is recorded) and check again; at most
    ``MAX_ROLLBACKS`` times. Returns the last verdict (the caller decides what a failing one means)."""
    for _ in range(MAX_ROLLBACKS):
        if verdict.ok:
            break
        verdict = verifier.confirm(job, job.comp, verdict)
        if verdict.ok:
            break
        job.progress(verifier.stage, 0.5, verifier.bisecting)
        culprit, candidate = bisect(job.comp, lambda c: verifier.check(job, c).ok, job.recompile)
        if culprit is None or not verifier.accept(job, candidate):
            return verifier.gave_up(job, verdict)
        job.rollbacks.append({"rewrite": culprit, "reason": verifier.reason, "detail": verdict.failure})
        job.comp = candidate
        verdict = verifier.check(job, job.comp)
    return verdict
