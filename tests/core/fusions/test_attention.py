"""attention / multihead_attention: the exporters' scaled-dot-product attention → ORT's fused attention.

Graphs as PyTorch writes them for BERT/GPT-2/ViT blocks after shape folding: 2 heads of size 4, hidden 8.
The pipeline infers shapes before fusing, and so do these tests (``fuse``) before the harness's checks.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.core.fusions.harness import apply_rule, op_types, parse, run

B, S, H, DH = 2, 4, 2, 4
D = H * DH

_SHAPES = f"int64[4] heads = {{0, 0, {H}, {DH}}}, int64[3] merged = {{0, 0, {D}}}"


def _weights(seed: int = 1) -> str:
    rng = np.random.default_rng(seed)
    parts = []
    for name in ("q", "k", "v"):
        w = ", ".join(f"{v:.4f}" for v in rng.standard_normal(D * D) * 0.5)
        b = ", ".join(f"{v:.4f}" for v in rng.standard_normal(D) * 0.1)
        parts.append(f"float[{D}, {D}] w{name} = {{{w}}}, float[{D}] b{name} = {{{b}}}")
    return ", ".join(parts)


KEY_COMPOSED = "kt = Transpose <perm = [0, 2, 3, 1]> (k4)"
KEY_TWO_STEP = "kh = Transpose <perm = [0, 2, 1, 3]> (k4)\n    kt = Transpose <perm = [0, 1, 3, 2]> (kh)"
SCALE_DIV = "qk = MatMul (qh, kt)\n    sc = Div (qk, sqrt_dh)"
SCALE_MUL = "qk = MatMul (qh, kt)\n    sc = Mul (qk, inv_sqrt_dh)"
# F.scaled_dot_product_attention's export: q and kᵀ each times sqrt(scale).
SCALE_SPLIT = "qs = Mul (qh, root_scale)\n    ks = Mul (kt, root_scale)\n    sc = MatMul (qs, ks)"


def core(
    key: str = KEY_COMPOSED,
    scale: str = SCALE_DIV,
    mask: str | None = "Add (sc, mask)",
    dropout: bool = False,
) -> str:
    masked = f"m = {mask}" if mask else "m = Identity (sc)"
    softmax_input = "m" if mask else "sc"
    lines = [
        "q4 = Reshape (q, heads)",
        "qh = Transpose <perm = [0, 2, 1, 3]> (q4)",
        "k4 = Reshape (k, heads)",
        key,
        "v4 = Reshape (v, heads)",
        "vh = Transpose <perm = [0, 2, 1, 3]> (v4)",
        scale,
        masked if mask else "",
        f"p = Softmax <axis = -1> ({softmax_input})",
        "pd = Dropout (p)" if dropout else "",
        f"c = MatMul ({'pd' if dropout else 'p'}, vh)",
        "ct = Transpose <perm = [0, 2, 1, 3]> (c)",
        "y = Reshape (ct, merged)",
    ]
    return "\n    ".join(line for line in lines if line)


def mha_graph(body: str, mask_shape: str = f"[{B}, 1, 1, {S}]", extra_out: str = "") -> str:
    mask_in = f", float{mask_shape} mask" if "mask" in body else ""
    return f"""
<ir_version: 10, opset_import: ["" : 17]>
mha (float[{B}, {S}, {D}] q, float[{B}, {S}, {D}] k, float[{B}, {S}, {D}] v{mask_in}) => (float[{B}, {S}, {D}] y{extra_out})
<{_SHAPES}, float sqrt_dh = {{{DH**0.5}}}, float inv_sqrt_dh = {{{DH**-0.5}}}, float root_scale = {{{DH**-0.25}}}>
{{
    {body}
}}"""


def block_graph(body: str, ln_before: bool = True, mask: bool = True) -> str:
    """A BERT-style block: LayerNorm, the three projections (bias first, as TorchScript writes it), attention."""
    norm = "xn = LayerNormalization <axis = -1> (x, gamma, beta)" if ln_before else "xn = Identity (x)"
    projections = "\n    ".join(
        f"{n}m = MatMul (xn, w{n})\n    {n} = Add (b{n}, {n}m)" for n in ("q", "k", "v")
    )
    mask_in = f", float[{B}, 1, 1, {S}] mask" if mask else ""
    return f"""
