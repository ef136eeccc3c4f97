"""Scaled-dot-product attention written out → ONNX Runtime's fused attention, at two granularities.

The core, as PyTorch exporters write it for BERT/GPT-2/ViT-style blocks (q, k, v are [B, S, H*Dh]):

    heads(t)  = Transpose(Reshape(t, [B, S, H, Dh]), perm=[0, 2, 1, 3])                  # [B, H, S, Dh]
    scores    = heads(q) @ Transpose(keys)  * scale  (+ mask)                           # [B, H, S, T]
    out       = Reshape(Transpose(Softmax(scores) [Dropout] @ heads(v), [0, 2, 1, 3]), [B, S, H*Dh])

The key's transpose is either one ``perm=[0, 2, 3, 1]`` or heads() then ``perm=[0, 1, 3, 2]``; the scale is a
Div or Mul after the first MatMul, or (``F.scaled_dot_product_attention``'s export) a Mul on each of q
and kᵀ by sqrt(scale); the mask is any float tensor added to the scores (BERT's [B, 1, 1, T], a causal
[S, T], ...); GPT-2's causal ``Where(causal, scores, lowest)`` becomes the additive bias
where(causal, 0, lowest) (the same Softmax to float32 rounding): a constant when the condition is one,
else one Where computed at run time; an inference Dropout may follow the Softmax.

timm's ViT writes q, k, v packed: one [B, S, 3*H*Dh] tensor reshaped to [B, S, 3, H, Dh], transposed to
[3, B, H, S, Dh] and picked apart by Gather (layout "packed"; the others are "key_0231"/"key_0132").
With dynamic shapes the exporters compute every Reshape shape from Shape nodes on the tensors around;
the check reads those (``_shape_values``) and allows the matched intermediates no other use than such
Shape nodes, which die with the match (the rules keep ``remove_nodes=False`` and a dead-node sweep
follows).

- ``multihead_attention``: the core → ``com.microsoft::MultiHeadAttention(q, k, v, attention_bias=mask)``
  (packed: q, k, v split off the last axis first).
- ``attention``: the core with its projections from one input x (self-attention, constant weights) →
  ``com.microsoft::Attention(x, [Wq|Wk|Wv], [bq|bk|bv])``: one GEMM for q, k, v (packed: W and b as they are).

The two consume the same core, so they share the ``attention`` alternatives group and the Fusion Switcher
costs each. The MHA/Attention kernels take an attention bias of shape [B or 1, H or 1, S, T] only, so a
mask of any other broadcastable shape is expanded to [.., S, T] first. ONNX Runtime's CPU kernels take
float32 only. onnxscript's ``ort_fusions`` reach the same ops through an intermediate SDPA op in a private
domain and several passes; one FusionRule here is one rewrite set applied once, so the whole subgraph is
one pattern and never leaves a half-fused graph.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from flexdsa_core._libraries import get_numpy_value, get_singleton_value
from flexdsa_core.fusions._shape_values import outside_use_refusal, shape_entries
from flexdsa_core.fusions.base import make_rule

_HEADS = [0, 2, 1, 3]


def _either(make, a, b):
    return pattern.OrValue([make(a, b), make(b, a)])


def _const_scalar(value: ir.Value | None) -> float | None:
    scalar = get_singleton_value(value)
    return None if scalar is None else float(scalar)


_LAYOUTS = ("key_0231", "key_0132", "packed")


def _heads_and_size(count, size, hidden) -> tuple[int, int] | None:
    """(heads, head size) from a Reshape's two head entries, one of which may be -1 (left to Reshape)."""
    hidden = hidden if isinstance(hidden, int) else None
    if count == -1 and isinstance(size, int) and size > 0 and hidden:
        count = hidden // size
    if size == -1 and isinstance(count, int) and count > 0 and hidden:
        size = hidden // count
    if isinstance(count, int) and count > 0 and isinstance(size, int) and size > 0:
        return count, size
    return None


