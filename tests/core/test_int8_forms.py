"""int8_forms: our Attention and tied-weight FusedMatMul rewritten into the MatMuls ONNX Runtime's dynamic int8
quantiser takes. Exact in fp32 (checked in ONNX Runtime), quantised to int8 MatMuls, and left alone where
the rewrite would change what the op computes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from flexdsa_core.int8_forms import dynamic_form
from flexdsa_core.precision import Int8Format, _quantize_dynamic
from flexdsa_core.validate import run

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
