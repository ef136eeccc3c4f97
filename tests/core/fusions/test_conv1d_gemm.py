"""conv1d_gemm: a 1-D Conv (or FusedConv) over a short sequence as one MatMul of its frames."""

from __future__ import annotations

import numpy as np
import pytest

from tests.core.fusions.harness import assert_fuses, assert_not_fused


def _floats(count: int, seed: int) -> str:
    return ", ".join(str(v) for v in np.random.default_rng(seed).standard_normal(count).round(3))


def conv1d_graph(*, channels=4, out_channels=5, length=9, kernel=3, attrs="", bias=True, op="Conv",
                 activation="", out_length=None, group=1, domain_import="") -> str:  # fmt: skip
    weight_channels = channels // group
    inputs = "x, w, b" if bias else "x, w"
    out_length = "?" if out_length is None else out_length
    return f"""
<ir_version: 9, opset_import: ["" : 17{domain_import}]>
agraph (float[2, {channels}, {length}] x) => (float[2, {out_channels}, {out_length}] y)
<float[{out_channels}, {weight_channels}, {kernel}] w = {{{_floats(out_channels * weight_channels * kernel, 1)}}},
 float[{out_channels}] b = {{{_floats(out_channels, 2)}}}>
{{
    y = {op} <{attrs}{activation}> ({inputs})
}}
""".replace("<>", "")


@pytest.mark.parametrize(
    ("attrs", "kernel", "length"),
    [
        ("pads: ints = [1, 1]", 3, 9),  # padded, stride 1: the Gather form
        ("strides: ints = [2], pads: ints = [1, 1]", 3, 9),  # stride not dividing the kernel: Gather
        ("dilations: ints = [2]", 3, 9),
        ("strides: ints = [4]", 8, 30),  # stride divides the kernel: blocks, trailing samples sliced off
        ("strides: ints = [2]", 4, 10),
        ("", 1, 6),  # a pointwise Conv
    ],
)
def test_conv1d_becomes_one_matmul(attrs, kernel, length):
    text = conv1d_graph(attrs=attrs, kernel=kernel, length=length)
    fused = assert_fuses("conv1d_gemm", text, _ops(text), atol=1e-5)
    assert "Conv" not in [node.op_type for node in fused.graph.node]


def _ops(text: str) -> list[str]:
    """The op list the rewrite makes for ``text`` (read back from its own output)."""
    from tests.core.fusions.harness import apply_rule, op_types, parse

    fused, _ = apply_rule("conv1d_gemm", parse(text))
    ops = op_types(fused)
    assert ops[0] == "Transpose" and ops[-1] == "Transpose" and "MatMul" in ops
    return ops


def test_block_form_for_a_stride_dividing_the_kernel():
    text = conv1d_graph(attrs="strides: ints = [4]", kernel=8, length=30, channels=1)
    fused = assert_fuses("conv1d_gemm", text, _ops(text))
    ops = [node.op_type for node in fused.graph.node if node.op_type != "Constant"]
    assert "Gather" not in ops and ops.count("Slice") == 3 and "Concat" in ops  # one trim + k/s = 2 shifts


def test_fused_conv_keeps_its_activation():
    text = conv1d_graph(op="FusedConv", attrs='activation: string = "LeakyRelu", activation_params: floats = [0.2], pads: ints = [1, 1]',
                        domain_import=', "com.microsoft" : 1').replace("FusedConv <", "FusedConv <").replace(
        "y = FusedConv", "y = com.microsoft.FusedConv")  # fmt: skip
    fused = assert_fuses("conv1d_gemm", text, _ops(text))
    assert "LeakyRelu" in [node.op_type for node in fused.graph.node]


def test_grouped_conv_is_left_alone():
    assert_not_fused("conv1d_gemm", conv1d_graph(group=2, attrs="group: int = 2"))


def test_2d_conv_is_left_alone():
    text = f"""
<ir_version: 9, opset_import: ["" : 17]>
agraph (float[1, 2, 5, 5] x) => (float[1, 3, 3, 3] y)
<float[3, 2, 3, 3] w = {{{_floats(54, 3)}}}>
{{
    y = Conv(x, w)
}}
"""
    assert_not_fused("conv1d_gemm", text)