class _AttentionBase(pattern.RewriteRuleClassBase):
    """Shared by both granularities: the core pattern from q, k, v to the merged heads, and its checks."""

    def __init__(self, name: str, layout: str):
        # remove_nodes=False: with dynamic shapes, Shape nodes read the matched intermediates to build the
        # Reshape shapes; the check allows exactly those uses, and the dead nodes go after the rewrite.
        super().__init__(f"{name}_{layout}", remove_nodes=False)
        assert layout in _LAYOUTS, layout
        self._layout = layout

    def heads(self, op, query, key, value):
        """(q, kᵀ, v) split into heads, [B, H, S, Dh] (kᵀ: [B, H, Dh, S])."""
        if self._layout == "packed":  # timm: one [B, S, 3*H*Dh] tensor -> [3, B, H, S, Dh], then Gather
            qkv_heads = op.Transpose(
                op.Reshape(query, _allow_other_inputs=True, _outputs=["qkv_5d"]), perm=[2, 0, 3, 1, 4]
            )
            q_heads = op.Gather(qkv_heads, 0, _outputs=["q_picked"])
            k_transposed = op.Transpose(op.Gather(qkv_heads, 1, _outputs=["k_picked"]), perm=[0, 1, 3, 2])
            v_heads = op.Gather(qkv_heads, 2, _outputs=["v_picked"])
            return q_heads, k_transposed, v_heads
        q_heads = op.Transpose(op.Reshape(query, _allow_other_inputs=True, _outputs=["q_4d"]), perm=_HEADS)
        k_4d = op.Reshape(key, _allow_other_inputs=True, _outputs=["k_4d"])
        if self._layout == "key_0231":
            k_transposed = op.Transpose(k_4d, perm=[0, 2, 3, 1])
        else:
            k_transposed = op.Transpose(op.Transpose(k_4d, perm=_HEADS), perm=[0, 1, 3, 2])
        v_heads = op.Transpose(op.Reshape(value, _allow_other_inputs=True, _outputs=["v_4d"]), perm=_HEADS)
        return q_heads, k_transposed, v_heads

    def core(self, op, query, key=None, value=None):
        q_heads, k_transposed, v_heads = self.heads(op, query, key, value)
        q_scale, k_scale, qk_scale, mask = (
            pattern.Var(n) for n in ("q_scale", "k_scale", "qk_scale", "mask")
        )
        q_side = pattern.OrValue(
            [_either(op.Mul, q_heads, q_scale), q_heads], tag_var="q_scaled", tag_values=[True, False]
        )
        k_side = pattern.OrValue(
            [_either(op.Mul, k_transposed, k_scale), k_transposed],
            tag_var="k_scaled",
            tag_values=[True, False],
        )
        scores = op.MatMul(q_side, k_side)
        scores = pattern.OrValue(
            [op.Div(scores, qk_scale), _either(op.Mul, scores, qk_scale), scores],
            tag_var="qk_scaling",
            tag_values=["Div", "Mul", "None"],
        )
        # GPT-2's causal mask: Where(causal, scores, lowest float), turned into an additive bias.
        scores = pattern.OrValue(
            [op.Where(pattern.Var("causal"), scores, pattern.Var("fill")), scores],
            tag_var="has_causal",
            tag_values=[True, False],
        )
        scores = pattern.OrValue(
            [_either(op.Add, scores, mask), scores], tag_var="has_mask", tag_values=[True, False]
        )
        probs = op.Softmax(scores, _outputs=["probs"])
        probs = pattern.OrValue(
            [op.Dropout(probs, _allow_other_inputs=True, _outputs=["dropped"]), probs],
            tag_var="has_dropout",
            tag_values=[True, False],
        )
        context = op.Transpose(op.MatMul(probs, v_heads, _outputs=["context_4d"]), perm=_HEADS)
        return op.Reshape(context, _allow_other_inputs=True, _outputs=["merged"])

    def core_refusal(self, context, query, key, value, bindings: dict, shapes=None) -> str | None:
        """None when the matched core is the attention the fused ops compute; sets the fused op's parameters.
        ``shapes`` gives the shapes of query, key and value where the caller knows more than the graph.
        In the packed layout ``query`` is the [B, S, 3*H*Dh] tensor and ``key``/``value`` are None."""
        packed = self._layout == "packed"
        if packed:
            key = value = query
        q_dims, k_dims, v_dims = shapes or (query.shape, key.shape, value.shape)
        for name, tensor in (("query", query), ("key", key), ("value", value)):
            if tensor.dtype is not None and tensor.dtype != ir.DataType.FLOAT:
                return f"The {name} '{tensor.name}' is {tensor.dtype}; ONNX Runtime's CPU attention takes float32."
        for name, tensor, dims in (("query", query, q_dims), ("key", key, k_dims), ("value", value, v_dims)):
            if dims is None or len(dims) != 3:
                return f"The {name} '{tensor.name}' is not known to be a 3-D [B, S, H*Dh] tensor."
        known = {query: list(q_dims), key: list(k_dims), value: list(v_dims)}
        if packed:
            if (reason := self._packed_refusal(bindings, known, q_dims)) is not None:
                return reason
            num_heads, head_size = self._packed_heads
            v_head_size = head_size
        else:
            heads = {}
            for name, dims in (("q_4d", q_dims), ("k_4d", k_dims), ("v_4d", v_dims)):
                entries = shape_entries(bindings[name].producer().inputs[1], known)
                if entries is None or len(entries) != 4:
                    return f"A Reshape to heads does not make a readable 4-D [B, S, H, Dh] shape ({entries})."
                heads[name] = _heads_and_size(entries[2], entries[3], dims[2])
                if heads[name] is None:
                    return f"A Reshape to heads {entries} does not tell the number of heads and head size."
            num_heads, head_size = heads["q_4d"]
            v_head_size = heads["v_4d"][1]
            if heads["k_4d"] != heads["q_4d"] or heads["v_4d"][0] != num_heads:
                return f"Query, key and value are split into heads differently ({heads})."
            if q_dims[2] != num_heads * head_size or k_dims[2] != num_heads * head_size:
                return f"Query/key hidden size is not {num_heads} heads x {head_size}."
        merge = bindings["merged"].producer()
        context_4d = bindings["context_4d"]
        known[context_4d] = [None, num_heads, None, v_head_size]
        known[merge.inputs[0]] = [None, None, num_heads, v_head_size]
        merged = shape_entries(merge.inputs[1], known)
        if merged is None or len(merged) != 3 or merged[2] not in (-1, num_heads * v_head_size):
            return f"The heads are not merged back into [B, S, H*Dh] (Reshape to {merged})."
        if (reason := outside_use_refusal(context)) is not None:
            return reason

        probs_node = bindings["probs"].producer()
        axis = probs_node.attributes.get_int("axis", -1 if self._opset(context) >= 13 else 1)
        if axis not in (-1, 3):
            return f"The Softmax is over axis {axis}, not the key axis."
        if bindings.get("has_dropout"):
            dropout = bindings["dropped"].producer()
            training = get_singleton_value(dropout.inputs[2]) if len(dropout.inputs) > 2 else False
            if training is None or bool(training):
                return "The Dropout after the Softmax may be in training mode."

        scale = 1.0
        for tag, name in (("q_scaled", "q_scale"), ("k_scaled", "k_scale")):
            if bindings.get(tag):
                factor = _const_scalar(bindings[name])
                if factor is None:
                    return f"The {name} on the {name[0]} side is not a constant scalar."
                scale *= factor
        if bindings.get("qk_scaling", "None") != "None":
            factor = _const_scalar(bindings["qk_scale"])
            if factor is None or factor == 0:
                return "The scale of the scores is not a non-zero constant scalar."
            scale *= 1.0 / factor if bindings["qk_scaling"] == "Div" else factor
        self._scale = scale
        self._num_heads = num_heads
        self._head_size = head_size

        self._mask = bindings.get("mask") if bindings.get("has_mask") else None
        bias_shapes = []
        if self._mask is not None:
            mask = self._mask
            if mask.dtype != ir.DataType.FLOAT:
                return f"The mask '{mask.name}' is {mask.dtype}, not a float32 additive mask."
            if mask.shape is not None and mask.shape.rank() > 4:
                return f"The mask '{mask.name}' has rank {mask.shape.rank()} > 4."
            bias_shapes.append(mask.shape)
        self._causal = None
        if bindings.get("has_causal"):
            causal, fill = bindings["causal"], bindings["fill"]
            fill_value = _const_scalar(fill)
            if causal.dtype != ir.DataType.BOOL or fill_value is None:
                return "The Where before the Softmax does not select the scores by a boolean mask against a constant."
            condition = None if causal.is_graph_input() else get_numpy_value(causal)
            if condition is not None and condition.ndim > 4:
                return f"The causal mask '{causal.name}' has rank {condition.ndim} > 4."
            additive = None if condition is None else np.where(condition, 0.0, fill_value).astype(np.float32)
            self._causal = (causal, additive, fill_value)
            bias_shapes.append(ir.Shape(condition.shape) if condition is not None else causal.shape)
        # MHA/Attention broadcast the bias over batch and heads only ([B|1, H|1, S, T]): expand it unless
        # its shape is known to be that already.
        self._expand_bias = bool(bias_shapes) and not _is_full_bias(bias_shapes, q_dims[1], k_dims[1])
        self._lengths = (q_dims[1], k_dims[1])
        return None

    def _packed_refusal(self, bindings: dict, known: dict, dims) -> str | None:
        entries = shape_entries(bindings["qkv_5d"].producer().inputs[1], known)
        if entries is None or len(entries) != 5 or entries[2] != 3:
            return f"The packed projection is not reshaped into [B, S, 3, H, Dh] ({entries})."
        hidden = dims[2] // 3 if isinstance(dims[2], int) and dims[2] % 3 == 0 else None
        heads = _heads_and_size(entries[3], entries[4], hidden)
        if heads is None or hidden != heads[0] * heads[1]:
            return f"The packed Reshape {entries} does not tell the number of heads and head size."
        for name in ("q_picked", "k_picked", "v_picked"):
            if bindings[name].producer().attributes.get_int("axis", 0) != 0:
                return "Query, key and value are not picked from the packed heads along its first axis."
        self._packed_heads = heads
        return None

    @staticmethod
    def _opset(context) -> int:
        imports = context.model.opset_imports
        return imports.get("", imports.get("ai.onnx", 1))

    def setup(self):
        self._causal_biases: dict[ir.Value, ir.Value] = {}

    def attention_bias(self, op, query, key):
        """The additive mask (and the causal mask as a bias) as the fused ops take it, or None."""
        bias = None
        if self._causal is not None:
            condition, additive, fill = self._causal
            bias = self._causal_biases.get(condition)
            if bias is None or bias.graph is None:  # reuse only what an accepted rewrite put in the graph
                if additive is not None:  # constant mask: one bias initializer, shared by the layers
                    bias = op.initializer(ir.tensor(additive), name=f"{condition.name}__additive_bias")
                else:  # computed mask (dynamic shapes): the same selection as a bias, at run time
                    zero, lowest = (
                        op.Constant(value=ir.tensor(np.array(v, dtype=np.float32))) for v in (0.0, fill)
                    )
                    bias = op.Where(condition, zero, lowest)
                self._causal_biases[condition] = bias
        if self._mask is not None:
            bias = self._mask if bias is None else op.Add(bias, self._mask)
        if bias is None or not self._expand_bias:
            return bias
        if all(isinstance(length, int) for length in self._lengths):
            return op.Expand(bias, op.Constant(value_ints=[1, 1, *self._lengths]))
        one = op.Constant(value_ints=[1])
        lengths = (op.Shape(query, start=1, end=2), op.Shape(key, start=1, end=2))
        return op.Expand(bias, op.Concat(one, one, *lengths, axis=0))


