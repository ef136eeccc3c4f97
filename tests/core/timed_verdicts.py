"""What two timed runs of the Fusion Switcher may disagree on. A side-by-side comparison whose effect sits
at a threshold (SkipLayerNormalization at 1.13-1.20x against the 1.10 line, seen in CI) can come out
"slower" in one cold run and "tie" in the next, however many rounds it takes: no rule decides such an effect
the same way every time, and a tie goes to the fixed rule. Nor need the two runs' intervals overlap: each
holds the noise within its own rounds, not the machine's state from one run to the next (or a noisy clock's
bias, where noise on the fixed cost of a run is taken off small kernels). What must not happen is opposite
verdicts on one comparison: significantly faster in one run and significantly slower in the other (issue 8:
1.31-1.34 in one run, 0.64-0.74 in the next, from a fixed cost taken at another time)."""

from __future__ import annotations

import json

from flexdsa_core.cache import LRUCache


class VerdictCache(LRUCache):
    """An in-process kernel cache that also keeps every side-by-side comparison put in it, by its key."""

    def __init__(self) -> None:
        super().__init__()
        self.comparisons: dict[str, dict] = {}

    def put(self, key: str, value: bytes) -> None:
        super().put(key, value)
        entry = json.loads(value)
        if isinstance(entry, dict) and "verdict" in entry and "ratio_ci" in entry:
            self.comparisons[key] = entry


def contradictions(first: dict[str, dict], second: dict[str, dict]) -> list[str]:
    """The comparisons both runs made with opposite verdicts (see the module docstring)."""
    return [
        f"{first[key]['verdict']} {first[key]['ratio_ci']} vs {second[key]['verdict']} {second[key]['ratio_ci']}"
        for key in sorted(first.keys() & second.keys())
        if {first[key]["verdict"], second[key]["verdict"]} == {"faster", "slower"}
    ]


def _deciding(entry: dict) -> str | bool:
    """The part of a verdict that can change a decision: for a comparison asked one threshold only
    (``question``), whether it was crossed; a comparison stopped once "slower?" was settled reads "tie" or
    "faster" alike."""
    question = entry.get("question", "both")
    return entry["verdict"] if question == "both" else entry["verdict"] == question


def same_decisions_expected(first: dict[str, dict], second: dict[str, dict]) -> bool:
    """No comparison both runs made differs in a verdict that decides: the runs must then decide alike."""
    return all(_deciding(first[key]) == _deciding(second[key]) for key in first.keys() & second.keys())
