"""transpose_matmul_gemm and transpose_matmul_fused: Transposes and scalar scales into the MatMul."""

from __future__ import annotations

import pytest

from tests.core.fusions.harness import assert_fuses, assert_not_fused


def graph(inputs: str, body: str, output: str, opset: int = 17) -> str:
    return f"""
<ir_version: 9, opset_import: ["" : {opset}]>
agraph ({inputs}) => ({output})
<float s = {{0.125}}, float two = {{2.0}}, float[1, 1, 1] wide = {{3.0}}, float[2] pair = {{1.0, 2.0}}>
{{
    {body}
}}
"""


def attributes(model) -> dict:
    return {a.name: (a.i if a.type == a.INT else a.f) for a in model.graph.node[0].attribute}


def test_rank2_transpose_a_to_gemm():
    text = graph(
        "float[4, 3] a, float[4, 5] b",
        "t = Transpose <perm = [1, 0]> (a)\n y = MatMul(t, b)",
        "float[3, 5] y",
    )
    fused = assert_fuses("transpose_matmul_gemm", text, ["Gemm"])
    assert attributes(fused) == {"transA": 1}


def test_rank2_transpose_b_without_perm_to_gemm():
    text = graph("float[3, 4] a, float[5, 4] b", "t = Transpose(b)\n y = MatMul(a, t)", "float[3, 5] y")
    assert attributes(assert_fuses("transpose_matmul_gemm", text, ["Gemm"])) == {"transB": 1}


def test_rank2_both_transposed_to_gemm():
    text = graph(
        "float[4, 3] a, float[5, 4] b",
        "ta = Transpose(a)\n tb = Transpose <perm = [1, 0]> (b)\n y = MatMul(ta, tb)",
        "float[3, 5] y",
    )
    assert attributes(assert_fuses("transpose_matmul_gemm", text, ["Gemm"])) == {"transA": 1, "transB": 1}


def test_gemm_not_for_rank_3():
    text = graph(
        "float[2, 4, 3] a, float[2, 4, 5] b",
        "t = Transpose <perm = [0, 2, 1]> (a)\n y = MatMul(t, b)",
        "float[2, 3, 5] y",
    )
    assert_not_fused("transpose_matmul_gemm", text)


def test_gemm_not_when_transpose_is_used_elsewhere():
    text = graph(
        "float[4, 3] a, float[4, 5] b",
        "t = Transpose(a)\n y = MatMul(t, b)\n z = Relu(t)",
        "float[3, 5] y, float[3, 4] z",
    )
    assert_not_fused("transpose_matmul_gemm", text)


def test_gemm_not_before_opset_11():
    text = graph(
        "float[4, 3] a, float[4, 5] b", "t = Transpose(a)\n y = MatMul(t, b)", "float[3, 5] y", opset=10
    )
    assert_not_fused("transpose_matmul_gemm", text)


def test_rank4_transpose_of_last_axes_to_fused_matmul():
    # The attention score product: Q · Kᵀ with K transposed over its last two axes.
    text = graph(
        "float[2, 3, 4, 8] q, float[2, 3, 4, 8] k",
        "kt = Transpose <perm = [0, 1, 3, 2]> (k)\n y = MatMul(q, kt)",
        "float[2, 3, 4, 4] y",
    )
    assert attributes(assert_fuses("transpose_matmul_fused", text, ["FusedMatMul"])) == {"transB": 1}


def test_rank4_transpose_and_scale_to_one_fused_matmul():
    text = graph(
        "float[2, 3, 4, 8] q, float[2, 3, 4, 8] k",
        "kt = Transpose <perm = [0, 1, 3, 2]> (k)\n m = MatMul(q, kt)\n y = Div(m, two)",
        "float[2, 3, 4, 4] y",
    )
    fused = assert_fuses("transpose_matmul_fused", text, ["FusedMatMul"])
    assert attributes(fused) == {"transB": 1, "alpha": 0.5}


def test_fused_not_for_other_permutations():
    text = graph(
        "float[3, 2, 4, 8] q, float[2, 3, 8, 4] k",
        "qt = Transpose <perm = [1, 0, 2, 3]> (q)\n y = MatMul(qt, k)",
        "float[2, 3, 4, 4] y",
    )
    assert_not_fused("transpose_matmul_fused", text)


def test_fused_leaves_rank2_transposes_to_gemm():
    text = graph("float[4, 3] a, float[4, 5] b", "t = Transpose(a)\n y = MatMul(t, b)", "float[3, 5] y")
    assert_not_fused("transpose_matmul_fused", text)


@pytest.mark.parametrize(
    ("body", "alpha"),
    [
        ("m = MatMul(a, b)\n y = Mul(m, s)", 0.125),
        ("m = MatMul(a, b)\n y = Mul(s, m)", 0.125),
        ("m = MatMul(a, b)\n y = Div(m, two)", 0.5),
        ("p = Mul(s, a)\n y = MatMul(p, b)", 0.125),
        ("p = Div(b, two)\n y = MatMul(a, p)", 0.5),
        ("p = Mul(a, two)\n m = MatMul(p, b)\n y = Div(m, s)", 16.0),
    ],
)
def test_scalar_scales_fold_into_alpha(body, alpha):
    text = graph("float[2, 3, 4] a, float[2, 4, 5] b", body, "float[2, 3, 5] y")
    fused = assert_fuses("transpose_matmul_fused", text, ["FusedMatMul"])
    assert attributes(fused)["alpha"] == pytest.approx(alpha)


@pytest.mark.parametrize(
    "body",
    [
        "m = MatMul(a, b)\n y = Mul(m, c)",  # not a constant
        "m = MatMul(a, b)\n y = Mul(m, pair)",  # not a scalar
        "m = MatMul(a, b)\n y = Mul(m, wide)",  # one element, but broadcasting would raise the rank
    ],
)
def test_scale_not_folded(body):
    text = graph(
        "float[3, 4] a, float[4, 2] b, float c",
        body,
        "float[3, 2] y" if "wide" not in body else "float[1, 3, 2] y",
    )
    assert_not_fused("transpose_matmul_fused", text)


def test_scale_not_folded_when_product_is_used_elsewhere():
    text = graph(
        "float[2, 3, 4] a, float[2, 4, 5] b",
        "m = MatMul(a, b)\n y = Mul(m, s)\n z = Relu(m)",
        "float[2, 3, 5] y, float[2, 3, 5] z",
    )
    assert_not_fused("transpose_matmul_fused", text)