<ir_version: 10, opset_import: ["" : 17]>
block (float[{B}, {S}, {D}] x{mask_in}) => (float[{B}, {S}, {D}] y)
<{_SHAPES}, {_weights()}, float[{D}] gamma = {{{", ".join(["1.0"] * D)}}}, float[{D}] beta = {{{", ".join(["0.0"] * D)}}},
 float sqrt_dh = {{{DH**0.5}}}>
{{
    {norm}
    {projections}
    {body}
}}"""


def fuse(rule_name: str, text: str, expected_ops: list[str], *, count: int = 1) -> onnx.ModelProto:
    original = onnx.shape_inference.infer_shapes(parse(text))
    fused, fired = apply_rule(rule_name, original)
    assert fired == count, f"{rule_name} fired {fired} times"
    assert op_types(fused) == expected_ops
    onnx.checker.check_model(fused)
    rng = np.random.default_rng(0)
    feeds = {}
    for value in original.graph.input:
        shape = [d.dim_value or 3 for d in value.type.tensor_type.shape.dim]  # symbolic dims: 3
        if value.type.tensor_type.elem_type == onnx.TensorProto.BOOL:
            feeds[value.name] = rng.random(shape) < 0.7
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    if "mask" in feeds:  # an additive padding mask: 0 where attended, -10000 where masked
        feeds["mask"] = np.where(rng.random(feeds["mask"].shape) < 0.3, -10000.0, 0.0).astype(np.float32)
    for want, got in zip(run(original, feeds), run(fused, feeds), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)
    return fused


def refused(rule_name: str, text: str) -> None:
    original = onnx.shape_inference.infer_shapes(parse(text))
    fused, fired = apply_rule(rule_name, original)
    assert fired == 0, f"{rule_name} fired where it must not"
    assert op_types(fused) == op_types(original)


_EXPAND = ["Constant", "Expand"]  # the mask broadcast to [.., S, T], which the fused ops need


@pytest.mark.parametrize("key", [KEY_COMPOSED, KEY_TWO_STEP], ids=["key-0231", "key-heads-then-0132"])
@pytest.mark.parametrize("scale", [SCALE_DIV, SCALE_MUL, SCALE_SPLIT], ids=["div", "mul", "split-sqrt"])
def test_mha_fuses_bert_mask(key, scale):
    fused = fuse("multihead_attention", mha_graph(core(key, scale)), [*_EXPAND, "MultiHeadAttention"])
    attributes = {a.name: onnx.helper.get_attribute_value(a) for a in fused.graph.node[-1].attribute}
    assert attributes["num_heads"] == H
    assert attributes["scale"] == pytest.approx(DH**-0.5, rel=1e-6)


def test_mha_fuses_without_mask_with_dropout():
    fuse("multihead_attention", mha_graph(core(mask=None, dropout=True)), ["MultiHeadAttention"])


def test_mha_passes_a_full_mask_as_is_and_takes_it_on_the_left():
    body = core(mask="Add (mask, sc)")
    fuse("multihead_attention", mha_graph(body, mask_shape=f"[{B}, 1, {S}, {S}]"), ["MultiHeadAttention"])


def test_mha_expands_a_causal_2d_mask():
    fuse("multihead_attention", mha_graph(core(), mask_shape=f"[{S}, {S}]"), [*_EXPAND, "MultiHeadAttention"])


def test_mha_derives_the_head_count_left_to_reshape():
    text = mha_graph(core()).replace(f"heads = {{0, 0, {H}, {DH}}}", f"heads = {{0, 0, -1, {DH}}}")
    fuse("multihead_attention", text, [*_EXPAND, "MultiHeadAttention"])


# The TorchScript exporter with dynamic batch and sequence: every Reshape shape is computed from Shape
# nodes on the tensors inside the attention (the merge reads the context's own shape).
DYNAMIC = """
    qs = Shape (q)
    b = Gather <axis = 0> (qs, i0)
    s = Gather <axis = 0> (qs, i1)
    d = Gather <axis = 0> (qs, i2)
    dh = Div (d, nh)
    bu = Unsqueeze (b, a0)
    su = Unsqueeze (s, a0)
    dhu = Unsqueeze (dh, a0)
    heads = Concat <axis = 0> (bu, su, nh1, dhu)
    BODY
    cs = Shape (c)
    cb = Gather <axis = 0> (cs, i0)
    ch = Gather <axis = 0> (cs, i1)
    cl = Gather <axis = 0> (cs, i2)
    cd = Gather <axis = 0> (cs, i3)
    hd = Mul (ch, cd)
    cbu = Unsqueeze (cb, a0)
    clu = Unsqueeze (cl, a0)
    hdu = Unsqueeze (hd, a0)
    merged = Concat <axis = 0> (cbu, clu, hdu)
