"""Task-aware accuracy (``flexdsa_core.accuracy``), the split between calibrating and judging
(``flexdsa_core.holdout``) and the packed outputs whose tails stay float (``precision.packed_tails``)."""

import numpy as np
import pytest
from onnx import TensorProto, helper
from pydantic import ValidationError

from flexdsa_core.accuracy import check_outputs, metrics_for, score
from flexdsa_core.errors import InvalidOptionsError
from flexdsa_core.holdout import plan
from flexdsa_core.options import AccuracyTarget, HoldOut
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
    found = score(want, got, AccuracyTarget())["outputs"]["logits"]
    assert found["metric"] == "top1" and found["rows"] == 40
    assert 0 < found["top1_bound"] < found["top1_agreement"] <= 1  # 40 rows: a bound well below the figure
    assert found["cosine_bound"] <= found["cosine"]
    one = score(want[:1], got[:1], AccuracyTarget())["outputs"]["logits"]
    assert one["cosine_bound"] is None  # one sample: no resampling, no bound claimed


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
    """EfficientNet-Lite0's case: every judged row agrees, yet the leads lost are as large as typical margins,
    so rows of other inputs flip; the figure expected says so, the agreement found does not."""
    rng = np.random.default_rng(4)
    want = [{"logits": rng.standard_normal((1, 100)).astype(np.float32) * 2} for _ in range(200)]
    got = [{"logits": w["logits"] + 0.15 * rng.standard_normal((1, 100)).astype(np.float32)} for w in want]
    judged = score(want[:20], got[:20], AccuracyTarget())
    found = judged["outputs"]["logits"]
    truth = score(want[20:], got[20:], AccuracyTarget())["outputs"]["logits"]["top1_agreement"]
    # Seeded: all 20 judged rows agree, 0.963 expected, 0.889 on the 180 other rows.
    assert found["top1_agreement"] == 1.0 and truth < 0.95
    assert found["top1_expected"] < 0.99 and not judged["ok"]
    assert abs(found["top1_expected"] - truth) < abs(found["top1_agreement"] - truth)
    assert judged["loss"] == pytest.approx(1 - found["top1_expected"], abs=1e-6)  # what sensitivity ranks by


def test_an_embedding_is_judged_by_cosine_not_by_the_argmax_of_its_dims():
    reference = {"sentence_embedding": np.zeros((1, 384), np.float32)}
    assert metrics_for(reference, AccuracyTarget())["sentence_embedding"].metric == "cosine"
    assert metrics_for({"y": np.zeros((1, 10), np.float32)}, AccuracyTarget())["y"].metric == "top1"
    named = AccuracyTarget(outputs={"y": "cosine"})
    assert metrics_for({"y": np.zeros((1, 10), np.float32)}, named)["y"].metric == "cosine"


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
    with pytest.raises(InvalidOptionsError, match="past the 5 positions"):
        check_outputs(PACKED.model_copy(update={"outputs": {"det": PACKED.outputs["det"].model_copy(
            update={"slices": {"scores": PACKED.outputs["det"].slices["scores"].model_copy(update={"stop": 6})}})}}),
            {"det": [1, 50, 5]})  # fmt: skip
    check_outputs(PACKED, {"det": [1, "cells", 5]})


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