def _is_full_bias(shapes: list[ir.Shape | None], query_length, key_length) -> bool:
    """Whether the broadcast of ``shapes`` is known to be [*, *, query_length, key_length]."""
    if any(shape is None or not all(isinstance(d, int) for d in shape) for shape in shapes):
        return False
    if not isinstance(query_length, int) or not isinstance(key_length, int):
        return False
    broadcast = np.broadcast_shapes(*(tuple(shape) for shape in shapes))
    return len(broadcast) == 4 and broadcast[2:] == (query_length, key_length)


class MultiHeadAttentionFusion(_AttentionBase):
    """Reshape(Transpose(MatMul(Softmax(MatMul(heads(q), heads(k)ᵀ) * scale + mask), heads(v)))) → com.microsoft::MultiHeadAttention(q, k, v, mask)"""

    def __init__(self, layout: str):
        super().__init__("MultiHeadAttention", layout)

    def pattern(self, op, query, key, value):
        if self._layout == "packed":
            return self.core(op, query)
        return self.core(op, query, key, value)

    def check(self, context, query, key=None, value=None, **bindings) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if (reason := self.core_refusal(context, query, key, value, bindings)) is not None:
            return result.fail(reason)
        return result

    def rewrite(self, op, query, key=None, value=None, **_):
        if self._layout == "packed":  # [B, S, 3D] holds q, k and v in that order along its last axis
            hidden = self._num_heads * self._head_size
            query, key, value = op.Split(query, op.Constant(value_ints=[hidden] * 3), axis=-1, _outputs=3)
        mask = self.attention_bias(op, query, key)
        inputs = [query, key, value] + ([None, None, mask] if mask is not None else [])
        return op.MultiHeadAttention(
            *inputs, num_heads=self._num_heads, scale=self._scale, _domain="com.microsoft"
        )


