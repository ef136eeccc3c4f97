"""precision.cpu_forms: our Attention and tied-weight FusedMatMul rewritten into the MatMuls ONNX Runtime's dynamic int8
quantiser takes. Exact in fp32 (checked in ONNX Runtime), quantised to int8 MatMuls, and left alone where
the rewrite would change what the op computes. A quantised classifier head with its top-k re-scored in fp32
keeps the fp32 head's top-1 where plain int8 flips it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from flexdsa_core.ort_runs import run
from flexdsa_core.precision import Int8Format
from flexdsa_core.precision.cpu_forms import EXACT_TOP_K, classifier_head, dynamic_form
from flexdsa_core.precision.quantise import _quantize_dynamic
from tests.models.language_model import language_model

HIDDEN, HEADS, SEQ, VOCAB = 32, 4, 6, 50


def _tied_attention_model(*, mask_index: bool = False, alpha: float = 1.0) -> onnx.ModelProto:
    """ids -> Gather(embedding) -> Attention(+ additive attention_bias) -> FusedMatMul(embedding, transB):
    a one-layer decoder whose LM head is tied to its embedding, in the form our fusions leave it."""
    rng = np.random.default_rng(0)
    weights = {
        "embedding": rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32),
        "qkv_weight": rng.standard_normal((HIDDEN, 3 * HIDDEN)).astype(np.float32) / 6,
        "qkv_bias": rng.standard_normal(3 * HIDDEN).astype(np.float32) / 10,
        "lengths": np.array([SEQ - 1], np.int32),
    }
    attention_inputs = ["hidden", "qkv_weight", "qkv_bias", "lengths" if mask_index else "", "", "bias"]
    nodes = [
        helper.make_node("Gather", ["embedding", "ids"], ["hidden"], name="embed"),
        helper.make_node(
            "Attention",
            attention_inputs,
            ["attended"],
            name="attention",
            domain="com.microsoft",
            num_heads=HEADS,
            qkv_hidden_sizes=[HIDDEN] * 3,
        ),  # fmt: skip
        helper.make_node(
            "FusedMatMul",
            ["attended", "embedding"],
            ["logits"],
            name="lm_head",
            domain="com.microsoft",
            transB=1,
            alpha=alpha,
        ),  # fmt: skip
    ]
    graph = helper.make_graph(
        nodes, "tied_attention",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, SEQ]),
         helper.make_tensor_value_info("bias", TensorProto.FLOAT, [1, 1, SEQ, SEQ])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, SEQ, VOCAB])],
        [numpy_helper.from_array(array, name) for name, array in weights.items()],
    )  # fmt: skip
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def _feeds() -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(3)
    causal = np.triu(np.full((SEQ, SEQ), -10000.0, np.float32), 1)[None, None]
    return [
        {"ids": rng.integers(0, VOCAB, (1, SEQ)).astype(np.int64), "bias": bias}
        for bias in (np.zeros_like(causal), causal, causal)
    ]


def _ops(model: onnx.ModelProto) -> Counter:
    return Counter(node.op_type for node in model.graph.node)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_attention_and_tied_head_become_matmuls_exactly():
    original = _tied_attention_model()
    form, done = dynamic_form(original)
    assert done == {"tied_matmul": 1, "attention": 1}
    assert _ops(form) == Counter(
        {"Gather": 1, "MatMul": 2, "Add": 1, "Split": 1, "MultiHeadAttention": 1}
    )  # the head's transposed copy is new; the embedding stays for the Gather
    onnx.checker.check_model(form)
    for feed in _feeds():  # the attention_bias is honoured: a causal bias changes the answer, in both alike
        want, got = run(original.SerializeToString(), feed), run(form.SerializeToString(), feed)
        np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-4, atol=1e-4)


def test_the_form_quantises_both_projections_to_int8(tmp_path: Path):
    original = _tied_attention_model()
    fp32 = tmp_path / "fp32.onnx"
    onnx.save(original, fp32)
    quantized = _quantize_dynamic(
        fp32, tmp_path / "dynamic.onnx", Int8Format("u8s8", "uint8", False, False, True)
    )
    ops = _ops(onnx.load(quantized))
    assert ops["MatMulInteger"] == 2 and ops["DynamicQuantizeLinear"] == 2, ops  # QKV projection and LM head
    assert not {"FusedMatMul", "Attention", "MatMul", "ConvInteger"} & set(ops), ops
    assert ops["Gather"] == 1 and "DequantizeLinear" not in ops  # the embedding table stays float
    for feed in _feeds():
        want, got = run(original.SerializeToString(), feed), run(quantized, feed)
        assert _cosine(want["logits"], got["logits"]) >= 0.99


def test_ops_the_rewrite_would_change_are_left_alone():
    # A mask_index (sequence lengths) has no MultiHeadAttention input of the same meaning here, and a scaled
    # FusedMatMul is not a plain MatMul: both stay as they are.
    original = _tied_attention_model(mask_index=True, alpha=0.5)
    form, done = dynamic_form(original)
    assert done == {"tied_matmul": 0, "attention": 0}
    assert _ops(form) == _ops(original)
    feed = _feeds()[1]
    np.testing.assert_array_equal(
        run(form.SerializeToString(), feed)["logits"], run(original.SerializeToString(), feed)["logits"]
    )


# ------------------------------------------------------------------------------------------ exact top-k head
LM_SEQ = 32


def _token_feeds(vocab: int, count: int = 8) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    return [{"ids": rng.integers(0, vocab, (1, LM_SEQ)).astype(np.int64)} for _ in range(count)]


def _quantised_pair(tmp_path: Path, model: onnx.ModelProto) -> tuple[Path, Path, object]:
    """(plain dynamic int8, dynamic int8 with the head's top-k re-scored, the head found)."""
    fp32 = tmp_path / "fp32.onnx"
    onnx.save(model, fp32)
    head, why = classifier_head(dynamic_form(model)[0], ["logits"])
    assert head is not None, why
    fmt = Int8Format("u8s8", "uint8", False, False, True)
    plain = _quantize_dynamic(fp32, tmp_path / "plain.onnx", fmt)
    exact = _quantize_dynamic(fp32, tmp_path / "exact.onnx", fmt, head=head)
    return plain, exact, head


def _top1(want: np.ndarray, got: np.ndarray) -> float:
    return float(np.mean(want.argmax(-1) == got.argmax(-1)))


@pytest.mark.parametrize("tied", [True, False])
def test_exact_top_k_gives_the_fp32_heads_top1_where_int8_flips_it(tmp_path: Path, tied: bool):
    vocab = 4096  # a divisor of it in the block range: no pad
    original = language_model(vocab, tied=tied)
    plain, exact, head = _quantised_pair(tmp_path, original)
    assert head.added_rows is None if tied else head.added_rows is not None  # tied: the embedding is the rows
    ops = _ops(onnx.load(exact))
    assert ops["TopK"] == 2 and ops["ScatterElements"] == 1 and ops["MatMulInteger"] == 1 and "Pad" not in ops, ops
    onnx.checker.check_model(onnx.load(exact))
    flipped = 0
    for feed in _token_feeds(vocab):
        want = run(original.SerializeToString(), feed)["logits"]
        approx, got = run(plain, feed)["logits"], run(exact, feed)["logits"]
        flipped += int(np.sum(want.argmax(-1) != approx.argmax(-1)))
        assert _top1(want, got) == 1.0
        # The re-scored classes carry the fp32 head's values, every other class the int8 head's, unchanged.
        rescored = got != approx
        assert rescored.sum(-1).max() <= EXACT_TOP_K
        np.testing.assert_allclose(got[rescored], want[rescored], rtol=1e-4, atol=1e-5)
        winners = np.take_along_axis(got, want.argmax(-1)[..., None], -1)
        np.testing.assert_allclose(winners, np.take_along_axis(want, want.argmax(-1)[..., None], -1), rtol=1e-4, atol=1e-5)
        assert _cosine(want, got) >= _cosine(want, approx)
    assert flipped > 0  # plain int8 does flip top-1s on these near-tied logits: the test means something


def test_exact_top_k_pads_a_vocabulary_no_block_divides(tmp_path: Path):
    vocab = 2053  # prime: the blocks need a pad of -inf past the last class
    original = language_model(vocab, tied=False)
    _, exact, _ = _quantised_pair(tmp_path, original)
    assert _ops(onnx.load(exact))["Pad"] == 1
    for feed in _token_feeds(vocab, 3):
        want, got = run(original.SerializeToString(), feed)["logits"], run(exact, feed)["logits"]
        assert got.shape == want.shape and np.isfinite(got).all()
        assert _top1(want, got) == 1.0


def test_classifier_head_says_why_it_leaves_a_head_alone():
    small = language_model(1000, tied=False)
    head, why = classifier_head(dynamic_form(small)[0], ["logits"])
    assert head is None and "1000 classes: cheap in fp32" in why
    head, why = classifier_head(dynamic_form(language_model(4096, tied=False))[0], [])
    assert head is None and "top-1 output" in why
