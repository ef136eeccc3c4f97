"""Precision (issue 7): int8 and mixed on cpu-ort, fp16 on an accelerator, judged by the accuracy target on
calibration samples; calibration that does not fit the model is refused before any work. Real ONNX Runtime
quantisers and sessions throughout."""

from __future__ import annotations

import io
from collections import Counter

import numpy as np
import onnx
import pytest

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.calibration import CalibrationError, check_calibration, load_calibration
from flexdsa_core.errors import InvalidOptionsError, ValidationFailedError
from flexdsa_core.options import AccuracyTarget
from flexdsa_core.ort_runs import run
from flexdsa_core.precision import int8_format, score
from flexdsa_core.precision.quantise import _quantize_static
from tests.models import fixture
from tests.models.language_model import language_model


def _npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _sensitive_mlp(huge: float = 1e4) -> bytes:
    """x -> MatMul(w1) -> Relu -> MatMul(w2) -> MatMul(w3) -> y, where w2 blows one channel of its output
    up by 1e4 and w3 scales it back: the activation 'wide' that 'sensitive' reads spans ~1e5 while every
    other channel is ~1, so one int8 scale for it rounds the small channels away."""
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((16, 32)).astype(np.float32) / 4
    w2 = rng.standard_normal((32, 32)).astype(np.float32) / 6
    w2[:, 0] *= huge
    w3 = rng.standard_normal((32, 8)).astype(np.float32) / 6
    w3[0, :] /= huge
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("MatMul", ["x", "w1"], ["h"], name="first"),
            onnx.helper.make_node("Relu", ["h"], ["r"], name="relu"),
            onnx.helper.make_node("MatMul", ["r", "w2"], ["wide"], name="widen"),
            onnx.helper.make_node("MatMul", ["wide", "w3"], ["y"], name="sensitive"),
        ],
        "sensitive_mlp",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", 16])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 8])],
        [onnx.numpy_helper.from_array(w, n) for w, n in ((w1, "w1"), (w2, "w2"), (w3, "w3"))],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=9)
    return model.SerializeToString()


# ------------------------------------------------------------------------------------------ calibration
def test_calibration_that_does_not_fit_is_refused_with_what_to_do():
    model = onnx.load(fixture("bert"), load_external_data=False)
    ids = np.zeros((4, 8), np.int64)
    good = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": ids}
    assert len(check_calibration(model, good)) == 4  # four samples of batch 1

    with pytest.raises(CalibrationError, match="missing 'token_type_ids'.*not inputs of the model 'tokens'"):
        check_calibration(model, {"input_ids": ids, "attention_mask": ids, "tokens": ids})
    with pytest.raises(CalibrationError, match=r"'input_ids' is float32, the model takes int64 \(convert"):
        check_calibration(model, {**good, "input_ids": ids.astype(np.float32)})
    with pytest.raises(CalibrationError, match="dim 'seq' is 6 in 'attention_mask' but 8 in 'input_ids'"):
        check_calibration(model, {**good, "attention_mask": np.ones((4, 6), np.int64)})
    with pytest.raises(CalibrationError, match="rank 3"):
        check_calibration(model, {**good, "input_ids": ids[None]})
    with pytest.raises(CalibrationError, match="outside the model's table"):
        check_calibration(model, {**good, "input_ids": np.full((4, 8), 10**6, np.int64)})
    with pytest.raises(CalibrationError, match=r"not an .npz file.*numpy.savez"):
        load_calibration(b"not a zip file")
    with pytest.raises(CalibrationError, match="holds Python objects, which are refused"):
        load_calibration(_npz(input_ids=np.array([{"a": 1}], dtype=object)))
    assert set(load_calibration(_npz(**good))) == set(good)


