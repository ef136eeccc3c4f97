"""The split between calibrating and judging (``flexdsa_core.holdout``): samples the quantiser never saw, and
whole groups (the photo a crop was cut from) when the samples name them."""

import pytest

from flexdsa_core.holdout import plan
from flexdsa_core.options import HoldOut


def test_the_split_holds_out_samples_the_quantiser_never_sees():
    split = plan(40, HoldOut(), seed=0)
    fold = split.first
    assert split.mode == "split" and len(fold.judge) == 20 and not set(fold.calibrate) & set(fold.judge)
    assert sorted(fold.calibrate + fold.judge) == list(range(40))
    assert fold.judge != tuple(range(20, 40))  # shuffled: sorted data still lands on both sides
    ordered = plan(40, HoldOut(order="as_given", share=0.25), seed=0).first
    assert ordered.judge == tuple(range(30, 40)) and ordered.calibrate == tuple(range(30))
    few = plan(10, HoldOut(), seed=0)
    assert few.mode == "kfold" and len(few.folds) == 4
    judged = [i for f in few.folds for i in f.judge]
    assert sorted(judged) == list(range(10))  # every sample judged once, by a fold that did not calibrate on it
    assert all(not set(f.calibrate) & set(f.judge) for f in few.folds)
    assert plan(1, HoldOut()).mode == "none"
    assert "groups" not in split.as_dict()


def _photos(count: int, per: int = 8) -> list[str]:
    """``count`` photos' crops, ``per`` each, given photo by photo (as the trained fixture's are)."""
    return [f"photo{index // per}" for index in range(count * per)]


def _whole(groups, fold) -> bool:
    return not {groups[i] for i in fold.calibrate} & {groups[i] for i in fold.judge}


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("order", ["shuffled", "as_given"])
def test_a_split_by_groups_keeps_every_group_whole(seed, order):
    groups = _photos(8)
    split = plan(len(groups), HoldOut(order=order), seed=seed, groups=groups)
    fold = split.first
    assert split.mode == "split" and _whole(groups, fold)
    assert sorted(fold.calibrate + fold.judge) == list(range(64))
    assert split.groups_in(fold.judge) == 4 and split.groups_in(fold.calibrate) == 4  # share 0.5 of 8 groups
    said = split.as_dict()
    assert said["groups"] == 8 and said["groups_judged_on"] == 4 and said["groups_calibrated_on"] == 4
    assert said["judged_on"] == 32 and "whole groups" in said["held_out"]
    if order == "as_given":  # the groups that come last are held out
        assert {groups[i] for i in fold.judge} == {"photo4", "photo5", "photo6", "photo7"}


def test_groups_of_unequal_size_and_interleaved_samples_stay_whole():
    # Sources given out of order, 1 to 9 samples each: no group is on both sides whatever its size or place.
    groups = [name for index, name in enumerate("abcdefghij") for _ in range(index % 9 + 1)]
    groups = groups[::2] + groups[1::2]
    split = plan(len(groups), HoldOut(share=0.3), seed=3, groups=groups)
    assert split.mode == "split" and _whole(groups, split.first)
    assert split.groups_in(split.first.judge) == 3  # round(10 * 0.3)


def test_kfold_folds_by_groups():
    groups = [7, 7, 7, 3, 3, 9, 9, 9, 1, 1, 5]  # 11 samples (< 16: k-fold), 5 groups given as integers
    split = plan(len(groups), HoldOut(), seed=0, groups=groups)
    assert split.mode == "kfold" and len(split.folds) == 4  # min(5 groups, 4)
    assert all(_whole(groups, fold) for fold in split.folds)
    judged = sorted(i for fold in split.folds for i in fold.judge)
    assert judged == list(range(len(groups)))  # every sample judged once, by a model that never saw its group
    two = plan(6, HoldOut(), seed=0, groups=["a", "a", "a", "b", "b", "b"])
    assert len(two.folds) == 2 and all(_whole(["a"] * 3 + ["b"] * 3, fold) for fold in two.folds)
    assert two.as_dict()["groups_judged_on"] == 2


def test_one_group_or_by_groups_false_splits_samples_as_without_groups():
    one = plan(40, HoldOut(), seed=0, groups=["same"] * 40)
    assert one.group_of is None and len(one.first.judge) == 20
    off = plan(64, HoldOut(by_groups=False), seed=0, groups=_photos(8))
    assert off.group_of is None and not _whole(_photos(8), off.first)  # crops of a photo on both sides
    with pytest.raises(ValueError, match="3 groups for 4 samples"):
        plan(4, HoldOut(), groups=["a", "b", "c"])