"""


def test_mha_reads_shapes_computed_from_shape_nodes():
    body = (
        DYNAMIC.replace("BODY", core().replace("\n    y = Reshape (ct, merged)", ""))
        + "    y = Reshape (ct, merged)"
    )
    text = mha_graph(body).replace(
        f"{_SHAPES}, ",
        f"int64 i0 = {{0}}, int64 i1 = {{1}}, int64 i2 = {{2}}, int64 i3 = {{3}}, int64 nh = {{{H}}}, int64[1] nh1 = {{{H}}}, int64[1] a0 = {{0}}, ",
    )
    text = text.replace(f"[{B}, {S}, {D}]", f"[batch, seq, {D}]").replace(
        f"[{B}, 1, 1, {S}]", "[batch, 1, 1, seq]"
    )
    fused = fuse(
        "multihead_attention", text, ["Constant", "Shape", "Shape", "Concat", "Expand", "MultiHeadAttention"]
    )
    assert "Reshape" not in op_types(fused)


def test_mha_refuses_a_context_shape_used_elsewhere():
    body = (
        DYNAMIC.replace("BODY", core().replace("\n    y = Reshape (ct, merged)", ""))
        + "    y = Reshape (ct, merged)"
    )
    text = mha_graph(body, extra_out=", int64[4] cs").replace(
        f"{_SHAPES}, ",
        f"int64 i0 = {{0}}, int64 i1 = {{1}}, int64 i2 = {{2}}, int64 i3 = {{3}}, int64 nh = {{{H}}}, int64[1] nh1 = {{{H}}}, int64[1] a0 = {{0}}, ",
    )
    refused("multihead_attention", text)


def test_mha_with_symbolic_batch_and_sequence_expands_through_shapes():
    text = (
        mha_graph(core())
        .replace(f"[{B}, {S}, {D}]", f"[batch, seq, {D}]")
        .replace(f"[{B}, 1, 1, {S}]", "[batch, 1, 1, seq]")
    )
    fuse(
        "multihead_attention", text, ["Constant", "Shape", "Shape", "Concat", "Expand", "MultiHeadAttention"]
    )


_LOWEST = "-3.4028234663852886e38"
_CAUSAL = ", ".join("1" if j <= i else "0" for i in range(S) for j in range(S))
# GPT-2 (eager attention): scores / sqrt(Dh), then Where(causal, scores, lowest float), then + padding mask.
GPT2_CAUSAL = core(mask=None).replace(
    "sc = Div (qk, sqrt_dh)", "sd = Div (qk, sqrt_dh)\n    sc = Where (causal, sd, lowest)"
)


def gpt2_graph(body: str) -> str:
    return mha_graph(body).replace(
        "float sqrt_dh",
        f"bool[1, 1, {S}, {S}] causal = {{{_CAUSAL}}}, float lowest = {{{_LOWEST}}}, float sqrt_dh",
    )


def test_mha_turns_gpt2_causal_where_into_a_bias():
    fused = fuse("multihead_attention", gpt2_graph(GPT2_CAUSAL), ["MultiHeadAttention"])
    assert any(init.name.endswith("__additive_bias") for init in fused.graph.initializer)


def test_mha_adds_gpt2_causal_and_padding_masks():
    body = GPT2_CAUSAL.replace(
        "p = Softmax <axis = -1> (sc)", "m = Add (sc, mask)\n    p = Softmax <axis = -1> (m)"
    )
    fuse("multihead_attention", gpt2_graph(body), ["Add", "MultiHeadAttention"])


def test_mha_turns_a_computed_causal_mask_into_a_bias_at_run_time():
    """With dynamic shapes the causal mask is sliced out of a buffer at run time: one Where makes the bias."""
    text = gpt2_graph(GPT2_CAUSAL).replace(f"bool[1, 1, {S}, {S}] causal = {{{_CAUSAL}}}, ", "")
    text = text.replace("(float[2, 4, 8] q", f"(bool[1, 1, {S}, {S}] causal, float[2, 4, 8] q")
    fuse("multihead_attention", text, ["Constant", "Constant", "Where", "MultiHeadAttention"])


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(mha_graph(core()).replace("axis = -1", "axis = 2"), id="softmax-not-over-keys"),
        pytest.param(mha_graph(core(), extra_out=f", float[{B}, {H}, {S}, {S}] p"), id="probs-used-outside"),
        pytest.param(
            mha_graph(core())
            .replace("float sqrt_dh = {2.0}, ", "")
            .replace("(float[2, 4, 8] q", "(float sqrt_dh, float[2, 4, 8] q"),
            id="scale-not-constant",
        ),
        pytest.param(
            mha_graph(core())
            .replace(f"int64[4] heads = {{0, 0, {H}, {DH}}}, ", "")
            .replace("(float[2, 4, 8] q", "(int64[4] heads, float[2, 4, 8] q"),
            id="heads-shape-unknown",
        ),
    ],
)
def test_mha_refuses(text):
    refused("multihead_attention", text)


@pytest.mark.parametrize("key", [KEY_COMPOSED, KEY_TWO_STEP], ids=["key-0231", "key-heads-then-0132"])
def test_attention_fuses_bert_block(key):
    fused = fuse("attention", block_graph(core(key)), ["LayerNormalization", *_EXPAND, "Attention"])
    attention = fused.graph.node[-1]
    assert {a.name: onnx.helper.get_attribute_value(a) for a in attention.attribute}["qkv_hidden_sizes"] == [
        D,
        D,
        D,
    ]


def test_attention_fuses_without_mask_or_layer_norm():
    fuse("attention", block_graph(core(mask=None), ln_before=False, mask=False), ["Identity", "Attention"])


def test_attention_refuses_a_projection_used_elsewhere():
    text = block_graph(core()).replace(
        f"=> (float[{B}, {S}, {D}] y)", f"=> (float[{B}, {S}, {D}] y, float[{B}, {S}, {D}] k)"
    )
    refused("attention", text)


def test_attention_refuses_weights_that_are_inputs():
    text = block_graph(core()).replace(
        f"float[{B}, 1, 1, {S}] mask)", f"float[{B}, 1, 1, {S}] mask, float[{D}, {D}] wk)"
    )
    text = (
        text.split(f"float[{D}, {D}] wk = ")[0] + text.split(f"float[{D}, {D}] wk = ")[1].split("}, ", 1)[1]
    )
    refused("attention", text)


# timm's ViT attention: one projection to [B, S, 3*H*Dh], reshaped to [B, S, 3, H, Dh], heads picked by Gather.
PACKED = """
    qkv5 = Reshape (qkv, heads5)
    t = Transpose <perm = [2, 0, 3, 1, 4]> (qkv5)
    qh = Gather <axis = 0> (t, i0)
    kh = Gather <axis = 0> (t, i1)
    vh = Gather <axis = 0> (t, i2)
    qs = Mul (qh, inv_sqrt_dh)
    kt = Transpose <perm = [0, 1, 3, 2]> (kh)
    a = MatMul (qs, kt)
    p = Softmax <axis = -1> (a)
    c = MatMul (p, vh)
    ct = Transpose <perm = [0, 2, 1, 3]> (c)
    y = Reshape (ct, merged)
