"""prelu: three spellings of a parametric ReLU into PRelu."""

from __future__ import annotations

import pytest

from tests.core.fusions.harness import assert_fuses, assert_not_fused


def graph(
    body: str, *, slope: str = "float[3, 1, 1] slope = {0.1, 0.2, -0.3}", extra_outputs: str = ""
) -> str:
    return f"""
<ir_version: 9, opset_import: ["" : 17]>
agraph (float[2, 3, 4, 4] x, float[3, 1, 1] free) => (float[2, 3, 4, 4] y{extra_outputs})
<{slope}, float zero = {{0.0}}, float one = {{1.0}}>
{{
    {body}
}}
"""


@pytest.mark.parametrize(
    "body",
    [
        "r = Relu(x)\n n = Neg(x)\n rn = Relu(n)\n s = Mul(slope, rn)\n y = Sub(r, s)",
        "r = Relu(x)\n n = Neg(x)\n rn = Relu(n)\n s = Mul(rn, slope)\n y = Sub(r, s)",
        "c = Less(x, zero)\n s = Mul(x, slope)\n y = Where(c, s, x)",
        "c = LessOrEqual(x, zero)\n s = Mul(slope, x)\n y = Where(c, s, x)",
        "c = Greater(x, zero)\n s = Mul(x, slope)\n y = Where(c, x, s)",
        "c = GreaterOrEqual(x, zero)\n s = Mul(x, slope)\n y = Where(c, x, s)",
        "p = Max(x, zero)\n n = Min(x, zero)\n s = Mul(slope, n)\n y = Add(p, s)",
        "p = Max(x, zero)\n n = Min(x, zero)\n s = Mul(n, slope)\n y = Add(s, p)",
    ],
)
def test_spellings_become_prelu(body):
    assert_fuses("prelu", graph(body), ["PRelu"])


def test_scalar_slope():
    text = graph("c = Less(x, zero)\n s = Mul(x, slope)\n y = Where(c, s, x)", slope="float slope = {0.25}")
    assert_fuses("prelu", text, ["PRelu"])


def test_slope_need_not_be_constant():
    assert_fuses("prelu", graph("c = Less(x, zero)\n s = Mul(x, free)\n y = Where(c, s, x)"), ["PRelu"])


def test_not_when_compared_against_non_zero():
    assert_not_fused("prelu", graph("c = Less(x, one)\n s = Mul(x, slope)\n y = Where(c, s, x)"))


def test_not_when_branches_are_swapped():
    assert_not_fused("prelu", graph("c = Less(x, zero)\n s = Mul(x, slope)\n y = Where(c, x, s)"))


def test_not_when_slope_widens_the_result():
    text = graph(
        "c = Less(x, zero)\n s = Mul(x, slope)\n y = Where(c, s, x)",
        slope="float[2, 1, 1, 1, 1] slope = {0.1, 0.2}",
    ).replace("(float[2, 3, 4, 4] y", "(float[2, 2, 3, 4, 4] y")
    assert_not_fused("prelu", text)


def test_not_when_intermediate_is_used_elsewhere():
    text = graph(
        "p = Max(x, zero)\n n = Min(x, zero)\n s = Mul(slope, n)\n y = Add(p, s)",
        extra_outputs=", float[2, 3, 4, 4] z",
    ).replace("y = Add(p, s)", "y = Add(p, s)\n z = Neg(n)")
    assert_not_fused("prelu", text)
