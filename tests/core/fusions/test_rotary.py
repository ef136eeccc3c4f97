"""rotary: x * cos + rotate_half(x) * sin over gathered cache rows → com.microsoft::RotaryEmbedding."""

from __future__ import annotations

import numpy as np
import pytest

from tests.core.fusions.harness import assert_fuses, assert_not_fused

B, H, S, DH, P = 2, 3, 5, 8, 16


def _caches(duplicated: bool = True) -> str:
    inv_freq = 1.0 / (10000 ** (np.arange(0, DH, 2) / DH))
    freqs = np.arange(P)[:, None] * inv_freq[None, :]
    emb = (
        np.concatenate([freqs, freqs], axis=-1) if duplicated else np.concatenate([freqs, 2 * freqs], axis=-1)
    )
    text = []
    for name, table in (("cos_cache", np.cos(emb)), ("sin_cache", np.sin(emb))):
        text.append(f"float[{P}, {DH}] {name} = {{{', '.join(f'{v:.7f}' for v in table.reshape(-1))}}}")
    return ", ".join(text)


# HF LLaMA's apply_rotary_pos_emb as TorchScript writes it (after shape folding).
BODY = """
    cr = Gather (cos_cache, pos)
    cos = Unsqueeze (cr, one)
    sr = Gather (sin_cache, pos)
    sin = Unsqueeze (sr, one)
    x1 = Slice (x, zero, half, last)
    x2 = Slice (x, half, big, last)
    nx2 = Neg (x2)
    rot = Concat <axis = -1> (nx2, x1)
    xc = Mul (x, cos)
    rs = Mul (rot, sin)
    y = Add (xc, rs)
"""


def graph(body: str = BODY, ids: str = f"[{B}, {S}]", duplicated: bool = True) -> str:
    return f"""
<ir_version: 10, opset_import: ["" : 17]>
rope (float[{B}, {H}, {S}, {DH}] x, int64{ids} pos) => (float[{B}, {H}, {S}, {DH}] y)
<{_caches(duplicated)}, int64[1] one = {{1}}, int64[1] zero = {{0}}, int64[1] half = {{{DH // 2}}},
 int64[1] big = {{9223372036854775807}}, int64[1] last = {{-1}}>
{{{body}}}"""


def _feeds(ids_batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    positions = np.stack([rng.permutation(P)[:S] for _ in range(ids_batch)]).astype(np.int64)
    return {"x": rng.standard_normal((B, H, S, DH)).astype(np.float32), "pos": positions}


def test_fuses_llama_rotary():
    assert_fuses("rotary", graph(), ["RotaryEmbedding"], feeds=_feeds(B))


def test_fuses_swapped_operands():
    body = BODY.replace("Mul (x, cos)", "Mul (cos, x)").replace("Mul (rot, sin)", "Mul (sin, rot)")
    body = body.replace("Add (xc, rs)", "Add (rs, xc)")
    assert_fuses("rotary", graph(body), ["RotaryEmbedding"], feeds=_feeds(B))


def test_expands_position_ids_shared_by_the_batch():
    fused = assert_fuses(
        "rotary", graph(ids=f"[1, {S}]"), ["Constant", "Expand", "RotaryEmbedding"], feeds=_feeds(1)
    )
    assert sum(init.name.endswith("__half") for init in fused.graph.initializer) == 2


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(graph(duplicated=False), id="cache-halves-differ"),
        pytest.param(graph().replace(f"half = {{{DH // 2}}}", "half = {2}"), id="not-halves"),
        pytest.param(graph(BODY.replace("Neg (x2)", "Identity (x2)")), id="no-negation"),
        pytest.param(
            graph(BODY.replace("Unsqueeze (cr, one)", "Unsqueeze (cr, zero)")), id="wrong-unsqueeze-axis"
        ),
    ],
)
def test_refuses(text):
    assert_not_fused("rotary", text)


# The LLaMA fixture's form with dynamic shapes: cos = cos_cached[:seq][None, None] (positions 0..S-1) and the
# halves' bounds computed from x's shape.
SLICED = """
    xs = Shape (x)
    seq = Gather <axis = 0> (xs, two)
    seq1 = Unsqueeze (seq, zero)
    cr = Slice (cos_cache, zero, seq1, zero)
    cos = Unsqueeze (cr, zero_one)
    sr = Slice (sin_cache, zero, seq1, zero)
    sin = Unsqueeze (sr, zero_one)
    dh = Gather <axis = 0> (xs, three)
    h = Div (dh, two)
    h1 = Unsqueeze (h, zero)
    x1 = Slice (x, zero, h1, last)
    x2 = Slice (x, h1, big, last)
    nx2 = Neg (x2)
    rot = Concat <axis = -1> (nx2, x1)
    xc = Mul (x, cos)
    rs = Mul (rot, sin)
    y = Add (xc, rs)
"""


def test_fuses_cache_rows_sliced_to_the_sequence():
    text = graph(SLICED).replace(
        "int64[1] one = {1},", "int64 two = {2}, int64 three = {3}, int64[2] zero_one = {0, 1},"
    )
    text = text.replace(f", int64[{B}, {S}] pos", "")
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((B, H, S, DH)).astype(np.float32)}
    fused = assert_fuses("rotary", text, ["Constant", "RotaryEmbedding"], feeds=feeds)
    assert [a.ints for a in fused.graph.node[0].attribute] == [[0]]  # positions from 0
