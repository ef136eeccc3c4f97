"""Task-aware accuracy (``flexdsa_core.accuracy``): the top-1 rule (confident rows, all rows, labels), what a
figure can establish, and the packed outputs whose tails stay float (``precision.packed_tails``). The split
between calibrating and judging is in ``test_holdout.py``."""

import numpy as np
import pytest
from onnx import TensorProto, helper
from pydantic import ValidationError

from flexdsa_core.accuracy import check_outputs, describe, evidence, metrics_for, rows_to_establish, score
from flexdsa_core.errors import InvalidOptionsError
from flexdsa_core.options import AccuracyTarget
from flexdsa_core.precision import packed_tails

PACKED = AccuracyTarget(outputs={"det": {"metric": "slices", "slices": {
    "boxes": {"start": 0, "stop": 4}, "scores": {"start": 4, "stop": 5}}}})  # fmt: skip


def _detections(rng, count: int = 6) -> list[dict]:
    boxes = rng.uniform(0, 640, (count, 1, 50, 4))
    scores = rng.uniform(0, 1, (count, 1, 50, 1))
    return [{"det": np.concatenate([b, s], axis=-1).astype(np.float32)} for b, s in zip(boxes, scores, strict=True)]


def test_a_packed_output_is_judged_per_slice_so_boxes_cannot_hide_lost_scores():
    rng = np.random.default_rng(0)
    want = _detections(rng)
    got = [{"det": s["det"].copy()} for s in want]
    for sample in got:  # scores rounded to one int8 step of a scale set by the boxes (640 / 255)
        sample["det"][..., 4] = np.round(sample["det"][..., 4] / 2.5) * 2.5
    whole = score(want, got, AccuracyTarget())
    assert whole["ok"] and whole["outputs"]["det"]["cosine"] > 0.99  # the whole tensor looks fine
    sliced = score(want, got, PACKED)
    entry = sliced["outputs"]["det"]
    assert not sliced["ok"] and entry["slices"]["boxes"]["ok"] and not entry["slices"]["scores"]["ok"]
    assert entry["slices"]["scores"]["cosine"] < 0.9 and sliced["loss"] > 0.1
    assert sliced["samples"] == 6


def test_top1_figures_carry_a_wilson_bound_and_cosines_a_bootstrap_bound():
    rng = np.random.default_rng(1)
    want = [{"logits": rng.standard_normal((1, 10)).astype(np.float32)} for _ in range(40)]
    got = [{"logits": w["logits"] + 0.01 * rng.standard_normal((1, 10)).astype(np.float32)} for w in want]
    found = score(want, got, AccuracyTarget(top1_rows="all"))["outputs"]["logits"]
    assert found["metric"] == "top1" and found["rows"] == 40
    assert 0 < found["top1_bound"] < found["top1_agreement"] <= 1  # 40 rows: a bound well below the figure
    assert found["cosine_bound"] <= found["cosine"]
    one = score(want[:1], got[:1], AccuracyTarget(top1_rows="all"))["outputs"]["logits"]
    assert one["cosine_bound"] is None  # one sample: no resampling, no bound claimed