"""
_PACKED_CONSTANTS = (
    f"int64[5] heads5 = {{0, 0, 3, {H}, {DH}}}, int64[3] merged = {{0, 0, {D}}}, int64 i0 = {{0}}, "
    f"int64 i1 = {{1}}, int64 i2 = {{2}}, float inv_sqrt_dh = {{{DH**-0.5}}}"
)


def test_mha_fuses_timm_packed_qkv():
    text = f"""
<ir_version: 10, opset_import: ["" : 17]>
vit (float[{B}, {S}, {3 * D}] qkv) => (float[{B}, {S}, {D}] y)
<{_PACKED_CONSTANTS}>
{{{PACKED}}}"""
    fuse("multihead_attention", text, ["Constant", "Split", "MultiHeadAttention"])


def test_attention_fuses_timm_packed_projection_as_is():
    rng = np.random.default_rng(2)
    weight = ", ".join(f"{v:.4f}" for v in rng.standard_normal(D * 3 * D) * 0.5)
    bias = ", ".join(f"{v:.4f}" for v in rng.standard_normal(3 * D) * 0.1)
    text = f"""
<ir_version: 10, opset_import: ["" : 17]>
vit (float[{B}, {S}, {D}] x) => (float[{B}, {S}, {D}] y)
<{_PACKED_CONSTANTS}, float[{D}, {3 * D}] w = {{{weight}}}, float[{3 * D}] b = {{{bias}}}>
{{
    m = MatMul (x, w)
    qkv = Add (b, m)
    {PACKED}
}}"""
    fused = fuse("attention", text, ["Attention"])
    assert list(fused.graph.node[0].input) == ["x", "w", "b"]


def test_mha_refuses_a_packed_reshape_that_is_not_q_k_v_first():
    text = f"""
<ir_version: 10, opset_import: ["" : 17]>
vit (float[{B}, {S}, {3 * D}] qkv) => (float[{B}, {S}, {D}] y)
<{_PACKED_CONSTANTS.replace(f"heads5 = {{0, 0, 3, {H}, {DH}}}", f"heads5 = {{0, 0, {H}, 3, {DH}}}")}>
{{{PACKED}}}"""
    refused("multihead_attention", text)
