"""reduce_mean_gap: ReduceMean over the spatial axes, in one or two steps, into GlobalAveragePool."""

from __future__ import annotations

import pytest

from tests.core.fusions.harness import assert_fuses, assert_not_fused


def graph(
    body: str, output: str, *, opset: int = 17, x: str = "float[2, 3, 5, 4] x", extra_outputs: str = ""
) -> str:
    return f"""
<ir_version: 9, opset_import: ["" : {opset}]>
agraph ({x}, int64[1] dynamic_axes) => ({output} y{extra_outputs})
<int64[1] h = {{2}}, int64[1] w = {{3}}, int64[1] w_neg = {{-1}}, int64[2] hw = {{2, 3}}>
{{
    {body}
}}
"""


@pytest.mark.parametrize(
    ("body", "opset"),
    [
        ("r = ReduceMean <axes = [2]> (x)\n y = ReduceMean <axes = [3]> (r)", 17),
        ("r = ReduceMean <axes = [-1]> (x)\n y = ReduceMean <axes = [-2]> (r)", 17),
        ("y = ReduceMean <axes = [2, 3]> (x)", 17),
        ("y = ReduceMean <axes = [-1, -2], keepdims = 1> (x)", 13),
        ("r = ReduceMean(x, h)\n y = ReduceMean(r, w)", 18),
        ("r = ReduceMean(x, w_neg)\n y = ReduceMean(r, h)", 18),
        ("y = ReduceMean(x, hw)", 18),
    ],
)
def test_to_global_average_pool(body, opset):
    assert_fuses("reduce_mean_gap", graph(body, "float[2, 3, 1, 1]", opset=opset), ["GlobalAveragePool"])


@pytest.mark.parametrize(
    ("body", "opset"),
    [
        # keepdims=0: after dropping H, W is axis 2.
        ("r = ReduceMean <axes = [2], keepdims = 0> (x)\n y = ReduceMean <axes = [2], keepdims = 0> (r)", 17),
        ("y = ReduceMean <axes = [2, 3], keepdims = 0> (x)", 17),
        ("y = ReduceMean <keepdims = 0> (x, hw)", 18),
    ],
)
def test_keepdims_0_adds_flatten(body, opset):
    assert_fuses("reduce_mean_gap", graph(body, "float[2, 3]", opset=opset), ["GlobalAveragePool", "Flatten"])


def test_rank_5():
    text = graph("y = ReduceMean <axes = [2, 3, 4]> (x)", "float[2, 3, 1, 1, 1]", x="float[2, 3, 4, 5, 6] x")
    assert_fuses("reduce_mean_gap", text, ["GlobalAveragePool"])


def test_not_for_a_transformer_feature_mean():
    # LayerNorm's mean over D of a [B, S, D] tensor: GlobalAveragePool would compute it, but it is no pool.
    text = graph("y = ReduceMean <axes = [-1]> (x)", "float[2, 3, 1]", x="float[2, 3, 7] x")
    assert_not_fused("reduce_mean_gap", text)


@pytest.mark.parametrize(
    ("body", "output", "opset"),
    [
        ("y = ReduceMean <axes = [1, 2]> (x)", "float[2, 1, 1, 4]", 17),  # NHWC-style axes: wrong axes
        (
            "r = ReduceMean <axes = [2]> (x)\n y = ReduceMean <axes = [2]> (r)",
            "float[2, 3, 1, 4]",
            17,
        ),  # H twice
        ("y = ReduceMean <axes = [3]> (x)", "float[2, 3, 5, 1]", 17),  # W only
        ("y = ReduceMean(x, dynamic_axes)", "float[2, 3, 1, 1]", 18),  # axes not constant
        ("y = ReduceMean(x)", "float[1, 1, 1, 1]", 18),  # all axes
        (  # mixed keepdims
            "r = ReduceMean <axes = [2], keepdims = 1> (x)\n y = ReduceMean <axes = [3], keepdims = 0> (r)",
            "float[2, 3, 1]",
            17,
        ),
    ],
)
def test_not_fused(body, output, opset):
    assert_not_fused("reduce_mean_gap", graph(body, output, opset=opset))


def test_not_when_first_mean_is_used_elsewhere():
    # The pair cannot fuse, and the second ReduceMean alone reduces only W.
    text = graph(
        "r = ReduceMean <axes = [2]> (x)\n y = ReduceMean <axes = [3]> (r)\n z = Relu(r)",
        "float[2, 3, 1, 1]",
        extra_outputs=", float[2, 3, 1, 4] z",
    )
    assert_not_fused("reduce_mean_gap", text)


def test_not_for_integers():
    text = graph("y = ReduceMean <axes = [2, 3]> (x)", "int32[2, 3, 1, 1]", x="int32[2, 3, 5, 4] x")
    assert_not_fused("reduce_mean_gap", text)
