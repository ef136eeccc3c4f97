"""algebraic_simplification: chains collapse; refused where the numerics would move too far."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.core.passes.helpers import (
    apply_pass,
    assert_rewrites,
    assert_same_outputs,
    assert_unchanged,
    parse,
)

HEAD = '<ir_version: 8, opset_import: ["" : 17]>\n'
NAME = "algebraic_simplification"


def test_transposes_merge():
    optimized = assert_rewrites(
        NAME,
        HEAD + "g (float[2,3,4] x) => (float[4,3,2] y) { t = Transpose<perm = [1, 0, 2]>(x)\n"
        "y = Transpose<perm = [2, 0, 1]>(t) }",
        ["Transpose"],
    )
    assert list(optimized.graph.node[0].attribute[0].ints) == [2, 1, 0]


def test_reshapes_merge():
    assert_rewrites(
        NAME,
        HEAD + "g (float[2,3,4] x) => (float[4,6] y) { s1 = Constant<value = int64[2] {6, 4}>()\n"
        "r = Reshape(x, s1)\n s2 = Constant<value = int64[2] {4, 6}>()\n y = Reshape(r, s2) }",
        ["Constant", "Constant", "Reshape"],
    )


def test_lossless_cast_chain_merges():
    # float16 → float32 is exact, so the second cast sees the same number.
    assert_rewrites(
        NAME,
        HEAD + "g (float16[2,3] x) => (double[2,3] y) { c = Cast<to = 1>(x)\n y = Cast<to = 11>(c) }",
        ["Cast"],
    )


def test_lossy_cast_chain_kept():
    # float32 → float16 rounds; float32 → float16 → float32 is not float32 → float32.
    assert_unchanged(
        NAME, HEAD + "g (float[2,3] x) => (float[2,3] y) { c = Cast<to = 10>(x)\n y = Cast<to = 1>(c) }"
    )
    # float → int32 truncates: Cast(Cast(x, int32), float) is floor-toward-zero, not x.
    assert_unchanged(
        NAME, HEAD + "g (float[2,3] x) => (float[2,3] y) { c = Cast<to = 6>(x)\n y = Cast<to = 1>(c) }"
    )


def test_neg_neg_removed_keeping_the_output_name():
    optimized = assert_rewrites(
        NAME, HEAD + "g (float[2,3] x) => (float[2,3] y) { a = Relu(x)\n n = Neg(a)\n y = Neg(n) }", ["Relu"]
    )
    assert optimized.graph.node[0].output[0] == "y"


@pytest.mark.parametrize("order", ["Mul(x, a)", "Mul(a, x)"])
def test_constant_mul_chain_folds(order):
    assert_rewrites(
        NAME,
        HEAD + "g (float[2,3] x) => (float[2,3] y) { a = Constant<value = float[3] {2, 3, 4}>()\n"
        f"b = Constant<value = float {{0.5}}>()\n m = {order}\n y = Mul(m, b) }}",
        ["Constant", "Constant", "Constant", "Mul"],
        rtol=2e-7,
    )


def test_constant_add_chain_folds():
    assert_rewrites(
        NAME,
        HEAD + "g (int64[2,3] x) => (int64[2,3] y) { a = Constant<value = int64 {5}>()\n"
        "b = Constant<value = int64[3] {1, 2, 3}>()\n m = Add(x, a)\n y = Add(m, b) }",
        ["Constant", "Constant", "Constant", "Add"],
    )


def test_cancelling_add_chain_kept():
    # (x + 1e8) - 1e8 rounds x away in float32; x + 0 would not: moving the rounding changes results.
    assert_unchanged(
        NAME,
        HEAD + "g (float[2,3] x) => (float[2,3] y) { a = Constant<value = float {1e8}>()\n"
        "b = Constant<value = float {-1e8}>()\n m = Add(x, a)\n y = Add(m, b) }",
    )


def test_overflowing_mul_chain_kept():
    assert_unchanged(
        NAME,
        HEAD + "g (float[2,3] x) => (float[2,3] y) { a = Constant<value = float {1e30}>()\n"
        "b = Constant<value = float {1e30}>()\n m = Mul(x, a)\n y = Mul(m, b) }",
    )


def test_mul_chain_with_shared_intermediate_kept():
    assert_unchanged(
        NAME,
        HEAD + "g (float[2,3] x) => (float[2,3] y, float[2,3] m) { a = Constant<value = float {2}>()\n"
        "b = Constant<value = float {3}>()\n m = Mul(x, a)\n y = Mul(m, b) }",
    )


def test_sub_constant_becomes_add_exactly():
    assert_rewrites(
        NAME,
        HEAD + "g (float[2,3] x) => (float[2,3] y) { c = Constant<value = float[3] {1.5, -2, 0.1}>()\n"
        "y = Sub(x, c) }",
        ["Constant", "Constant", "Add"],
    )


def test_sub_of_unsigned_kept():
    assert_unchanged(
        NAME,
        HEAD + "g (uint8[2,3] x) => (uint8[2,3] y) { c = Constant<value = uint8 {1}>()\n y = Sub(x, c) }",
    )


def test_div_by_power_of_two_becomes_exact_mul_even_in_float16():
    assert_rewrites(
        NAME,
        # ONNX text spells float16 constants by their bits: 17408 = 0x4400 = 4.0.
        HEAD
        + "g (float16[2,3] x) => (float16[2,3] y) { c = Constant<value = float16 {17408}>()\n y = Div(x, c) }",
        ["Constant", "Constant", "Mul"],
    )


def test_div_by_non_power_of_two_float32_within_rounding():
    assert_rewrites(
        NAME,
        HEAD + "g (float[2,3] x) => (float[2,3] y) { c = Constant<value = float {3}>()\n y = Div(x, c) }",
        ["Constant", "Constant", "Mul"],
        rtol=2.5e-7,
    )


def test_div_kept_for_integers_float16_inexact_and_zero():
    for text in [
        "g (int32[2,3] x) => (int32[2,3] y) { c = Constant<value = int32 {3}>()\n y = Div(x, c) }",
        "g (float16[2,3] x) => (float16[2,3] y) { c = Constant<value = float16 {16896}>()\n y = Div(x, c) }",  # 3.0
        "g (float[2,3] x) => (float[2,3] y) { c = Constant<value = float[3] {1, 0, 2}>()\n y = Div(x, c) }",
    ]:
        original = parse(HEAD + text)
        optimized, modified = apply_pass(NAME, original)
        assert not modified
        assert [n.op_type for n in optimized.graph.node] == ["Constant", "Div"]
        onnx.checker.check_model(optimized)
        feeds = {"x": (np.arange(6).reshape(2, 3) + 1).astype(np.float32 if "float[" in text else np.int32)}
        if "float16" in text:
            feeds = {"x": feeds["x"].astype(np.float16)}
        assert_same_outputs(original, optimized, feeds=feeds)


def test_rules_reach_a_subgraph_whose_ops_the_main_graph_lacks():
    # The pass tries only the rules whose pattern ends at an op type the model holds: the ops of an If's
    # branches count, though the main graph holds nothing but the If.
    model = parse(
        HEAD + "g (float[2] x, bool c) => (float[2] y) {\n"
        "  y = If(c) <then_branch = g1 () => (float[2] t) { n = Neg(x)\n t = Neg(n) },\n"
        "             else_branch = g2 () => (float[2] e) { e = Relu(x) }>\n}"
    )
    optimized, modified = apply_pass(NAME, model)
    assert modified
    then_branch = next(a.g for a in optimized.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in then_branch.node if n.op_type == "Neg"] == []
    onnx.checker.check_model(optimized, full_check=True)
    for flag in (True, False):
        assert_same_outputs(model, optimized, feeds={"x": np.array([1.5, -2.0], np.float32), "c": np.array(flag)})
