"""matmul_add_gemm: rank-2 MatMul + Add (Transposes folded) into Gemm."""

from __future__ import annotations

import onnx_ir as ir
import pytest

from tests.core.fusions.harness import assert_fuses, assert_not_fused


def graph(inputs: str, body: str, output: str = "float[3, 5] y") -> str:
    return f"""
<ir_version: 9, opset_import: ["" : 17]>
agraph ({inputs}) => ({output})
{{
    {body}
}}
"""


@pytest.mark.parametrize("c_shape", ["[5]", "[1, 5]", "[3, 5]", "[3, 1]", "[1]"])
def test_matmul_add(c_shape):
    text = graph(f"float[3, 4] a, float[4, 5] b, float{c_shape} c", "m = MatMul(a, b)\n y = Add(m, c)")
    assert_fuses("matmul_add_gemm", text, ["Gemm"])


def test_add_with_operands_swapped():
    text = graph("float[3, 4] a, float[4, 5] b, float[5] c", "m = MatMul(a, b)\n y = Add(c, m)")
    assert_fuses("matmul_add_gemm", text, ["Gemm"])


def test_transposes_fold_into_gemm_attributes():
    text = graph(
        "float[4, 3] a, float[5, 4] b, float[5] c",
        "ta = Transpose <perm = [1, 0]> (a)\n tb = Transpose <perm = [1, 0]> (b)\n"
        " m = MatMul(ta, tb)\n y = Add(m, c)",
    )
    fused = assert_fuses("matmul_add_gemm", text, ["Gemm"])
    assert {a.name: a.i for a in fused.graph.node[0].attribute} == {"transA": 1, "transB": 1}


def test_not_for_rank_3_activation():
    # A transformer's linear layer: a [B, S, K] activation stays MatMul + Add (Gemm is rank 2 only).
    text = graph(
        "float[2, 3, 4] a, float[4, 5] b, float[5] c", "m = MatMul(a, b)\n y = Add(m, c)", "float[2, 3, 5] y"
    )
    assert_not_fused("matmul_add_gemm", text)


def test_not_when_addend_widens_the_result():
    text = graph(
        "float[3, 4] a, float[4, 5] b, float[2, 3, 5] c",
        "m = MatMul(a, b)\n y = Add(m, c)",
        "float[2, 3, 5] y",
    )
    assert_not_fused("matmul_add_gemm", text)


def test_not_when_matmul_output_is_used_elsewhere():
    text = graph(
        "float[3, 4] a, float[4, 5] b, float[5] c",
        "m = MatMul(a, b)\n y = Add(m, c)\n z = Relu(m)",
        "float[3, 5] y, float[3, 5] z",
    )
    assert_not_fused("matmul_add_gemm", text)


def test_not_for_integers():
    text = graph(
        "int32[3, 4] a, int32[4, 5] b, int32[5] c", "m = MatMul(a, b)\n y = Add(m, c)", "int32[3, 5] y"
    )
    assert_not_fused("matmul_add_gemm", text)


def test_rank_3_refusal_says_why():
    from flexdsa_core.fusions.walk import ReasonTracer
    from tests.core.fusions.harness import parse, rule

    text = graph(
        "float[2, 3, 4] a, float[4, 5] b, float[5] c", "m = MatMul(a, b)\n y = Add(m, c)", "float[2, 3, 5] y"
    )
    model = ir.serde.deserialize_model(parse(text))
    tracer = ReasonTracer()
    assert rule("matmul_add_gemm").apply(model, tracer=tracer) == 0
    assert "MatMul input a 'a' has rank 3; Gemm takes rank 2 only." in tracer.reasons