def test_with_groups_the_cosine_bound_resamples_whole_groups():
    # 4 photos of 8 crops: three reproduced closely, one (its crops alike) much less. Resampling crops treats
    # its 8 crops as 8 chances; resampling photos, as one, and the bound says how much one photo can move it.
    rng = np.random.default_rng(3)
    want = [{"features": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(32)]
    noise = [0.3 if index >= 24 else 0.05 for index in range(32)]
    got = [{"features": w["features"] + n * rng.standard_normal((1, 64)).astype(np.float32)} for w, n in zip(want, noise)]
    groups = [index // 8 for index in range(32)]
    by_samples = score(want, got, AccuracyTarget())["outputs"]["features"]
    by_groups = score(want, got, AccuracyTarget(), groups=groups)["outputs"]["features"]
    assert by_samples["cosine"] == by_groups["cosine"]  # the figure is the same; its bound is not
    assert by_groups["cosine_bound_over"] == "groups" and by_samples["cosine_bound_over"] == "samples"
    assert by_groups["cosine_bound"] < by_samples["cosine_bound"]
    # Where the figure meets the target and its bound does not, a claim on the user's data is refused.
    target = AccuracyTarget(min_cosine=round((by_groups["cosine"] + by_groups["cosine_bound"]) / 2, 4))
    assert score(want, got, target, groups=groups)["ok"]  # numerics (synthetic inputs): the figure decides
    claimed = score(want, got, target, groups=groups, cosine_by_bound=True)
    assert not claimed["ok"] and claimed["outputs"]["features"]["cosine_decided_by"] == "bound"
    assert "bounded at" in describe(claimed, target) and "over resampled groups" in describe(claimed, target)


def _logits(rows: list[list[float]]) -> list[dict]:
    return [{"logits": np.array([row], np.float32)} for row in rows]


def test_expected_top1_pairs_each_lost_lead_with_every_margin():
    # Margins (top class over runner-up) 1.0 and 2.0; the candidate loses 0.5 and 1.5 of them: no row flips,
    # but the loss of 1.5 would flip a row with the first row's margin: 1 of the 4 pairs.
    want = _logits([[3.0, 2.0, 0.0], [0.0, 4.0, 2.0]])
    got = _logits([[2.75, 2.25, 0.0], [0.0, 3.25, 2.75]])
    found = score(want, got, AccuracyTarget())["outputs"]["logits"]
    assert found["top1_agreement"] == 1.0 and found["top1_expected"] == pytest.approx(0.75)
    assert not found["ok"]  # agreement found is not enough: the figure expected on unseen rows decides too
    exact = score(want, want, AccuracyTarget())["outputs"]["logits"]
    assert exact["top1_expected"] == 1.0 and exact["ok"]
    # A candidate that widens the lead loses nothing.
    wider = score(want, _logits([[3.5, 2.0, 0.0], [0.0, 4.5, 2.0]]), AccuracyTarget())["outputs"]["logits"]
    assert wider["top1_expected"] == 1.0


def test_rows_that_all_agree_with_losses_near_their_margins_do_not_meet_the_target():
    """EfficientNet-Lite0's case over every row: every judged row agrees, yet the leads lost are as large as
    typical margins, so rows of other inputs flip; the figure expected says so, the agreement found does not."""
    rng = np.random.default_rng(4)
    want = [{"logits": rng.standard_normal((1, 100)).astype(np.float32) * 2} for _ in range(200)]
    got = [{"logits": w["logits"] + 0.15 * rng.standard_normal((1, 100)).astype(np.float32)} for w in want]
    every_row = AccuracyTarget(top1_rows="all")
    judged = score(want[:20], got[:20], every_row)
    found = judged["outputs"]["logits"]
    truth = score(want[20:], got[20:], every_row)["outputs"]["logits"]["top1_agreement"]
    # Seeded: all 20 judged rows agree, 0.963 expected, 0.889 on the 180 other rows.
    assert found["top1_agreement"] == 1.0 and truth < 0.95
    assert found["top1_expected"] < 0.99 and not judged["ok"]
    assert abs(found["top1_expected"] - truth) < abs(found["top1_agreement"] - truth)
    assert judged["loss"] == pytest.approx(1 - found["top1_expected"], abs=1e-6)  # what sensitivity ranks by


def _mixed_confidence(rng, count: int = 200, classes: int = 50) -> tuple[list[dict], list[dict], np.ndarray]:
    """A classifier's rows, a quarter of them confident (one class 6 above the rest: top probability ~0.9),
    the rest near-ties; the candidate's noise flips near-ties and none of the confident rows."""
    logits = rng.standard_normal((count, classes)).astype(np.float32) * 0.3
    confident = np.arange(count) % 4 == 0
    logits[confident, 7] += 6.0
    noisy = logits + 0.2 * rng.standard_normal(logits.shape).astype(np.float32)
    return _logits(logits.tolist()), _logits(noisy.tolist()), confident


def test_top1_is_judged_on_the_rows_where_the_original_is_confident_and_reported_on_all():
    want, got, confident = _mixed_confidence(np.random.default_rng(5))
    target = AccuracyTarget(min_cosine=0.9)  # the near-ties' noise costs cosine too: ~0.93 here
    judged = score(want, got, target)
    entry = judged["outputs"]["logits"]
    # Softmax of the original: the confident quarter has a top probability >= 0.5, the near-ties do not.
    assert entry["top1_rule"] == "confident" and entry["confident_rows"] == entry["rows"] == int(confident.sum())
    assert entry["rows_all"] == len(want)
    assert entry["top1_agreement"] == 1.0 and entry["top1_expected"] >= 0.99 and judged["ok"]
    assert entry["top1_agreement_all_rows"] < 0.9 and entry["top1_expected_all_rows"] < 0.9  # near-ties flip
    # The decision's loss is the confident rows' (here the cosine's); the all-rows loss ranks layers beside it.
    assert judged["loss"] == pytest.approx(1 - entry["cosine"], abs=1e-6)
    assert judged["loss_all_rows"] > 0.1
    # Asked for every row, the near-ties decide, as before.
    every_row = score(want, got, target.model_copy(update={"top1_rows": "all"}))
    assert not every_row["ok"] and every_row["outputs"]["logits"]["rows"] == len(want)
    assert f"on {len(want)} rows (needs 0.99)" in describe(every_row, target)
    # The cosine floor still covers every row, confident or not.
    assert not score(want, got, AccuracyTarget(min_cosine=0.999))["ok"]


def test_an_output_that_already_is_a_distribution_is_not_softmaxed_again():
    # 0.45 / 0.35 / 0.2 read as the probabilities they are: confident at 0.4; softmaxed again (0.37 / 0.33 /
    # 0.29) they would not be.
    three = [{"probs": np.array([[0.45, 0.35, 0.2]], np.float32)}]
    assert score(three, three, AccuracyTarget())["outputs"]["probs"]["confident_rows"] == 0
    assert score(three, three, AccuracyTarget(confident_probability=0.4))["outputs"]["probs"]["confident_rows"] == 1
    # Logits of the same values are not a distribution (they do not sum to 1): softmax, 0.37.
    logits = [{"logits": np.array([[0.45, 0.35, 0.1]], np.float32)}]
    assert score(logits, logits, AccuracyTarget(confident_probability=0.4))["outputs"]["logits"]["confident_rows"] == 0


def test_with_no_confident_row_top1_is_not_judged_and_the_cosine_decides():
    rng = np.random.default_rng(6)
    want = _logits((rng.standard_normal((30, 100)) * 0.1).tolist())  # near-uniform: top probability ~0.02
    flipped = _logits((np.array([w["logits"][0] for w in want]) + 0.05 * rng.standard_normal((30, 100))).tolist())
    judged = score(want, flipped, AccuracyTarget(min_cosine=0.8))  # noise half the logits' spread: ~0.89
    entry = judged["outputs"]["logits"]
    assert entry["confident_rows"] == 0 and entry["top1_judged"] is False and entry["top1_agreement"] is None
    assert "no row where the original's top class has probability >= 0.5" in entry["top1_note"]
    assert entry["top1_agreement_all_rows"] < 0.9  # reported beside, not deciding
    assert judged["ok"] and judged["loss"] == pytest.approx(1 - entry["cosine"], abs=1e-6)
    assert "not judged: no row where the original is confident" in describe(judged, AccuracyTarget())
    said = evidence(judged, AccuracyTarget())["logits"]["top1"]
    assert said["rows"] == 0 and not said["established"] and "cosine decided" in said["rests_on"]
    missed = score(want, flipped, AccuracyTarget(min_cosine=0.9999))
    assert not missed["ok"] and "cosine" in describe(missed, AccuracyTarget(min_cosine=0.9999))


def test_labels_judge_accuracy_against_99_percent_of_the_originals():
    # 100 rows, the original right on 80 of them. A candidate that breaks one of those 80 keeps 79/100 =
    # 0.79 >= 0.99 * 0.80 = 0.792? No: 0.79 < 0.792, it misses; one that breaks only rows the original got
    # wrong anyway keeps 0.80 and meets it, though its agreement with the original is lower.
    rng = np.random.default_rng(7)
    logits = rng.standard_normal((100, 10)).astype(np.float32)
    logits[np.arange(100), 3] += 8.0  # the original says class 3 everywhere, confidently
    labels = np.where(np.arange(100) < 80, 3, 5)
    want = _logits(logits.tolist())

    def candidate(flip_rows) -> list[dict]:
        got = logits.copy()
        got[flip_rows, 4] += 16.0  # now class 4: neither the label nor the original
        return _logits(got.tolist())

    per_sample = [np.array([label]) for label in labels]
    wrong_anyway = score(want, candidate([80, 81]), AccuracyTarget(min_cosine=0.5), labels=per_sample)
    entry = wrong_anyway["outputs"]["logits"]
    assert entry["top1_rule"] == "labels" and wrong_anyway["ok"]
    assert entry["labels"]["fp32_accuracy"] == 0.8 and entry["labels"]["accuracy"] == 0.8
    assert entry["labels"]["rows"] == 100 and entry["labels"]["needs"] == pytest.approx(0.792)
    assert entry["top1_agreement"] == 0.98  # below min_top1, reported beside: the labels decide
    broke_one = score(want, candidate([0]), AccuracyTarget(min_cosine=0.5), labels=per_sample)
    assert not broke_one["ok"] and broke_one["outputs"]["logits"]["labels"]["accuracy"] == 0.79
    assert "accuracy on the labels 0.790" in describe(broke_one, AccuracyTarget())
    looser = AccuracyTarget(min_cosine=0.5, label_ratio=0.98)
    assert score(want, candidate([0]), looser, labels=per_sample)["ok"]
    # A negative label is no label: those rows are left out of both accuracies.
    partly = [np.array([label if index % 2 else -1]) for index, label in enumerate(labels)]
    assert score(want, want, AccuracyTarget(), labels=partly)["outputs"]["logits"]["labels"]["rows"] == 50
    # The evidence: the share of the original's right rows kept, bounded.
    said = evidence(wrong_anyway, AccuracyTarget())["logits"]["top1"]
    assert said["rule"] == "labels" and said["rows"] == 80 and said["rate"] == 1.0 and not said["established"]
    assert said["rows_to_establish"] == 268


def test_labels_that_do_not_fit_the_output_are_refused_clearly():
    want = _logits([[3.0, 0.0, 0.0], [0.0, 3.0, 0.0]])
    with pytest.raises(InvalidOptionsError, match="past the 3 classes"):
        score(want, want, AccuracyTarget(), labels=[np.array([0]), np.array([7])])
    with pytest.raises(InvalidOptionsError, match="2 labels, output 'logits'"):
        score(want, want, AccuracyTarget(), labels=[np.array([0, 1]), np.array([1, 0])])
    two = [{"a_logits": w["logits"], "b_logits": w["logits"]} for w in want]
    with pytest.raises(InvalidOptionsError, match="name the one the labels refer to with accuracy.labels_output"):
        score(two, two, AccuracyTarget(), labels=[np.array([0]), np.array([1])])
    named = score(two, two, AccuracyTarget(labels_output="b_logits"), labels=[np.array([0]), np.array([1])])
    assert named["outputs"]["b_logits"]["top1_rule"] == "labels" and "labels" not in named["outputs"]["a_logits"]
    with pytest.raises(InvalidOptionsError, match="no output is judged by top-1"):
        score(want, want, AccuracyTarget(top1_outputs=[]), labels=[np.array([0]), np.array([1])])
    # Named, an output is a classifier whatever its look.
    named = score(want, want, AccuracyTarget(top1_outputs=[], labels_output="logits"), labels=[np.array([0]), np.array([1])])
    assert named["outputs"]["logits"]["top1_rule"] == "labels"


def test_rows_to_establish_solves_the_wilson_bound():
    assert rows_to_establish(1.0, 0.99) == 268  # n / (n + z^2) >= 0.99
    needed = rows_to_establish(0.995, 0.99)
    assert needed > 268 and score is not None
    assert rows_to_establish(0.99, 0.99) is None and rows_to_establish(0.5, 0.99) is None


def test_an_embedding_is_judged_by_cosine_not_by_the_argmax_of_its_dims():
    reference = {"sentence_embedding": np.zeros((1, 384), np.float32)}
    assert metrics_for(reference, AccuracyTarget())["sentence_embedding"].metric == "cosine"
    assert metrics_for({"y": np.zeros((1, 10), np.float32)}, AccuracyTarget())["y"].metric == "top1"
    named = AccuracyTarget(outputs={"y": "cosine"})
    assert metrics_for({"y": np.zeros((1, 10), np.float32)}, named)["y"].metric == "cosine"


def test_a_sample_floor_refuses_one_turned_embedding_the_pooled_cosine_hides():
    rng = np.random.default_rng(0)
    reference = [{"sentence_embedding": rng.standard_normal((1, 64)).astype(np.float32)} for _ in range(30)]
    got = [{"sentence_embedding": r["sentence_embedding"].copy()} for r in reference]
    turned = got[7]["sentence_embedding"]
    turned[0, :12] = -turned[0, :12]  # one sentence's embedding turns; the 29 others are exact
    pooled = score(reference, got, AccuracyTarget())
    entry = pooled["outputs"]["sentence_embedding"]
    assert pooled["ok"] and entry["cosine"] >= 0.99 and entry["worst_sample_cosine"] < 0.9
    strict = AccuracyTarget(min_sample_cosine=0.99)
    judged = score(reference, got, strict)
    assert not judged["ok"] and judged["loss"] == pytest.approx(1 - entry["worst_sample_cosine"], abs=1e-6)
    assert "worst sample's cosine" in describe(judged, strict) and "needs 0.99 on every sample" in describe(judged, strict)
    assert score(reference, reference, strict)["ok"]


def test_metrics_are_validated_against_the_model_and_among_themselves():
    with pytest.raises(ValidationError, match="overlap"):
        AccuracyTarget(outputs={"d": {"metric": "slices", "slices": {"a": {"start": 0, "stop": 4},
                                                                     "b": {"start": 3, "stop": 5}}}})  # fmt: skip
    with pytest.raises(ValidationError, match="needs 'slices'"):
        AccuracyTarget(outputs={"d": {"metric": "slices"}})
    with pytest.raises(ValidationError):
        AccuracyTarget(outputs={"d": "f1"})
    with pytest.raises(InvalidOptionsError, match="'nope'"):
        check_outputs(AccuracyTarget(outputs={"nope": "top1"}), {"y": [1, 10]})
    with pytest.raises(InvalidOptionsError, match="'nope'"):
        check_outputs(AccuracyTarget(labels_output="nope"), {"y": [1, 10]})
    with pytest.raises(InvalidOptionsError, match="past the 5 positions"):
        check_outputs(PACKED.model_copy(update={"outputs": {"det": PACKED.outputs["det"].model_copy(
            update={"slices": {"scores": PACKED.outputs["det"].slices["scores"].model_copy(update={"stop": 6})}})}}),
            {"det": [1, 50, 5]})  # fmt: skip
    check_outputs(PACKED, {"det": [1, "cells", 5]})


def test_the_tail_of_a_concatenated_head_stays_float_and_the_network_does_not():
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["features"], name="conv"),
        helper.make_node("Conv", ["features", "wb"], ["raw_boxes"], name="box_head"),
        helper.make_node("Conv", ["features", "ws"], ["raw_scores"], name="score_head"),
        helper.make_node("Mul", ["raw_boxes", "stride"], ["boxes"], name="decode"),
        helper.make_node("Sigmoid", ["raw_scores"], ["scores"], name="squash"),
        helper.make_node("Concat", ["boxes", "scores"], ["det"], name="pack", axis=1),
        helper.make_node("Add", ["features", "features"], ["residual"], name="residual_add"),
    ]
    inits = [helper.make_tensor(n, TensorProto.FLOAT, d, np.ones(int(np.prod(d))).tolist())
             for n, d in (("w", [4, 3, 1, 1]), ("wb", [4, 4, 1, 1]), ("ws", [1, 4, 1, 1]), ("stride", [1]))]  # fmt: skip
    graph = helper.make_graph(
        nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("det", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("residual", TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    found = packed_tails(helper.make_model(graph), AccuracyTarget())
    assert set(found["nodes"]) == {"pack", "decode", "squash"}  # the heads' Convs and the network stay int8
    assert list(found["outputs"]) == ["det"] and "Concat" in found["outputs"]["det"]["why"]
    # Named by the user as sliced, an output without a Concat keeps its tail float too.
    named = AccuracyTarget(outputs={"residual": {"metric": "slices", "slices": {"a": {"start": 0, "stop": 1}}}})
    assert "residual_add" in packed_tails(helper.make_model(graph), named)["nodes"]