class AttentionFusion(_AttentionBase):
    """heads-attention over (x @ Wq + bq, x @ Wk + bk, x @ Wv + bv) → com.microsoft::Attention(x, [Wq|Wk|Wv], [bq|bk|bv], mask)"""

    def __init__(self, layout: str):
        super().__init__("Attention", layout)

    def pattern(self, op, x, wq, bq, wk, bk, wv, bv):
        def projection(weight, bias):
            return _either(op.Add, op.MatMul(x, weight), bias)

        if self._layout == "packed":  # one projection to [B, S, 3D]: wq and bq stand for the packed ones
            return self.core(op, projection(wq, bq))
        return self.core(op, projection(wq, bq), projection(wk, bk), projection(wv, bv))

    def check(
        self, context, x, wq, bq, wk=None, bk=None, wv=None, bv=None, **bindings
    ) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if x.shape is None or x.shape.rank() != 3 or x.dtype != ir.DataType.FLOAT:
            return result.fail(f"The input '{x.name}' is not known to be a 3-D float32 [B, S, D] tensor.", x)
        if self._layout == "packed":
            return self._check_packed(context, x, wq, bq, bindings)
        arrays = []
        for name, tensor, rank in (
            ("Wq", wq, 2),
            ("bq", bq, 1),
            ("Wk", wk, 2),
            ("bk", bk, 1),
            ("Wv", wv, 2),
            ("bv", bv, 1),
        ):
            array = None if tensor.is_graph_input() else get_numpy_value(tensor)
            if array is None or array.ndim != rank or array.dtype != np.float32:
                return result.fail(
                    f"{name} '{tensor.name}' is not a constant float32 {rank}-D tensor.", tensor
                )
            arrays.append(array)
        weights, biases = arrays[0::2], arrays[1::2]
        if any(w.shape[0] != x.shape[2] for w in weights) or any(
            w.shape[1] != b.shape[0] for w, b in zip(weights, biases, strict=True)
        ):
            return result.fail("The projection weights and biases do not fit the input and each other.")
        # The projected values' shapes follow from x and the weights even before shape inference.
        query, key, value = (bindings[n].producer().inputs[0] for n in ("q_4d", "k_4d", "v_4d"))
        shapes = [(x.shape[0], x.shape[1], w.shape[1]) for w in weights]
        if (reason := self.core_refusal(context, query, key, value, bindings, shapes)) is not None:
            return result.fail(reason)
        self._packed_weight = np.concatenate(weights, axis=1)
        self._packed_bias = np.concatenate(biases)
        self._hidden_sizes = [w.shape[1] for w in weights]
        return result

    def _check_packed(self, context, x, weight, bias, bindings) -> pattern.MatchResult:
        result = pattern.MatchResult()
        arrays = []
        for name, tensor, rank in (("W", weight, 2), ("b", bias, 1)):
            array = None if tensor.is_graph_input() else get_numpy_value(tensor)
            if array is None or array.ndim != rank or array.dtype != np.float32:
                return result.fail(
                    f"{name} '{tensor.name}' is not a constant float32 {rank}-D tensor.", tensor
                )
            arrays.append(array)
        if arrays[0].shape[0] != x.shape[2] or arrays[0].shape[1] != arrays[1].shape[0]:
            return result.fail("The packed projection weight and bias do not fit the input and each other.")
        qkv = bindings["qkv_5d"].producer().inputs[0]
        shapes = [(x.shape[0], x.shape[1], arrays[0].shape[1])] * 3
        if (reason := self.core_refusal(context, qkv, None, None, bindings, shapes)) is not None:
            return result.fail(reason)
        self._packed_weight, self._packed_bias = (
            None,
            None,
        )  # already packed: the rewrite uses them as they are
        self._hidden_sizes = None
        return result

    def rewrite(self, op, x, wq, bq, **_):
        if self._packed_weight is None:
            weight, bias = wq, bq
        else:
            weight = op.initializer(ir.tensor(self._packed_weight), name=f"{wq.name}__qkv_weight")
            bias = op.initializer(ir.tensor(self._packed_bias), name=f"{wq.name}__qkv_bias")
        mask = self.attention_bias(op, x, x)
        inputs = [x, weight, bias] + ([None, None, mask] if mask is not None else [])
        sizes = {"qkv_hidden_sizes": self._hidden_sizes} if self._hidden_sizes else {}
        return op.Attention(
            *inputs, num_heads=self._num_heads, scale=self._scale, _domain="com.microsoft", **sizes
        )


def _variants(rule_class) -> list:
    return [rule_class.rule(layout) for layout in _LAYOUTS]


# The attention block's norms, rotary embedding and projections are settled before either attention rule.
_SETTLED_FIRST = (
    "layer_norm",
    "skip_layer_norm",
    "skip_rms_norm",
    "rotary",
    "matmul_add_gemm",
    "transpose_matmul_gemm",
)

RULES = [
    make_rule(
        "attention",
        "Self-attention with its Q/K/V projections (constant weights) → com.microsoft::Attention",
        ["com.microsoft::Attention"],
        _variants(AttentionFusion),
        alternatives="attention",
        opset_imports={"com.microsoft": 1},
        after=_SETTLED_FIRST,
    ),
    make_rule(
        "multihead_attention",
        "Scaled-dot-product attention over projected Q/K/V → com.microsoft::MultiHeadAttention",
        ["com.microsoft::MultiHeadAttention"],
        _variants(MultiHeadAttentionFusion),
        alternatives="attention",
        opset_imports={"com.microsoft": 1},
        after=_SETTLED_FIRST,
    ),
]