def test_labels_and_groups_describe_the_samples_and_are_not_fed_to_the_model(tmp_path):
    from flexdsa_core.calibration import check_calibration_file

    model = onnx.load(fixture("bert"), load_external_data=False)
    ids = np.zeros((4, 8), np.int64)
    good = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": ids}
    found = check_calibration(model, {**good, "labels": np.array([3, 1, -1, 0]), "groups": np.array(["a", "a", "b", "c"])})
    assert len(found) == 4 and all(set(feed) == set(good) for feed in found)  # never an input
    assert [labels.tolist() for labels in found.labels] == [[3], [1], [-1], [0]] and found.groups == ["a", "a", "b", "c"]
    per_position = check_calibration(model, {**good, "labels": np.zeros((4, 8), np.int32)})
    assert per_position.labels[0].shape == (8,) and per_position.groups is None
    with pytest.raises(CalibrationError, match="'labels' has 3 entries on its first axis for 4 samples"):
        check_calibration(model, {**good, "labels": np.array([3, 1, 0])})
    with pytest.raises(CalibrationError, match=r"'labels' is float32: labels are class indices \(convert"):
        check_calibration(model, {**good, "labels": np.zeros(4, np.float32)})
    with pytest.raises(CalibrationError, match="'groups' is float64 .*one integer or string per sample"):
        check_calibration(model, {**good, "groups": np.zeros(4)})
    with pytest.raises(CalibrationError, match="not inputs of the model 'label'.*'groups' and 'labels' may describe"):
        check_calibration(model, {**good, "label": np.zeros(4, np.int64)})
    # The service's check, from the file's headers, takes them too.
    path = tmp_path / "samples.npz"
    np.savez(path, **good, labels=np.arange(4), groups=np.array([1, 1, 2, 2]))
    assert check_calibration_file(model, path) == 4
    np.savez(path, **good, groups=np.array([1, 1, 2]))
    with pytest.raises(CalibrationError, match="'groups' has 3 entries"):
        check_calibration_file(model, path)
    # A fixed batch of 2: one entry per row (or per sample), and a sample's two rows in one group.
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["x"], ["y"])], "batch2",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 3])],
    )  # fmt: skip
    pairs = check_calibration(onnx.helper.make_model(graph), {"x": np.zeros((4, 3), np.float32),
                                                             "labels": np.array([0, 1, 2, 0]), "groups": np.array([5, 5, 6, 6])})  # fmt: skip
    assert [labels.tolist() for labels in pairs.labels] == [[0, 1], [2, 0]] and pairs.groups == [5, 6]
    per_sample = check_calibration(onnx.helper.make_model(graph), {"x": np.zeros((4, 3), np.float32), "groups": np.array(["p", "q"])})
    assert per_sample.groups == ["p", "q"]
    with pytest.raises(CalibrationError, match="two groups within one sample of 2 rows"):
        check_calibration(onnx.helper.make_model(graph), {"x": np.zeros((4, 3), np.float32), "groups": np.array([5, 6, 6, 6])})
    # A model whose input is named 'labels' takes it as an input.
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["labels"], ["y"])], "named_labels",
        [onnx.helper.make_tensor_value_info("labels", onnx.TensorProto.FLOAT, ["batch", 3])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", 3])],
    )  # fmt: skip
    taken = check_calibration(onnx.helper.make_model(graph), {"labels": np.zeros((2, 3), np.float32)})
    assert set(taken[0]) == {"labels"} and taken.labels is None


def test_calibration_that_unpacks_past_the_limit_is_refused_before_unpacking(monkeypatch):
    import flexdsa_core.calibration as calibration

    bomb = io.BytesIO()
    np.savez_compressed(bomb, input_ids=np.zeros(1 << 24, np.int64))  # 128 MiB of zeros in well under 1 MiB
    assert len(bomb.getvalue()) < 1 << 20
    monkeypatch.setattr(calibration, "MAX_CALIBRATION_BYTES", 64 << 20)
    with pytest.raises(CalibrationError, match=r"unpacks to 128 MiB, more than the 64 MiB accepted"):
        load_calibration(bomb.getvalue())


