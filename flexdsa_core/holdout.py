"""Which samples calibrate and which judge: accuracy is decided on samples the quantiser never saw.

``plan(n, holdout, seed)`` splits ``n`` samples (``OptimizeOptions.holdout``):

* ``split`` (``n >= folds_below``): ``round(n * share)`` samples held out, the rest calibrate; which ones
  by a seeded permutation (``shuffled``) or by position (``as_given``: the last ones held out, so samples of
  one source given together stay on one side);
* ``kfold`` (``2 <= n < folds_below``): ``k = min(n, 4)`` folds; fold ``j`` is judged by a model calibrated
  on the other folds, the held-out figure pools every fold (so each sample is judged once, by a model that
  never saw it), and the model that ships is calibrated on all ``n`` (the held-out figure is then the k-fold
  estimate for that procedure, as cross-validation gives);
* ``none`` (one sample): nothing can be held out; the figure is on the calibration sample and says so.

The search for a candidate (sensitivity, bisection) runs on the first fold; only the candidate about to ship
is judged on every fold.
"""

from __future__ import annotations

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

    @property
    def first(self) -> Fold:
        return self.folds[0]

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
        return found


def plan(count: int, holdout: HoldOut, seed: int = 0) -> SplitPlan:
    """The split of ``count`` samples (module docstring)."""
    if count < 1:
        raise ValueError("no samples to split")
    if count == 1:
        return SplitPlan("none", 1, (Fold((0,), (0,)),), holdout.order)
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
