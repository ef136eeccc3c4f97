"""A one-layer language model with a big, near-tied classifier head, written as ONNX: what the exact top-k
re-scoring of a quantised head (``flexdsa_core.precision.cpu_forms.exact_top_k``) is tested on, in the rewrite's tests
and through the pipeline. Random weights leave its logits close together, so int8 of the head alone flips
the top-1 of a few percent of rows, as on the bench GPT-2."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LM_HIDDEN = 64


def language_model(vocab: int, *, tied: bool, body: bool = False, seq: int = 32) -> onnx.ModelProto:
    """ids -> Gather(embedding) -> Mul(random signs) -> LayerNormalization -> head: logits over ``vocab``
    classes, near-tied (random weights; the signs keep a tied head from scoring its own token far above the
    rest), the head tied to the embedding (FusedMatMul transB, as our fusions leave GPT-2's) or its own [D, V]
    weight. ``body``: a [D, D] MatMul ('body') before the LayerNormalization, whose int8 error alone flips
    top-1s too."""
    rng = np.random.default_rng(1)
    embedding = rng.standard_normal((vocab, LM_HIDDEN)).astype(np.float32) / 8
    weights = {
        "embedding": embedding,
        "signs": rng.choice([-1.0, 1.0], LM_HIDDEN).astype(np.float32),
        "gamma": np.ones(LM_HIDDEN, np.float32),
        "beta": np.zeros(LM_HIDDEN, np.float32),
    }
    if tied:
        head = helper.make_node(
            "FusedMatMul", ["normed", "embedding"], ["logits"], name="lm_head", domain="com.microsoft", transB=1
        )
    else:
        weights["head_weight"] = rng.standard_normal((LM_HIDDEN, vocab)).astype(np.float32) / 8
        head = helper.make_node("MatMul", ["normed", "head_weight"], ["logits"], name="lm_head")
    nodes = [
        helper.make_node("Gather", ["embedding", "ids"], ["embedded"], name="embed"),
        helper.make_node("Mul", ["embedded", "signs"], ["hidden"], name="mix"),
        helper.make_node("LayerNormalization", ["hidden", "gamma", "beta"], ["normed"], name="norm", axis=-1),
        head,
    ]
    if body:
        weights["body_weight"] = rng.standard_normal((LM_HIDDEN, LM_HIDDEN)).astype(np.float32) / 8
        nodes[1].output[0] = "mixed"
        nodes.insert(2, helper.make_node("MatMul", ["mixed", "body_weight"], ["hidden"], name="body"))
    graph = helper.make_graph(
        nodes,
        "language_model",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, seq])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, seq, vocab])],
        [numpy_helper.from_array(array, name) for name, array in weights.items()],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)
