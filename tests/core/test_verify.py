"""The verifiers' one contract (``verify``): a verifier answers a ``Verdict``; one that can undo a rewrite
goes through ``roll_back``, which bisects the culprit, switches it off, records it and checks again.
Here with a stand-in pipeline: a compilation 'fails' while a named rewrite is applied."""

from __future__ import annotations

from collections import Counter

import pytest

from flexdsa_core.compilation import MAX_ROLLBACKS, Compilation
from flexdsa_core.verify import Verdict, Verifier, roll_back

REWRITES = ("a", "b", "c", "d", "e", "f")


def _compile(disabled: frozenset[str]) -> Compilation:
    applied = [name for name in REWRITES if name not in disabled]
    return Compilation(frozenset(disabled), [], applied, {}, {}, {}, {}, Counter())


class _Job:
    def __init__(self) -> None:
        self.comp = _compile(frozenset())
        self.recompile = _compile
        self.rollbacks: list[dict] = []
        self.messages: list[tuple[str, str]] = []

    def progress(self, stage: str, fraction: float, message: str) -> None:
        self.messages.append((stage, message))


class _Breaks(Verifier):
    """Fails while any of ``culprits`` is applied; counts its checks."""

    name, stage, reason, bisecting = "breaks", "validate", "numerics", "bisecting"

    def __init__(self, *culprits: str, accept: bool = True) -> None:
        self.culprits, self.accepting, self.checks = set(culprits), accept, 0

    def check(self, job, comp):
        self.checks += 1
        bad = sorted(self.culprits & set(comp.applied))
        return Verdict(not bad, comp.applied, f"broken by {bad}" if bad else None)

    def accept(self, job, candidate) -> bool:
        return self.accepting


def test_a_passing_verdict_is_returned_untouched():
    job, verifier = _Job(), _Breaks()
    verdict = roll_back(verifier, job, verifier.check(job, job.comp))
    assert verdict.ok and job.rollbacks == [] and job.messages == []


@pytest.mark.parametrize("culprits", [("c",), ("a", "f"), ("b", "d", "e")])
def test_each_culprit_is_found_switched_off_and_recorded(culprits):
    job, verifier = _Job(), _Breaks(*culprits)
    verdict = roll_back(verifier, job, verifier.check(job, job.comp))
    assert verdict.ok
    assert sorted(r["rewrite"] for r in job.rollbacks) == sorted(culprits)
    assert {r["reason"] for r in job.rollbacks} == {"numerics"}
    assert job.rollbacks[0]["detail"] == f"broken by {sorted(culprits)}"
    assert set(job.comp.disabled) == set(culprits)
    assert job.messages == [("validate", "bisecting")] * len(culprits)


def test_a_culprit_the_verifier_will_not_accept_ends_the_rollback():
    job, verifier = _Job(), _Breaks("c", accept=False)
    verdict = roll_back(verifier, job, verifier.check(job, job.comp))
    assert not verdict.ok and job.rollbacks == [] and job.comp.disabled == frozenset()


def test_at_most_max_rollbacks():
    job, verifier = _Job(), _Breaks(*REWRITES)
    assert len(REWRITES) == MAX_ROLLBACKS
    verdict = roll_back(verifier, job, verifier.check(job, job.comp))
    assert verdict.ok and len(job.rollbacks) == MAX_ROLLBACKS


def test_a_failure_nothing_explains_is_given_up():
    class Always(_Breaks):
        def check(self, job, comp):
            return Verdict(False, None, "always")

        def gave_up(self, job, verdict):
            return Verdict(False, None, "gave up: " + verdict.failure)

    job = _Job()
    verdict = roll_back(Always(), job, Verdict(False, None, "always"))
    assert verdict.failure == "gave up: always" and job.rollbacks == []


def test_an_unloadable_compile_goes_through_the_same_rollback():
    """``Loads``: a compile that raises ``UnloadableGraph`` while a rewrite is applied has that rewrite bisected,
    switched off and recorded as ``invalid_graph`` by ``roll_back``, like any other culprit."""
    from flexdsa_core.loadable import UnloadableGraph
    from flexdsa_core.verify import Loads

    def compile_or_refuse(disabled: frozenset[str]) -> Compilation:
        comp = _compile(disabled)
        if "d" in comp.applied:
            raise UnloadableGraph(comp, "load[b1]", "Type Error")
        return comp

    job = _Job()
    job.recompile = compile_or_refuse
    Loads.compile(job, frozenset())
    assert job.comp.disabled == frozenset({"d"})
    assert job.rollbacks == [{"rewrite": "d", "reason": "invalid_graph", "detail": "load[b1]: Type Error"}]


def test_an_unloadable_compile_nothing_explains_raises_its_error():
    from flexdsa_core.loadable import InternalGraphError, UnloadableGraph
    from flexdsa_core.verify import Loads

    def never_loads(disabled: frozenset[str]) -> Compilation:
        raise UnloadableGraph(_compile(disabled), "load[b1]", "Type Error")

    job = _Job()
    job.recompile = never_loads
    with pytest.raises(InternalGraphError, match="switching off every rewrite did not fix it"):
        Loads.compile(job, frozenset())
