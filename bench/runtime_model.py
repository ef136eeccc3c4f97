"""A BERT-base-size encoder written with onnx.helper and seeded random weights: the model ``bench.runtime``
deploys. No torch and no download: numpy writes the 110 M weights (hidden 768, 12 heads, FFN 3072, 12
layers, vocab 30522, 512 positions), opset 17.

Per layer: Q/K/V MatMul+Add, heads split by Reshape/Transpose, softmax(QK^T / 8 + (1 - mask) * -10000) V, the
output projection, residual + LayerNormalization, the erf GELU feed-forward (``x/2 (1 + erf(x/sqrt 2))``, the
form exporters write), residual + LayerNormalization. Inputs ``input_ids`` and ``attention_mask`` int64
``[batch, seq]``; output ``last_hidden_state`` ``[batch, seq, 768]``. A held-out model: none of the test
fixtures, built for this bench only. Cached at ``bench/results/models/bert-base-runtime.onnx``.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from bench import RESULTS_DIR

HIDDEN, HEADS, FFN, LAYERS, VOCAB, POSITIONS = 768, 12, 3072, 12, 30522, 512
PATH = RESULTS_DIR / "models" / "bert-base-runtime.onnx"


def _builder(seed: int):
    rng = np.random.default_rng(seed)
    initializers: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []

    def weight(name: str, shape, scale: float = 0.02) -> str:
        initializers.append(
            numpy_helper.from_array((rng.standard_normal(shape) * scale).astype(np.float32), name)
        )
        return name

    def const(name: str, array) -> str:
        initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(op: str, inputs: list[str], output: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    return weight, const, node, initializers, nodes


def build(path: Path = PATH, layers: int = LAYERS, seed: int = 0) -> Path:
    weight, const, node, initializers, nodes = _builder(seed)
    head_dim = HIDDEN // HEADS
    const("zero", np.array([0], np.int64))
    const("one_axis", np.array([1], np.int64))
    const("heads_shape", np.array([0, 0, HEADS, head_dim], np.int64))
    const("merge_shape", np.array([0, 0, HIDDEN], np.int64))
    const("scale", np.array(1 / math.sqrt(head_dim), np.float32))
    const("one_f", np.array(1.0, np.float32))
    const("neg_big", np.array(-10000.0, np.float32))
    const("half", np.array(0.5, np.float32))
    const("sqrt2", np.array(math.sqrt(2.0), np.float32))
    const("ones_hidden", np.ones(HIDDEN, np.float32))
    const("zeros_hidden", np.zeros(HIDDEN, np.float32))

    # Embeddings: word + position (positions 0..seq-1, sliced from a table), LayerNorm.
    words = node("Gather", [weight("word_embeddings", (VOCAB, HIDDEN)), "input_ids"], "words")
    node("Shape", ["input_ids"], "ids_shape")
    node("Gather", ["ids_shape", "one_axis"], "seq_len")
    positions = node(
        "Slice", [weight("position_embeddings", (POSITIONS, HIDDEN)), "zero", "seq_len", "zero"], "positions"
    )
    summed = node("Add", [words, positions], "embeddings_sum")
    hidden = node(
        "LayerNormalization", [summed, "ones_hidden", "zeros_hidden"], "embeddings", axis=-1, epsilon=1e-12
    )
    # Additive mask [batch, 1, 1, seq]: 0 where attended, -10000 where padded.
    mask_f = node("Cast", ["attention_mask"], "mask_f", to=TensorProto.FLOAT)
    inverted = node("Sub", ["one_f", mask_f], "mask_inverted")
    additive = node("Mul", [inverted, "neg_big"], "mask_additive")
    node("Unsqueeze", [additive, const("mask_axes", np.array([1, 2], np.int64))], "mask")

    for i in range(layers):
        p = f"l{i}"

        def heads(x: str, name: str, p: str = p) -> str:
            node("Reshape", [x, "heads_shape"], f"{p}_{name}_split")
            return node("Transpose", [f"{p}_{name}_split"], f"{p}_{name}_heads", perm=[0, 2, 1, 3])

        projected = {}
        for name in ("q", "k", "v"):
            mm = node("MatMul", [hidden, weight(f"{p}_{name}_w", (HIDDEN, HIDDEN))], f"{p}_{name}_mm")
            projected[name] = heads(
                node("Add", [mm, weight(f"{p}_{name}_b", (HIDDEN,))], f"{p}_{name}"), name
            )
        k_t = node("Transpose", [projected["k"]], f"{p}_k_t", perm=[0, 1, 3, 2])
        scores = node("MatMul", [projected["q"], k_t], f"{p}_scores")
        scaled = node("Mul", [scores, "scale"], f"{p}_scaled")
        masked = node("Add", [scaled, "mask"], f"{p}_masked")
        probs = node("Softmax", [masked], f"{p}_probs", axis=-1)
        context = node("MatMul", [probs, projected["v"]], f"{p}_context")
        merged = node("Transpose", [context], f"{p}_context_t", perm=[0, 2, 1, 3])
        merged = node("Reshape", [merged, "merge_shape"], f"{p}_context_merged")
        out = node("MatMul", [merged, weight(f"{p}_o_w", (HIDDEN, HIDDEN))], f"{p}_o_mm")
        out = node("Add", [out, weight(f"{p}_o_b", (HIDDEN,))], f"{p}_o")
        residual = node("Add", [out, hidden], f"{p}_attention_residual")
        hidden = node(
            "LayerNormalization",
            [residual, "ones_hidden", "zeros_hidden"],
            f"{p}_attention_norm",
            axis=-1,
            epsilon=1e-12,
        )
        up = node("MatMul", [hidden, weight(f"{p}_up_w", (HIDDEN, FFN))], f"{p}_up_mm")
        up = node("Add", [up, weight(f"{p}_up_b", (FFN,))], f"{p}_up")
        erf = node("Erf", [node("Div", [up, "sqrt2"], f"{p}_gelu_div")], f"{p}_gelu_erf")
        gelu = node(
            "Mul",
            [node("Mul", [up, node("Add", [erf, "one_f"], f"{p}_gelu_add")], f"{p}_gelu_mul"), "half"],
            f"{p}_gelu",
        )
        down = node("MatMul", [gelu, weight(f"{p}_down_w", (FFN, HIDDEN))], f"{p}_down_mm")
        down = node("Add", [down, weight(f"{p}_down_b", (HIDDEN,))], f"{p}_down")
        residual = node("Add", [down, hidden], f"{p}_ffn_residual")
        hidden = node(
            "LayerNormalization",
            [residual, "ones_hidden", "zeros_hidden"],
            f"{p}_ffn_norm",
            axis=-1,
            epsilon=1e-12,
        )
    nodes.append(helper.make_node("Identity", [hidden], ["last_hidden_state"], name="output"))

    graph = helper.make_graph(
        nodes,
        "bert_base_runtime",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "seq", HIDDEN])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, path)
    return path


def bert_base(path: Path = PATH) -> Path:
    """The cached model, built first when missing (a few seconds)."""
    return path if path.is_file() else build(path)