def test_optimize_refuses_misfit_calibration_before_compiling():
    wrong = _npz(pixel_values=np.zeros((2, 3, 32, 32), np.float32))  # the vit size on a 64x64 resnet
    with pytest.raises(CalibrationError, match="'pixel_values' dim 2 is 32, the model fixes it to 64") as err:
        FlexDSAOptimizer("cpu-ort").optimize(
            fixture("resnet"), OptimizeOptions(precision="int8"), calibration=wrong
        )
    assert err.value.code == "invalid_calibration" and err.value.http_status == 422


def test_precision_the_target_cannot_have_is_refused():
    with pytest.raises(InvalidOptionsError, match="'fp16' is for accelerator targets"):
        FlexDSAOptimizer("cpu-ort").optimize(fixture("resnet"), OptimizeOptions(precision="fp16"))


# ------------------------------------------------------------------------------------------ accuracy
# Random weights give near-tied logits, where the original is confident on no row and the default top-1 rule
# (confident rows) leaves the cosine to decide; the tests about top-1 flips of such models ask for every row.
EVERY_ROW = AccuracyTarget(top1_rows="all")


def test_score_checks_cosine_and_top1_on_classifier_outputs():
    rng = np.random.default_rng(1)
    reference = [{"logits": rng.standard_normal((1, 10)).astype(np.float32)} for _ in range(20)]
    same = score(reference, reference, AccuracyTarget())
    assert same["ok"] and same["outputs"]["logits"]["top1_agreement"] == 1.0 and same["loss"] == 0.0
    noisy = [{"logits": s["logits"] + rng.standard_normal((1, 10)).astype(np.float32)} for s in reference]
    judged = score(reference, noisy, EVERY_ROW)
    assert not judged["ok"] and judged["outputs"]["logits"]["top1_agreement"] < 0.99


