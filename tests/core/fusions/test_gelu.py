"""gelu_erf / gelu_tanh: GELU written out (each grouping and operand order exporters use) → one op."""

from __future__ import annotations

import pytest

from tests.core.fusions.harness import assert_fuses, assert_not_fused

_HEADER = """
<ir_version: 10, opset_import: ["" : 17]>
gelu ({dtype}[2, 16] x) => ({dtype}[2, 16] y{extra_out})
<{dtype} half = {{0.5}}, {dtype} one = {{1.0}}, {dtype} sqrt2 = {{1.4142135}}, {dtype} inv_sqrt2 = {{0.70710677}},
 {dtype} three = {{3.0}}, {dtype} kappa = {{0.044715}}, {dtype} beta = {{0.7978846}}>
"""


def graph(body: str, dtype: str = "float", extra_out: str = "") -> str:
    return _HEADER.format(dtype=dtype, extra_out=extra_out) + "{" + body + "}"


# The TorchScript exporter's F.gelu: x * (erf(x / sqrt2) + 1), then * 0.5.
ERF_TORCH_BODY = """
    s = Div (x, sqrt2)
    e = Erf (s)
    t = Add (e, one)
    xt = Mul (x, t)
    y = Mul (xt, half)
"""
ERF_TORCH = graph(ERF_TORCH_BODY)

# Hugging Face's python gelu: x * 0.5 * (1.0 + erf(x / sqrt2)), operands the other way round.
ERF_HF = graph("""
    hx = Mul (x, half)
    s = Div (x, sqrt2)
    e = Erf (s)
    t = Add (one, e)
    y = Mul (hx, t)
""")

# x * (0.5 * (1 + erf(x * 1/sqrt2))), the root's operands swapped.
ERF_INNER_HALF = graph("""
    s = Mul (inv_sqrt2, x)
    e = Erf (s)
    t = Add (e, one)
    ht = Mul (half, t)
    y = Mul (ht, x)
""")

# Hugging Face's gelu_new: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))).
TANH_HF = graph("""
    hx = Mul (half, x)
    c = Pow (x, three)
    kc = Mul (kappa, c)
    i = Add (x, kc)
    bi = Mul (beta, i)
    th = Tanh (bi)
    t = Add (one, th)
    y = Mul (hx, t)
""")

# x^3 as x * (x * x), grouped x * (t * 0.5).
TANH_CUBE_BY_MUL = graph("""
    xx = Mul (x, x)
    c = Mul (x, xx)
    kc = Mul (c, kappa)
    i = Add (kc, x)
    bi = Mul (i, beta)
    th = Tanh (bi)
    t = Add (th, one)
    th5 = Mul (t, half)
    y = Mul (x, th5)
""")


@pytest.mark.parametrize("text", [ERF_TORCH, ERF_HF, ERF_INNER_HALF], ids=["torch", "hf", "inner-half"])
def test_gelu_erf_fuses(text):
    assert_fuses("gelu_erf", text, ["Gelu"])


@pytest.mark.parametrize("text", [TANH_HF, TANH_CUBE_BY_MUL], ids=["hf-gelu-new", "cube-by-mul"])
def test_gelu_tanh_fuses(text):
    assert_fuses("gelu_tanh", text, ["FastGelu"])


def test_gelu_erf_leaves_the_tanh_form_alone():
    assert_not_fused("gelu_erf", TANH_HF)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(graph(ERF_TORCH_BODY, extra_out=", float[2, 16] e"), id="erf-used-outside"),
        pytest.param(ERF_TORCH.replace("half = {0.5}", "half = {0.4}"), id="not-one-half"),
        pytest.param(ERF_TORCH.replace("sqrt2 = {1.4142135}", "sqrt2 = {1.5}"), id="not-sqrt2"),
        pytest.param(graph(ERF_TORCH_BODY, dtype="double"), id="double"),
    ],
)
def test_gelu_erf_refuses(text):
    assert_not_fused("gelu_erf", text)


def test_gelu_tanh_refuses_another_coefficient():
    assert_not_fused("gelu_tanh", TANH_HF.replace("kappa = {0.044715}", "kappa = {0.05}"))
