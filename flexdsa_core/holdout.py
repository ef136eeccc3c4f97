"""Which samples calibrate and which judge: accuracy is decided on samples the quantiser never saw.

``plan(n, holdout, seed, groups)`` splits ``n`` samples (``OptimizeOptions.holdout``):

* ``split`` (``n >= folds_below``): ``round(n * share)`` samples held out, the rest calibrate; which ones
  by a seeded permutation (``shuffled``) or by position (``as_given``: the last ones held out, so samples of
  one source given together stay on one side);
* ``kfold`` (``2 <= n < folds_below``): ``k = min(n, 4)`` folds; fold ``j`` is judged by a model calibrated
  on the other folds, the held-out figure pools every fold (so each sample is judged once, by a model that
  never saw it), and the model that ships is calibrated on all ``n`` (the held-out figure is then the k-fold
  estimate for that procedure, as cross-validation gives);
* ``none`` (one sample): nothing can be held out; the figure is on the calibration sample and says so.

**Groups.** When the samples name their source (``groups``: one value per sample, the photo eight crops were
cut from, the speaker of a clip) and there are at least two, the same rules count groups instead of samples:
``split`` holds out ``round(g * share)`` of the ``g`` groups (at least one, never all), ``kfold`` makes
``min(g, 4)`` folds of whole groups. A group is never on both sides: crops of one photo agree with each other
far more than with another photo's, so a figure judged on crops of the calibration photos says little about
the next photo. The search for a candidate (sensitivity, bisection) runs on the first fold; only the candidate
about to ship is judged on every fold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from flexdsa_core.options import HoldOut

__all__ = ["Fold", "SplitPlan", "plan"]

MAX_FOLDS = 4


@dataclass(frozen=True)
class Fold:
    calibrate: tuple[int, ...]
    judge: tuple[int, ...]


@dataclass(frozen=True)
class SplitPlan:
    mode: str  # "split", "kfold" or "none"
    samples: int
    folds: tuple[Fold, ...]
    order: str
    # Per sample, the index of its group (None: the samples name no groups, or they are not used).
    group_of: tuple[int, ...] | None = None

    @property
    def first(self) -> Fold:
        return self.folds[0]

    def groups_in(self, indices: Sequence[int]) -> int:
        """How many groups the samples ``indices`` come from (0 without groups)."""
        return len({self.group_of[i] for i in indices}) if self.group_of is not None else 0

    def as_dict(self) -> dict:
        first = self.first
        found = {"mode": self.mode, "samples": self.samples, "order": self.order}
        if self.mode == "split":
            found.update(calibrated_on=len(first.calibrate), judged_on=len(first.judge))
        elif self.mode == "kfold":
            found.update(folds=len(self.folds), calibrated_on=f"{len(first.calibrate)} per fold (all {self.samples} "
                         "for the model that ships)", judged_on=self.samples)  # fmt: skip
        else:
            found.update(calibrated_on=self.samples, judged_on=0)
        if self.group_of is not None:
            groups = len(set(self.group_of))
            found["groups"] = groups
            if self.mode == "split":
                found.update(groups_calibrated_on=self.groups_in(first.calibrate), groups_judged_on=self.groups_in(first.judge))
            elif self.mode == "kfold":
                found.update(groups_calibrated_on=f"{self.groups_in(first.calibrate)} per fold", groups_judged_on=groups)
            found["held_out"] = "whole groups: no group is on both sides"
        return found


def plan(count: int, holdout: HoldOut, seed: int = 0, groups: Sequence | None = None) -> SplitPlan:
    """The split of ``count`` samples (module docstring); ``groups``: one value per sample, or None."""
    if count < 1:
        raise ValueError("no samples to split")
    if groups is not None and len(groups) != count:
        raise ValueError(f"{len(groups)} groups for {count} samples")
    if count == 1:
        return SplitPlan("none", 1, (Fold((0,), (0,)),), holdout.order)
    group_of = _group_indices(groups) if groups is not None and holdout.by_groups else None
    if group_of is not None and len(set(group_of)) >= 2:
        return _plan_groups(count, holdout, seed, group_of)
    order = np.arange(count) if holdout.order == "as_given" else np.random.default_rng(seed).permutation(count)
    if count < holdout.folds_below:
        folds = []
        for block in np.array_split(order, min(count, MAX_FOLDS)):
            held = set(block.tolist())
            folds.append(Fold(tuple(i for i in range(count) if i not in held), tuple(sorted(held))))
        return SplitPlan("kfold", count, tuple(folds), holdout.order)
    held_count = min(max(round(count * holdout.share), 1), count - 1)
    calibrate, judge = order[: count - held_count], order[count - held_count :]
    return SplitPlan("split", count, (Fold(tuple(sorted(calibrate.tolist())), tuple(sorted(judge.tolist()))),), holdout.order)


def _group_indices(groups: Sequence) -> tuple[int, ...]:
    """Each sample's group as the index of its first appearance (values of any hashable kind)."""
    first_seen: dict = {}
    return tuple(first_seen.setdefault(_plain(value), len(first_seen)) for value in groups)


def _plain(value):
    return value.item() if isinstance(value, np.generic) else value


def _plan_groups(count: int, holdout: HoldOut, seed: int, group_of: tuple[int, ...]) -> SplitPlan:
    """``split`` or ``kfold`` over whole groups (module docstring)."""
    groups = len(set(group_of))
    order = np.arange(groups) if holdout.order == "as_given" else np.random.default_rng(seed).permutation(groups)

    def fold(held_groups) -> Fold:
        held = set(np.asarray(held_groups).tolist())
        return Fold(tuple(i for i in range(count) if group_of[i] not in held),
                    tuple(i for i in range(count) if group_of[i] in held))  # fmt: skip

    if count < holdout.folds_below:
        folds = tuple(fold(block) for block in np.array_split(order, min(groups, MAX_FOLDS)))
        return SplitPlan("kfold", count, folds, holdout.order, group_of)
    held_count = min(max(round(groups * holdout.share), 1), groups - 1)
    return SplitPlan("split", count, (fold(order[groups - held_count :]),), holdout.order, group_of)