# ------------------------------------------------------------------------------------------ int8
@pytest.mark.models
@pytest.mark.parametrize("name", ["bert", "resnet"])
def test_fixture_quantises_to_int8_within_the_accuracy_target(name, tmp_path):
    source = onnx.load(fixture(name))
    rng = np.random.default_rng(7)
    if name == "bert":
        ids = rng.integers(0, 100, size=(24, 12)).astype(np.int64)
        arrays = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    else:
        # Random weights give near-equal logits on most random images (top-1 margins of ~6% of the logit
        # range), where any rounding flips a class; real data is classified with a margin. So the samples
        # are the 24 of 200 random images the original classifies most clearly.
        images = rng.standard_normal((200, 3, 64, 64)).astype(np.float32)
        logits = np.sort(run(source.SerializeToString(), {"pixel_values": images})["logits"], axis=1)
        margin = (logits[:, -1] - logits[:, -2]) / (logits[:, -1] - logits[:, 0])
        arrays = {"pixel_values": images[np.argsort(-margin)[:24]]}
    result = FlexDSAOptimizer("cpu-ort").optimize(
        source, OptimizeOptions(precision="int8"), calibration=_npz(**arrays)
    )
    precision = result.report["precision"]
    assert precision["calibration"] == {
        "source": "uploaded", "samples": 24, "input_shapes": {k: [1, *v.shape[1:]] for k, v in arrays.items()}
    }  # fmt: skip
    assert not any("synthetic" in w for w in result.report["warnings"])
    assert precision["cpu"]["flags"] and isinstance(precision["cpu"]["reduce_range"], bool)
    static = next(c for c in precision["candidates"] if c["name"] == "static_qdq")
    assert static["meets_target"], static["accuracy"]
    # The static model itself, re-scored here: every output within cosine 0.99 of the original.
    quantized = tmp_path / "static.onnx"
    fp32 = tmp_path / "fp32.onnx"  # our fused graph, as the precision stage quantises it
    plain = OptimizeOptions(measure_latency=False, disabled_rules=["ort_layout"])
    fp32.write_bytes(FlexDSAOptimizer("cpu-ort").optimize(source, plain).model_bytes())
    feeds = [{k: v[i : i + 1] for k, v in arrays.items()} for i in range(24)]
    _quantize_static(fp32, quantized, feeds, tmp_path / "ranges.json", int8_format(FlexDSAOptimizer("cpu-ort").target))
    ops = {n.op_type for n in onnx.load(quantized).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    for feed in feeds[:4]:
        want, got = run(source.SerializeToString(), feed), run(quantized, feed)
        assert all(_cosine(want[k], got[k]) >= 0.99 for k in want)
    # What shipped: an int8 model meeting the target, or fp32 because no int8 model was faster here.
    shipped = result.model_bytes()
    if precision["shipped"] == "fp32":
        assert any("never-slower" in w for w in result.report["warnings"])
        assert b"QuantizeLinear" not in shipped
    else:
        assert precision["accuracy"]["ok"]
        chosen = next(c for c in precision["candidates"] if c["name"] == precision["shipped"])
        assert chosen["verdict_vs_fp32"] != "slower"


def test_synthetic_calibration_is_said_in_the_warnings():
    result = FlexDSAOptimizer("cpu-ort").optimize(
        _sensitive_mlp(), OptimizeOptions(precision="int8", precision_fallback="fp32", measure_latency=False)
    )
    assert result.report["precision"]["calibration"]["source"] == "synthetic"
    assert any("synthetic random inputs" in w for w in result.report["warnings"])


# ------------------------------------------------------------------------------------------ mixed
# The MLP's [batch, 8] output is a feature vector, not class scores: cosine only.
NOT_A_CLASSIFIER = AccuracyTarget(top1_outputs=[])


def _mlp_calibration() -> bytes:
    return _npz(x=np.random.default_rng(3).standard_normal((32, 16)).astype(np.float32))


def test_int8_that_misses_the_target_fails_naming_the_sensitive_layer():
    with pytest.raises(ValidationFailedError, match=r"no int8 model meets the accuracy target.*sensitive \(loss"):
        FlexDSAOptimizer("cpu-ort").optimize(
            _sensitive_mlp(), OptimizeOptions(precision="int8", measure_latency=False, accuracy=NOT_A_CLASSIFIER),
            calibration=_mlp_calibration(),
        )


def test_mixed_keeps_the_huge_range_layer_in_float_and_says_why():
    # Untimed: on this MLP's 16x32 MatMuls int8 is measured slower than fp32 (Q/DQ costs more than the dot
    # product) and would keep every layer float; the accuracy search is what this test is about.
    model = _sensitive_mlp()
    result = FlexDSAOptimizer("cpu-ort").optimize(
        model, OptimizeOptions(precision="mixed", accuracy=NOT_A_CLASSIFIER, measure_latency=False),
        calibration=_mlp_calibration(),
    )  # fmt: skip
    precision = result.report["precision"]
    table = {row["layer"]: row for row in precision["layers"]}
    assert table["sensitive"]["precision"] == "float32"
    assert "kept float: rank 1" in table["sensitive"]["reason"] and "misses the target" in table["sensitive"]["reason"]
    assert table["sensitive"]["sensitivity"] == max(row.get("sensitivity", 0.0) for row in table.values())
    assert table["first"]["precision"] == "int8"
    assert all(0.0 <= row["time_share"] <= 1.0 for row in table.values())
    mixed = next(c for c in precision["candidates"] if c["name"] == "mixed")
    assert mixed["meets_target"]
    full = next(c for c in precision["candidates"] if c["name"] == "static_qdq")
    assert not full["meets_target"]
    if precision["shipped"] == "mixed":
        feeds = [{"x": np.random.default_rng(9).standard_normal((4, 16)).astype(np.float32)}]
        shipped = result.model_bytes()
        assert _cosine(run(model, feeds[0])["y"], run(shipped, feeds[0])["y"]) >= 0.99
        nodes = {n.name: n for n in onnx.load_from_string(shipped).graph.node}
        assert not any(i.endswith("_DequantizeLinear_Output") for i in nodes["sensitive"].input)


def test_mixed_tries_dynamic_int8_with_the_most_sensitive_layer_float():
    # Dynamic int8 of every MatMul misses the target on the huge-range layers: 'widen' (one weight column
    # 1e4 times the others, one per-tensor weight scale) and 'sensitive' (reads that range). Keeping the one,
    # then the two most sensitive float (the static ranking) meets it with 'first' in int8; the candidate
    # says which layers and is scored in ONNX Runtime.
    result = FlexDSAOptimizer("cpu-ort").optimize(
        _sensitive_mlp(), OptimizeOptions(precision="mixed", accuracy=NOT_A_CLASSIFIER, measure_latency=False),
        calibration=_mlp_calibration(),
    )  # fmt: skip
    candidates = {c["name"]: c for c in result.report["precision"]["candidates"]}
    assert not candidates["dynamic"]["meets_target"]
    dynamic_mixed = candidates["dynamic_mixed"]
    assert dynamic_mixed["meets_target"], dynamic_mixed
    assert dynamic_mixed["how"].endswith("kept float: sensitive, widen") and "1 of 3 MatMuls" in dynamic_mixed["how"]
    assert dynamic_mixed["accuracy"]["outputs"]["y"]["cosine"] >= 0.99


def test_int8_re_scores_a_language_model_head_whose_top1_int8_flips():
    # A 4096-token head over near-tied logits: dynamic int8 of it flips a few percent of the rows' top-1s; the
    # candidate with its top 8 re-scored in fp32 keeps every one, and the report says which head and why.
    vocab = 4096
    ids = np.random.default_rng(2).integers(0, vocab, (16, 32)).astype(np.int64)
    result = FlexDSAOptimizer("cpu-ort").optimize(
        language_model(vocab, tied=True).SerializeToString(),
        OptimizeOptions(precision="int8", measure_latency=False, accuracy=EVERY_ROW), calibration=_npz(ids=ids),
    )  # fmt: skip
    precision = result.report["precision"]
    assert precision["classifier_head"]["classes"] == vocab and precision["classifier_head"]["exact_top_k"] == 8
    candidates = {c["name"]: c for c in precision["candidates"]}
    assert candidates["dynamic"]["accuracy"]["outputs"]["logits"]["top1_agreement"] < 0.99
    exact = candidates["dynamic_exact_head"]
    assert exact["meets_target"] and exact["accuracy"]["outputs"]["logits"]["top1_agreement"] == 1.0, exact
    assert precision["shipped"] in {name for name, c in candidates.items() if c["meets_target"]}


def test_mixed_keeps_the_body_float_and_the_re_scored_head_int8_when_that_is_what_holds():
    # With a body MatMul in int8 too the top-1s flip even with the head re-scored; dynamic_mixed keeps the body
    # float and the head int8 (re-scored): top-1 1.0 on the samples.
    vocab = 4096
    ids = np.random.default_rng(2).integers(0, vocab, (16, 32)).astype(np.int64)
    result = FlexDSAOptimizer("cpu-ort").optimize(
        language_model(vocab, tied=False, body=True).SerializeToString(),
        OptimizeOptions(precision="mixed", measure_latency=False, accuracy=EVERY_ROW), calibration=_npz(ids=ids),
    )  # fmt: skip
    candidates = {c["name"]: c for c in result.report["precision"]["candidates"]}
    assert not candidates["dynamic_exact_head"]["meets_target"]
    mixed = candidates["dynamic_mixed"]
    assert mixed["meets_target"] and mixed["accuracy"]["outputs"]["logits"]["top1_agreement"] == 1.0, mixed
    assert "kept float: body" in mixed["how"] and "'lm_head' int8 with its top 8 per row re-scored" in mixed["how"]


def test_a_model_without_a_top1_output_has_no_head_to_re_score():
    result = FlexDSAOptimizer("cpu-ort").optimize(
        _sensitive_mlp(huge=1.0), OptimizeOptions(precision="int8", accuracy=NOT_A_CLASSIFIER, measure_latency=False),
        calibration=_mlp_calibration(),
    )  # fmt: skip
    assert result.report["precision"]["classifier_head"] == {"node": None, "why": "no output is judged by top-1"}


def test_mixed_keeps_every_layer_int8_when_int8_already_meets_the_target():
    result = FlexDSAOptimizer("cpu-ort").optimize(
        _sensitive_mlp(huge=1.0), OptimizeOptions(precision="mixed", accuracy=NOT_A_CLASSIFIER, measure_latency=False),
        calibration=_mlp_calibration(),
    )  # fmt: skip
    precision = result.report["precision"]
    assert precision["search"]["keep_float"] == 0
    assert {row["precision"] for row in precision["layers"]} == {"int8"}


# ------------------------------------------------------------------------------------------ fp16
@pytest.mark.parametrize("keep_io_types", [True, False])
def test_fp16_on_an_accelerator_validates_and_keeps_io_types_as_asked(keep_io_types):
    options = OptimizeOptions(precision="fp16", keep_io_types=keep_io_types, measure_latency=False)
    result = FlexDSAOptimizer("nvidia-orin-nano").optimize(fixture("resnet"), options)
    precision = result.report["precision"]
    assert precision["shipped"] == "fp16" and precision["accuracy"]["ok"]
    assert precision["accuracy"]["elementwise"]["ok"] and precision["accuracy"]["elementwise"]["atol"] == 1e-2
    model = onnx.load_from_string(result.model_bytes())
    weights = Counter(init.data_type for init in model.graph.initializer if len(init.dims) > 1)
    assert set(weights) == {onnx.TensorProto.FLOAT16}
    io_type = onnx.TensorProto.FLOAT if keep_io_types else onnx.TensorProto.FLOAT16
    assert [v.type.tensor_type.elem_type for v in [*model.graph.input, *model.graph.output]] == [io_type, io_type]
    images = np.random.default_rng(5).standard_normal((2, 1, 3, 64, 64)).astype(np.float32)
    for image in images:
        want = run(fixture("resnet"), {"pixel_values": image})["logits"]
        got = run(result.model_bytes(), {"pixel_values": image.astype(np.float32 if keep_io_types else np.float16)})
        assert _cosine(want, got["logits"]) >= 0.999


# ------------------------------------------------------------------------------------------ per target
def _clear_images(count: int) -> np.ndarray:
    """Random images the ResNet fixture classifies with a margin (see the int8 fixture test)."""
    images = np.random.default_rng(11).standard_normal((8 * count, 3, 64, 64)).astype(np.float32)
    logits = np.sort(run(fixture("resnet"), {"pixel_values": images})["logits"], axis=1)
    margin = (logits[:, -1] - logits[:, -2]) / (logits[:, -1] - logits[:, 0])
    return images[np.argsort(-margin)[:count]]


def test_int8_for_tensorrt_is_symmetric_qdq_validated_here():
    result = FlexDSAOptimizer("nvidia-orin-nano").optimize(
        fixture("resnet"), OptimizeOptions(precision="int8"), calibration=_npz(pixel_values=_clear_images(16))
    )
    precision = result.report["precision"]
    assert precision["format"]["name"] == "TensorRT symmetric s8s8 QDQ" and precision["format"]["symmetric"]
    assert precision["shipped"] == "static_qdq" and precision["accuracy"]["ok"]
    assert "timing" not in precision and "cpu" not in precision  # the Orin is not this machine
    model = onnx.load_from_string(result.model_bytes())
    initializers = {init.name: init for init in model.graph.initializer}
    zero_points = [
        onnx.numpy_helper.to_array(initializers[n.input[2]]) for n in model.graph.node if n.op_type == "QuantizeLinear"
    ]
    assert zero_points and all(z.dtype == np.int8 and not z.any() for z in zero_points)
    assert "--int8" in result.artifacts["trtexec.sh"].decode()


def test_int8_on_a_vendor_quantised_target_ships_the_samples_for_its_quantiser():
    images = _clear_images(4)
    result = FlexDSAOptimizer("rockchip-rk3588").optimize(
        fixture("resnet"), OptimizeOptions(precision="int8", measure_latency=False), calibration=_npz(pixel_values=images)
    )
    assert result.report["precision"]["vendor_quantiser"] and result.report["precision"]["shipped"] == "fp32"
    shipped = load_calibration(result.artifacts["calibration.npz"])
    np.testing.assert_array_equal(shipped["pixel_values"], images)
    # RKNN-Toolkit2's dataset list: one sample a line, one .npy per input, as convert_rknn.py --dataset reads.
    lines = result.artifacts["dataset.txt"].decode().splitlines()
    assert lines == [f"calibration/{i:03d}_pixel_values.npy" for i in range(4)]
    first = np.load(io.BytesIO(result.artifacts[lines[0]]))
    np.testing.assert_array_equal(first, images[:1])
    assert "--dataset dataset.txt" in result.artifacts["README.md"].decode()


# ------------------------------------------------------------------------------------------ command line
def test_cli_takes_precision_and_calibration_and_refuses_a_misfit(tmp_path):
    import json

    from typer.testing import CliRunner

    from flexdsa_core.cli import app

    model, samples, spec = tmp_path / "mlp.onnx", tmp_path / "samples.npz", tmp_path / "spec.json"
    model.write_bytes(_sensitive_mlp())
    samples.write_bytes(_mlp_calibration())
    spec.write_text(json.dumps({"accuracy": {"top1_outputs": []}}))
    base = ["optimize", str(model), "--no-cache", "-q", "--spec", str(spec)]
    done = CliRunner().invoke(app, [*base, "--precision", "mixed", "--calibration", str(samples), "-o", str(tmp_path / "o")])
    assert done.exit_code == 0, done.output
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["precision"]["requested"] == "mixed" and report["precision"]["calibration"]["source"] == "uploaded"
    assert {r["layer"]: r["precision"] for r in report["precision"]["layers"]}["sensitive"] == "float32"

    (tmp_path / "wrong.npz").write_bytes(_npz(x=np.zeros((4, 15), np.float32)))
    refused = CliRunner().invoke(
        app, [*base, "--precision", "int8", "--calibration", str(tmp_path / "wrong.npz"), "-o", str(tmp_path / "w")]
    )
    assert refused.exit_code == 1 and "invalid_calibration" in refused.output
    assert "'x' dim 1 is 15, the model fixes it to 16" in " ".join(refused.output.split())


def test_precision_reports_progress_and_can_be_cancelled_during_the_search():
    from flexdsa_core.errors import CancelledError

    seen = []

    def progress(stage: str, fraction: float, message: str) -> None:
        seen.append((stage, message))
        if message.startswith("sensitivity of layer 2/"):
            raise CancelledError("cancelled by the test")

    with pytest.raises(CancelledError):
        FlexDSAOptimizer("cpu-ort").optimize(
            _sensitive_mlp(), OptimizeOptions(precision="mixed", accuracy=NOT_A_CLASSIFIER, measure_latency=False),
            calibration=_mlp_calibration(), progress=progress,
        )  # fmt: skip
    messages = [message for stage, message in seen if stage == "precision"]
    assert messages[0] == "mixed: calibrating, scoring and timing" and "int8 candidate static_qdq" in messages
    assert messages[-1].startswith("sensitivity of layer 2/3")


@pytest.mark.models
def test_mixed_on_a_cnn_starts_from_the_graph_whose_convolutions_the_quantiser_takes():
    """ONNX Runtime's quantiser leaves com.microsoft::FusedConv in float: where our fusions made some, mixed
    works from the graph compiled without them, so its table has the convolutions."""
    images = _clear_images(16)
    result = FlexDSAOptimizer("cpu-ort").optimize(
        fixture("resnet"), OptimizeOptions(precision="mixed", measure_latency=False), calibration=_npz(pixel_values=images)
    )
    precision = result.report["precision"]
    fused = "com.microsoft::FusedConv" in next(iter(result.report["nodes"]["after"].values()), {}) or any(
        c["name"] == "static_qdq_unfused" for c in precision["candidates"]
    )
    ops = {row["op"] for row in precision["layers"]}
    assert "Conv" in ops and "com.microsoft::FusedConv" not in ops
    if fused:
        assert precision["mixed_base"] == "static_qdq_unfused"
    assert next(c for c in precision["candidates"] if c["name"] == "mixed")["meets_target"]


@pytest.mark.models
def test_mixed_on_gpt2_keeps_enough_layers_float_for_top1_on_its_logits():
    """GPT-2's LM logits with random weights sit close together: all-int8 flips the top token of a few
    percent of positions; mixed keeps the most sensitive layers float until 99% agree."""
    ids = np.random.default_rng(4).integers(0, 200, size=(16, 8)).astype(np.int64)
    result = FlexDSAOptimizer("cpu-ort").optimize(
        fixture("gpt2"), OptimizeOptions(precision="mixed", measure_latency=False, accuracy=EVERY_ROW),
        calibration=_npz(input_ids=ids),
    )
    precision = result.report["precision"]
    mixed = next(c for c in precision["candidates"] if c["name"] == "mixed")
    assert mixed["meets_target"] and "error" not in mixed
    assert mixed["accuracy"]["outputs"]["logits"]["top1_agreement"] >= 0.99
    kept = [row for row in precision["layers"] if row["precision"] == "float32"]
    assert 0 < len(kept) < len(precision["layers"])
    assert precision["shipped"] in {"mixed", "dynamic", "static_qdq"}  # whichever meets the target (untimed)
    if precision["shipped"] == "mixed":
        assert b"QuantizeLinear" in result.model_bytes()


def test_samples_that_miss_the_shape_bucket_are_refused_naming_it():
    ids = np.zeros((4, 12), np.int64)
    samples = _npz(input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=ids)
    options = OptimizeOptions(precision="int8", shape_buckets={"batch": [1], "seq": [16]}, measure_latency=False)
    with pytest.raises(CalibrationError, match=r"'input_ids' dim 1 is 12, the model fixes it to 16.*bucket"):
        FlexDSAOptimizer("cpu-ort").optimize(fixture("bert"), options, calibration=samples)


@pytest.mark.models
def test_vit_keeps_its_residual_stream_and_attention_float_and_quantises_the_weight_layers():
    """ONNX Runtime's static QDQ of every op destroys ViT (the residual-stream Adds, the class-token Concat,
    LayerNorm inputs and attention-score MatMuls do not fit one per-tensor int8 scale): mixed falls back to
    the weight layers (Conv, MatMul, Gemm with initializer weights), everything else float, and meets the
    target with them in int8."""
    images = np.random.default_rng(11).standard_normal((16, 3, 32, 32)).astype(np.float32)
    source = onnx.load(fixture("vit"))  # [batch, 3, 32, 32]
    result = FlexDSAOptimizer("cpu-ort").optimize(
        source, OptimizeOptions(precision="mixed", measure_latency=False), calibration=_npz(pixel_values=images)
    )
    precision = result.report["precision"]
    by_name = {c["name"]: c for c in precision["candidates"]}
    assert not by_name[precision["mixed_base"]]["meets_target"]  # every op int8 misses the target
    assert precision["search"]["scope"] == "weight layers"
    mixed = by_name["mixed"]
    assert mixed["meets_target"] and "error" not in mixed, mixed
    rows = precision["layers"]
    int8_ops = {row["op"] for row in rows if row["precision"] == "int8"}
    assert int8_ops and int8_ops <= {"Conv", "MatMul", "Gemm"}
    norms = [row for row in rows if row["op"] == "LayerNormalization"]
    assert norms and all(r["precision"] == "float32" and "not a weight layer" in r["reason"] for r in norms)
    weight_rows = [row for row in rows if "sensitivity" in row]
    assert sum(row["precision"] == "int8" for row in weight_rows) > len(weight_rows) // 2
