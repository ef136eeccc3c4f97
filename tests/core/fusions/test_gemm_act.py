"""gemm_act: Gemm + activation into com.microsoft::FusedGemm."""

from __future__ import annotations

import pytest

from tests.core.fusions.harness import assert_fuses, assert_not_fused


def gemm_graph(body: str, *, dtype: str = "float", extra_outputs: str = "", opset: int = 17) -> str:
    return f"""
<ir_version: 9, opset_import: ["" : {opset}]>
agraph ({dtype}[3, 4] a, {dtype}[5, 4] b, {dtype}[5] c) => ({dtype}[3, 5] y{extra_outputs})
{{
    {body}
}}
"""


GEMM = "g = Gemm <transB: int = 1, alpha: float = 0.5, beta: float = 2.0> (a, b, c)"


@pytest.mark.parametrize(
    "activation",
    [
        "Relu(g)",
        "Sigmoid(g)",
        "Tanh(g)",
        "LeakyRelu <alpha: float = 0.2> (g)",
        "LeakyRelu(g)",
        "HardSigmoid <alpha: float = 0.3, beta: float = 0.4> (g)",
    ],
)
def test_gemm_activation(activation):
    fused = assert_fuses("gemm_act", gemm_graph(f"{GEMM}\n y = {activation}"), ["FusedGemm"])
    attributes = {a.name for a in fused.graph.node[0].attribute}
    assert {"transB", "alpha", "beta", "activation"} <= attributes


def test_not_when_gemm_output_is_used_elsewhere():
    text = gemm_graph(f"{GEMM}\n y = Relu(g)\n z = Neg(g)", extra_outputs=", float[3, 5] z")
    assert_not_fused("gemm_act", text)


def test_not_for_clip_which_ort_fused_gemm_lacks():
    assert_not_fused("gemm_act", gemm_graph(f"{GEMM}\n y = Clip <min: float = 0.0> (g)", opset=10))


def test_not_for_double():
    assert_not_fused("gemm_act", gemm_graph(f"{GEMM}\n y = Relu(g)", dtype="double"))


def test_gemm_without_c():
    assert_fuses("gemm_act", gemm_graph("g = Gemm <transB: int = 1> (a, b)\n y = Relu(g)"), ["FusedGemm"])
