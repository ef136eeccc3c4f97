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

**Exact top-k of a quantised classifier head** (``classifier_head``, ``exact_top_k``). A language model's head
``logits = h · W`` (``W``: [D, V], a vocabulary of V classes) is the largest GEMM of a small LM (GPT-2 here:
53% of its fp32 time) and int8 computes it ~4x faster on this CPU, but where logits are near-tied (random
weights: the top two of 50,257 differ by under 0.2% of the logits' spread on 1% of the rows) its ~1% error
flips the top-1 of a few percent of rows. The quantised head keeps its int8 logits ``L̃`` and re-scores the
few candidates that can win exactly in fp32:

    cand = the top k (8) of L̃ per row         exact_j = h · W[:, j]  (fp32, j in cand)
    logits = L̃ with L̃[cand] replaced by exact[cand]

so a row's top-1 is the fp32 head's own top-1 whenever that class ranks in the int8 top k (its int8 error
would have to exceed the gap to the 8th: not seen on any row here), and every other logit carries the int8
error as before (the cosine is the int8 head's). The top k is found in two steps, since ONNX Runtime's TopK
over 50,257 classes costs more than the int8 GEMM saves: the maxima of blocks of ``b`` classes, the top k
blocks (which hold the top k classes: a class among the top k has at most k-1 larger ones, so at most k
blocks have a larger maximum), then the top k of their k·b classes. Rows of ``W`` are gathered from
``Wᵀ`` ([V, D], fp32): for a head tied to the token embedding that is the embedding table itself, already in
the model; otherwise one fp32 copy is added.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

DYNAMIC_OP_TYPES = ("MatMul",)
_MS = "com.microsoft"
# The name dynamic_form gives the transposed copy of a tied head's weight: ``<embedding>__transposed``.
TRANSPOSED = "__transposed"
# Candidates re-scored in fp32 per row of a quantised classifier head.
EXACT_TOP_K = 8
# A head with fewer classes is cheap in fp32 (an image classifier's 1,000 of one row): not worth the re-scoring.
EXACT_HEAD_MIN_CLASSES = 2048
# Block of classes whose maximum the first step of the top-k takes (a divisor of V in this range avoids a pad).
_BLOCK_RANGE, _BLOCK = (16, 64), 32


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


@dataclass(frozen=True)
class ClassifierHead:
    """A MatMul with a constant weight [D, V] whose output is a top-1-judged graph output."""

    node: str
    input: str
    output: str
    classes: int
    rank: int  # of the output: its last axis holds the classes
    rows: str  # the fp32 initializer holding Wᵀ ([V, D]) in the model
    added_rows: onnx.TensorProto | None  # Wᵀ to add after quantisation (None: ``rows`` is already in the model)


def classifier_head(form: onnx.ModelProto, top1_outputs: list[str]) -> tuple[ClassifierHead | None, str]:
    """The classifier head of ``form`` (a model in ``dynamic_form``) that ``exact_top_k`` can re-score, or
    None and why not."""
    initializers = {init.name: init for init in form.graph.initializer}
    outputs = {value.name: value for value in form.graph.output}
    for node in form.graph.node:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or node.output[0] not in top1_outputs:
            continue
        weight = initializers.get(node.input[1])
        if weight is None or len(weight.dims) != 2:
            return None, f"the head {node.name!r} has no constant [D, V] weight"
        classes = int(weight.dims[1])
        if classes < EXACT_HEAD_MIN_CLASSES:
            return None, f"the head {node.name!r} has {classes} classes: cheap in fp32"
        dims = outputs[node.output[0]].type.tensor_type.shape.dim
        if len(dims) < 2:
            return None, f"the head's output {node.output[0]!r} has no known rank"
        if not any(op.domain in ("", "ai.onnx") and op.version >= 13 for op in form.opset_import):
            return None, "the model's opset is below 13"
        tied = node.input[1].removesuffix(TRANSPOSED)
        if node.input[1].endswith(TRANSPOSED) and tied in initializers and list(initializers[tied].dims) == [
            weight.dims[1], weight.dims[0]
        ]:  # fmt: skip
            return ClassifierHead(node.name, node.input[0], node.output[0], classes, len(dims), tied, None), ""
        rows = numpy_helper.from_array(
            np.ascontiguousarray(numpy_helper.to_array(weight).T), f"{node.input[1]}__rows"
        )  # fmt: skip
        return ClassifierHead(node.name, node.input[0], node.output[0], classes, len(dims), rows.name, rows), ""
    return None, "no MatMul with a constant weight writes a top-1 output"


def _block(classes: int) -> tuple[int, int]:
    """(block size, padded class count) for the first step of the top-k."""
    low, high = _BLOCK_RANGE
    divisors = [b for b in range(low, high + 1) if classes % b == 0]
    if divisors:
        block = min(divisors, key=lambda b: abs(b - _BLOCK))
        return block, classes
    return _BLOCK, -(-classes // _BLOCK) * _BLOCK


def exact_top_k(quantized: onnx.ModelProto, head: ClassifierHead, k: int = EXACT_TOP_K) -> onnx.ModelProto:
    """``quantized`` (the dynamic int8 model) with its head's top ``k`` candidates per row re-scored in fp32
    (the module docstring). Exact in the re-scored classes; the other logits are the int8 head's."""
    model = onnx.ModelProto.FromString(quantized.SerializeToString())
    graph = model.graph
    approx = f"{head.output}__int8"
    for node in graph.node:
        node.output[:] = [approx if name == head.output else name for name in node.output]
        node.input[:] = [approx if name == head.output else name for name in node.input]
    opset = next(op.version for op in model.opset_import if op.domain in ("", "ai.onnx"))
    block, padded = _block(head.classes)
    lead = head.rank - 1
    stem = f"{head.node}__exact"

    def name(suffix: str) -> str:
        return f"{stem}_{suffix}"

    constants = {
        "k": np.array([k], np.int64),
        "blocks": np.array([0] * lead + [padded // block, block], np.int64),
        "last": np.array([-1], np.int64),
        "offsets": np.arange(block, dtype=np.int64),
        "block": np.array(block, np.int64),
        "flat": np.array([0] * lead + [k * block], np.int64),
    }
    nodes = []
    scores = approx
    if padded != head.classes:  # -inf past the last class: never a block's maximum, never a candidate
        constants["pads"] = np.array([0] * (2 * head.rank), np.int64)
        constants["pads"][head.rank - 1 + head.rank] = padded - head.classes
        constants["lowest"] = np.array(-np.inf, np.float32)
        nodes.append(helper.make_node("Pad", [approx, name("pads"), name("lowest")], [name("padded")]))
        scores = name("padded")
    reduce_max = (
        helper.make_node("ReduceMax", [name("by_block"), name("last")], [name("block_max")], keepdims=0)
        if opset >= 18
        else helper.make_node("ReduceMax", [name("by_block")], [name("block_max")], axes=[-1], keepdims=0)
    )
    nodes += [
        helper.make_node("Reshape", [scores, name("blocks")], [name("by_block")]),
        reduce_max,  # [..., V/b]: each block's largest int8 logit
        helper.make_node("TopK", [name("block_max"), name("k")], [name("top_blocks_v"), name("top_blocks")], axis=-1),
        helper.make_node("Unsqueeze", [name("top_blocks"), name("last")], [name("top_blocks_1")]),
        helper.make_node("Mul", [name("top_blocks_1"), name("block")], [name("block_start")]),
        helper.make_node("Add", [name("block_start"), name("offsets")], [name("in_blocks")]),
        helper.make_node("Reshape", [name("in_blocks"), name("flat")], [name("candidates")]),  # [..., k*b]
        helper.make_node("GatherElements", [scores, name("candidates")], [name("candidate_v")], axis=-1),
        helper.make_node("TopK", [name("candidate_v"), name("k")], [name("top_v"), name("top_at")], axis=-1),
        helper.make_node("GatherElements", [name("candidates"), name("top_at")], [name("classes")], axis=-1),
        helper.make_node("Gather", [head.rows, name("classes")], [name("rows")]),  # [..., k, D]: W[:, j]ᵀ
        helper.make_node("Unsqueeze", [head.input, name("last")], [name("column")]),  # [..., D, 1]
        helper.make_node("MatMul", [name("rows"), name("column")], [name("exact_1")]),  # [..., k, 1]
        helper.make_node("Squeeze", [name("exact_1"), name("last")], [name("exact")]),
        helper.make_node("ScatterElements", [approx, name("classes"), name("exact")], [head.output], axis=-1),
    ]
    for node in nodes:
        node.name = node.output[0]
    graph.node.extend(nodes)
    graph.initializer.extend(numpy_helper.from_array(value, name(key)) for key, value in constants.items())
    if head.added_rows is not None:
        graph.initializer.append(head.added_rows)
    return model
