"""The graph form ONNX Runtime's dynamic int8 quantiser wants, made from our fused fp32 graph.

``quantize_dynamic`` turns ``MatMul(x, W)`` with an initializer ``W`` into ``DynamicQuantizeMatMul`` (VNNI
u8 x s8 GEMM, bias fused at ORT_ENABLE_ALL). Two of our fusions hide such MatMuls from it, and two of its
defaults cost more than they save; both rewrites below are exact in fp32:

* ``com.microsoft::FusedMatMul(x, W, transB=1)`` with an initializer ``W`` (GPT-2's LM head tied to the
  token embedding, 52% of its fp32 time) → ``MatMul(x, Wᵀ)`` with ``Wᵀ`` a new initializer. The quantiser
  knows no FusedMatMul, so that GEMM stayed fp32.
* ``com.microsoft::Attention(x, W, b, attention_bias=m)`` → ``MultiHeadAttention(Split(MatMul(x, W) + b),
  attention_bias=m)``. The quantiser's ``QAttention`` takes neither ``qkv_hidden_sizes`` (it leaves such an
  Attention, projection and all, in fp32) nor ``attention_bias`` (it would drop it). Measured here on
  ViT-B width, batch 1, 1 thread, VNNI: the MultiHeadAttention form 60.6 ms, QAttention 66.0 ms (15 paired
  rounds, interquartile ranges overlapping): no slower, and it works for every Attention we fuse.

Op types quantised: MatMul only. ``ConvInteger`` measured 8x slower than fp32 Conv on ViT's patch embedding
(19.6 vs 2.3 ms), and a quantised ``Gather`` on an embedding shared with the LM head dequantised the whole
table every run (64 ms on GPT-2).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

DYNAMIC_OP_TYPES = ("MatMul",)
_MS = "com.microsoft"


def _attributes(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _tied_matmul(node, attrs, initializers) -> str | None:
    """Why a FusedMatMul cannot become a MatMul with a transposed constant weight (None: it can)."""
    if len(node.input) != 2 or node.input[1] not in initializers:
        return "its B is not an initializer"
    if len(initializers[node.input[1]].dims) != 2:
        return "its B is not a matrix"
    if attrs.get("transB", 0) != 1 or any(attrs.get(k, 0) for k in ("transA", "transBatchA", "transBatchB")):
        return "only transB is set in the form this rewrite takes"
    if attrs.get("alpha", 1.0) != 1.0:
        return "alpha is not 1"
    return None


def _splittable_attention(node, attrs, initializers) -> str | None:
    """Why an Attention cannot become MatMul + Split + MultiHeadAttention (None: it can)."""
    extra = list(node.input[3:]) + [""] * 4
    if len(node.input) < 3 or node.input[1] not in initializers or not node.input[2]:
        return "its QKV weight is not an initializer or it has no bias"
    if any(node.output[1:]):
        return "its present state is used"
    if extra[0] or extra[1] or extra[3]:
        return "it has a mask_index, past state or past_sequence_length"
    if (
        attrs.get("unidirectional", 0)
        or attrs.get("do_rotary", 0)
        or attrs.get("past_present_share_buffer", 0)
    ):
        return "it is unidirectional, rotary or shares past/present buffers"
    sizes = attrs.get("qkv_hidden_sizes")
    width = initializers[node.input[1]].dims[-1]
    if (sizes and len(set(sizes)) != 1) or width % 3:
        return "its Q, K and V widths differ"
    return None


def dynamic_form(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    """A copy of ``model`` in the form above, and what was rewritten (``tied_matmul``, ``attention`` counts)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    nodes, added, done = [], [], {"tied_matmul": 0, "attention": 0}
    transposed: dict[str, str] = {}
    opset = next((op.version for op in model.opset_import if op.domain in ("", "ai.onnx")), 0)
    for node in graph.node:
        attrs = _attributes(node)
        if (
            node.domain == _MS
            and node.op_type == "FusedMatMul"
            and _tied_matmul(node, attrs, initializers) is None
        ):
            weight = node.input[1]
            if weight not in transposed:  # one transposed copy however many heads share the weight
                transposed[weight] = f"{weight}__transposed"
                array = numpy_helper.to_array(initializers[weight])
                added.append(numpy_helper.from_array(np.ascontiguousarray(array.T), transposed[weight]))
            nodes.append(
                helper.make_node("MatMul", [node.input[0], transposed[weight]], list(node.output), node.name)
            )
            done["tied_matmul"] += 1
            continue
        attention = node.domain == _MS and node.op_type == "Attention"
        # opset 13: Split takes its sizes as an input
        if attention and opset >= 13 and _splittable_attention(node, attrs, initializers) is None:
            width = initializers[node.input[1]].dims[-1] // 3
            stem = node.name or f"attention_{done['attention']}"
            sizes = f"{stem}__qkv_sizes"
            added.append(numpy_helper.from_array(np.array([width] * 3, np.int64), sizes))
            projected, biased = f"{stem}__qkv", f"{stem}__qkv_biased"
            qkv = [f"{stem}__q", f"{stem}__k", f"{stem}__v"]
            attention_bias = node.input[5] if len(node.input) > 5 else ""
            kept = {k: v for k, v in attrs.items() if k in ("num_heads", "scale", "mask_filter_value")}
            nodes += [
                helper.make_node(
                    "MatMul", [node.input[0], node.input[1]], [projected], f"{stem}__qkv_matmul"
                ),
                helper.make_node("Add", [projected, node.input[2]], [biased], f"{stem}__qkv_bias"),
                helper.make_node("Split", [biased, sizes], qkv, f"{stem}__qkv_split", axis=-1),
                helper.make_node(
                    "MultiHeadAttention",
                    [*qkv, "", "", attention_bias],
                    [node.output[0]],
                    stem,
                    domain=_MS,
                    **kept,
                ),
            ]
            done["attention"] += 1
            continue
        nodes.append(node)
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(added)
    used = {name for node in graph.node for name in node.input} | {o.name for o in graph.output}
    kept_initializers = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept_initializers)
    # The quantiser re-infers shapes; ours describe the graph before the rewrite.
    del graph.value_info[:]
    if not any(op.domain == _MS for op in model.opset_import) and done["attention"]:
        model.opset_import.append(helper.make_opsetid(_MS, 1))
    return model, done
