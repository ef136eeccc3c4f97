"""When is one timing really faster than another: paired, interleaved rounds and a confidence bound.

Every measured choice (a fusion in the Fusion Switcher, the never-slower check on the whole model) times
its two sides in rounds, each round running both once in alternating order, so that load on a shared
machine falls on both alike. Each round gives one ratio ``r_i = second_i / first_i``. The median ratio's
confidence interval is distribution-free (order statistics): with ``n`` rounds, the ``k``-th smallest and
``k``-th largest ratio, ``k`` the largest rank with ``P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2``.

The verdict is ``faster`` when the whole interval lies below ``1 - min_effect``, ``slower`` when it lies
above ``1 + min_effect``, and ``tie`` otherwise: too few rounds, too much noise, or an effect too small to
matter. A tie is never decided by the timings; the caller applies its fixed rule (fewer nodes wins).

A measurement may stop before its planned rounds when the answer is already plain (``settled_early``): at a
few fixed looks, the interval at a stricter confidence (99%) holds neither threshold. The final interval
at 95% lies inside that one, so its verdict is the same; the few looks at the stricter level keep the
chance that noise stops a measurement on the wrong side small (a group-sequential design).

Most callers ask one question, not both: a fusion that leaves fewer kernels is taken unless significantly
slower (only ``1 + min_effect`` can change the decision), one that does not is taken only when significantly
faster (only ``1 - min_effect``), and the never-slower check asks "slower?" alone. ``question`` names the
threshold that can change the caller's decision; an early look and a borderline extension then look at that
one only. Whether the other side would have been significant changes no decision, and timing until it is
settled cost most rounds (Conv+BatchNorm pairs at a ratio near 0.9, the threshold a taken fold no longer
cares about, ran to the 250-round limit).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Literal

CONFIDENCE = 0.95
# Kernels: a fusion must change its nodes' time by at least this much to count as faster or slower.
KERNEL_MIN_EFFECT = 0.10
# Whole models: the never-slower check's threshold (run-to-run noise of a whole model is ~1-3% paired).
MODEL_MIN_EFFECT = 0.03
# Fewest rounds that give a 95% interval at all (k >= 1 needs n >= 6); more narrow it.
MIN_ROUNDS = 9

# The confidence of an early look (``settled_early``).
EARLY_CONFIDENCE = 0.99

Outcome = Literal["faster", "slower", "tie"]
# Which threshold can change the caller's decision (module docstring): "slower" (1 + min_effect), "faster"
# (1 - min_effect), or "both".
Question = Literal["both", "slower", "faster"]


@dataclass(frozen=True)
class Comparison:
    """``second`` against ``first``: medians of the per-round seconds, and the median ratio with its bounds."""

    first_s: float
    second_s: float
    ratio: float
    low: float
    high: float
    rounds: int
    min_effect: float
    confidence: float = CONFIDENCE

    @property
    def verdict(self) -> Outcome:
        if self.high < 1.0 - self.min_effect:
            return "faster"
        if self.low > 1.0 + self.min_effect:
            return "slower"
        return "tie"

    def as_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "ratio_median": round(self.ratio, 4),
            "ratio_ci": [round(self.low, 4), round(self.high, 4)],
            "confidence": self.confidence,
            "min_effect": self.min_effect,
            "rounds": self.rounds,
            "first_s": self.first_s,
            "second_s": self.second_s,
        }

    @staticmethod
    def from_dict(entry: dict) -> Comparison:
        low, high = entry["ratio_ci"]
        return Comparison(
            entry["first_s"], entry["second_s"], entry["ratio_median"], low, high, entry["rounds"],
            entry["min_effect"], entry.get("confidence", CONFIDENCE),
        )  # fmt: skip


@cache
def median_interval_rank(rounds: int, confidence: float = CONFIDENCE) -> int:
    """The 1-based rank k of the interval's ends (k-th smallest, k-th largest); 0 when ``rounds`` is too few."""
    tail = (1.0 - confidence) / 2
    cumulative, rank = 0.0, 0
    for k in range(rounds + 1):
        cumulative += math.comb(rounds, k) / 2**rounds  # P(B <= k)
        if cumulative > tail:
            return rank
        rank = k + 1  # P(B < k + 1) = P(B <= k) <= tail
    return rank


def paired(
    first: Sequence[float],
    second: Sequence[float],
    *,
    min_effect: float,
    confidence: float = CONFIDENCE,
) -> Comparison:
    """Compare per-round seconds of two sides timed in the same rounds (``first[i]`` beside ``second[i]``)."""
    if len(first) != len(second) or not first:
        raise ValueError("paired timings need the same, non-zero number of rounds on both sides")
    tiny = 1e-12
    ratios = sorted(max(b, 0.0) / max(a, tiny) for a, b in zip(first, second, strict=True))
    rank = median_interval_rank(len(ratios), confidence)
    if rank == 0:
        low, high = 0.0, math.inf  # too few rounds for any bound: always a tie
    else:
        low, high = ratios[rank - 1], ratios[-rank]
    return Comparison(
        statistics.median(first), statistics.median(second), statistics.median(ratios), low, high, len(ratios),
        min_effect, confidence,
    )  # fmt: skip


def thresholds(min_effect: float, question: Question = "both") -> tuple[float, ...]:
    """The ratios at which the answer to ``question`` changes."""
    if question not in ("both", "slower", "faster"):
        raise ValueError(f"question must be 'both', 'slower' or 'faster', not {question!r}")
    return {
        "both": (1.0 - min_effect, 1.0 + min_effect),
        "slower": (1.0 + min_effect,),
        "faster": (1.0 - min_effect,),
    }[question]


def settled_early(
    first: Sequence[float], second: Sequence[float], *, min_effect: float, question: Question = "both"
) -> bool:
    """Whether the interval at ``EARLY_CONFIDENCE`` holds none of ``question``'s thresholds (``1 - min_effect``,
    ``1 + min_effect``, or one of them): the answer is then plain and more rounds would not change it. At 9
    rounds that interval is the whole range: every round on one side."""
    strict = paired(first, second, min_effect=min_effect, confidence=EARLY_CONFIDENCE)
    return not straddles(strict, question)


def straddles(comparison: Comparison, question: Question = "both") -> bool:
    """The interval holds one of ``question``'s thresholds (module docstring): more rounds may still change
    the answer."""
    low, high = comparison.low, comparison.high
    return any(low <= threshold <= high for threshold in thresholds(comparison.min_effect, question))
