"""silu: x * Sigmoid(x) (either order, optionally a scaled Sigmoid argument) → com.microsoft::QuickGelu."""

from __future__ import annotations

import pytest

from tests.core.fusions.harness import assert_fuses, assert_not_fused


def graph(body: str, dtype: str = "float", extra_out: str = "", extra_in: str = "") -> str:
    return f"""
<ir_version: 10, opset_import: ["" : 17]>
silu ({dtype}[2, 3, 16] x{extra_in}) => ({dtype}[2, 3, 16] y{extra_out})
<{dtype} alpha = {{1.702}}>
{{{body}}}"""


@pytest.mark.parametrize(
    "body",
    [
        "s = Sigmoid (x)\n y = Mul (x, s)",
        "s = Sigmoid (x)\n y = Mul (s, x)",
        "ax = Mul (x, alpha)\n s = Sigmoid (ax)\n y = Mul (x, s)",
        "ax = Mul (alpha, x)\n s = Sigmoid (ax)\n y = Mul (s, x)",
    ],
    ids=["x-sigmoid", "sigmoid-x", "scaled", "scaled-swapped"],
)
def test_fuses(body):
    fused = assert_fuses("silu", graph(body), ["QuickGelu"])
    alpha = next(a.f for a in fused.graph.node[0].attribute if a.name == "alpha")
    assert alpha == pytest.approx(1.702 if "alpha" in body else 1.0)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            graph("s = Sigmoid (x)\n y = Mul (x, s)", extra_out=", float[2, 3, 16] s"), id="gate-used-outside"
        ),
        pytest.param(
            graph("s = Sigmoid (x)\n y = Mul (z, s)", extra_in=", float[2, 3, 16] z"),
            id="gates-another-tensor",
        ),
        pytest.param(
            graph("ax = Mul (x, a)\n s = Sigmoid (ax)\n y = Mul (x, s)", extra_in=", float a"),
            id="alpha-not-constant",
        ),
        pytest.param(graph("s = Sigmoid (x)\n y = Mul (x, s)", dtype="double"), id="double"),
    ],
)
def test_refuses(text):
    assert_not_fused("silu", text)
