"""no_op_removal: nodes that compute their own input are bypassed; broadcasting and graph outputs respected."""

from __future__ import annotations

import pytest

from tests.core.passes.helpers import apply_pass, assert_rewrites, assert_unchanged, op_types, parse

HEAD = '<ir_version: 8, opset_import: ["" : 17]>\n'


def test_identity_chain_removed_and_output_keeps_its_name():
    optimized = assert_rewrites(
        "no_op_removal",
        HEAD + "g (float[2,3] x) => (float[2,3] y) { a = Relu(x)\n b = Identity(a)\n y = Identity(b) }",
        ["Relu"],
    )
    assert optimized.graph.node[0].output[0] == "y"


def test_inference_dropout_removed():
    assert_rewrites(
        "no_op_removal",
        HEAD + "g (float[2,3] x) => (float[2,3] y) { a = Relu(x)\n r = Constant<value = float {0.5}>()\n"
        "t = Constant<value = bool {0}>()\n d = Dropout(a, r, t)\n y = Relu(d) }",
        ["Relu", "Relu"],
    )


def test_training_dropout_kept():
    text = (
        HEAD + "g (float[2,3] x) => (float[2,3] y) { a = Relu(x)\n r = Constant<value = float {0.0}>()\n"
        "t = Constant<value = bool {1}>()\n d = Dropout(a, r, t)\n y = Relu(d) }"
    )
    # ratio 0 keeps training-mode Dropout deterministic, so ORT can compare; the node must stay anyway.
    assert_unchanged("no_op_removal", text)


def test_dropout_with_used_mask_kept():
    assert_unchanged(
        "no_op_removal",
        HEAD + "g (float[2,3] x) => (float[2,3] y, bool[2,3] m) { a = Relu(x)\n y, m = Dropout(a) }",
    )


def test_same_type_cast_removed_other_type_kept():
    assert_rewrites(
        "no_op_removal",
        HEAD + "g (float[2,3] x) => (float[2,3] y) { a = Relu(x)\n c = Cast<to = 1>(a)\n y = Relu(c) }",
        ["Relu", "Relu"],
    )
    assert_unchanged(
        "no_op_removal",
        HEAD + "g (float[2,3] x) => (double[2,3] y) { a = Relu(x)\n c = Cast<to = 11>(a)\n y = Relu(c) }",
    )


def test_same_shape_reshape_removed_changing_reshape_kept():
    assert_rewrites(
        "no_op_removal",
        HEAD + "g (float[2,3] x) => (float[2,3] y) { a = Relu(x)\n s = Constant<value = int64[2] {0, -1}>()\n"
        "r = Reshape(a, s)\n y = Relu(r) }",
        ["Relu", "Relu"],
    )
    assert_unchanged(
        "no_op_removal",
        HEAD + "g (float[2,3] x) => (float[3,2] y) { a = Relu(x)\n s = Constant<value = int64[2] {3, 2}>()\n"
        "r = Reshape(a, s)\n y = Relu(r) }",
    )


def test_inverse_transposes_removed_other_pair_kept():
    assert_rewrites(
        "no_op_removal",
        HEAD + "g (float[2,3,4] x) => (float[2,3,4] y) { a = Relu(x)\n t = Transpose<perm = [1, 2, 0]>(a)\n"
        "u = Transpose<perm = [2, 0, 1]>(t)\n y = Relu(u) }",
        ["Relu", "Relu"],
    )
    assert_unchanged(
        "no_op_removal",
        HEAD + "g (float[2,3,4] x) => (float[4,2,3] y) { a = Relu(x)\n t = Transpose<perm = [1, 2, 0]>(a)\n"
        "u = Transpose<perm = [1, 2, 0]>(t)\n y = Relu(u) }",
    )


@pytest.mark.parametrize(
    "expression",
    ["Mul(a, c)", "Mul(c, a)", "Add(a, z)", "Add(z, a)", "Sub(a, z)", "Div(a, c)"],
)
def test_neutral_element_removed(expression):
    assert_rewrites(
        "no_op_removal",
        HEAD
        + "g (float[2,3] x) => (float[2,3] y) { a = Relu(x)\n c = Constant<value = float[1,3] {1, 1, 1}>()\n"
        f"z = Constant<value = float {{0}}>()\n b = {expression}\n y = Relu(b) }}",
        ["Relu", "Constant", "Relu"],  # the unused one of c, z is not this pass's business
    )


def test_neutral_element_that_broadcasts_is_kept():
    # x: [3] * ones[2,3] → [2,3]: the product is bigger than x, so it is not a no-op.
    assert_unchanged(
        "no_op_removal",
        HEAD
        + "g (float[3] x) => (float[2,3] y) { a = Relu(x)\n c = Constant<value = float[2,3] {1,1,1,1,1,1}>()\n"
        "b = Mul(a, c)\n y = Relu(b) }",
    )


def test_zero_minus_x_and_two_over_x_kept():
    assert_unchanged(
        "no_op_removal",
        HEAD + "g (float[2,3] x) => (float[2,3] y) { a = Relu(x)\n z = Constant<value = float {0}>()\n"
        "b = Sub(z, a)\n c = Constant<value = float {2}>()\n y = Mul(b, c) }",
    )


def test_graph_output_fed_by_graph_input_keeps_an_identity():
    optimized = assert_rewrites(
        "no_op_removal",
        HEAD + "g (float[2,3] x) => (float[2,3] y) { c = Constant<value = float {1}>()\n y = Mul(x, c) }",
        ["Identity"],
    )
    assert optimized.graph.output[0].name == "y"


def test_expand_slice_pad_concat_no_ops():
    assert_rewrites(
        "no_op_removal",
        HEAD
        + """g (float[2,3] x) => (float[2,3] y) {
            a = Relu(x)
            s = Constant<value = int64[2] {1, 3}>()
            e = Expand(a, s)
            st = Constant<value = int64[2] {0, 0}>()
            en = Constant<value = int64[2] {9223372036854775807, 3}>()
            sl = Slice(e, st, en)
            p = Constant<value = int64[4] {0, 0, 0, 0}>()
            pd = Pad(sl, p)
            cc = Concat<axis = 1>(pd)
            y = Relu(cc)
        }""",
        ["Relu", "Relu"],
    )


def test_expand_that_broadcasts_and_partial_slice_kept():
    assert_unchanged(
        "no_op_removal",
        HEAD
        + """g (float[1,3] x) => (float[2,2] y) {
            a = Relu(x)
            s = Constant<value = int64[2] {2, 3}>()
            e = Expand(a, s)
            st = Constant<value = int64[1] {1}>()
            en = Constant<value = int64[1] {3}>()
            ax = Constant<value = int64[1] {1}>()
            y = Slice(e, st, en, ax)
        }""",
    )


def test_opset_10_dropout_removed():
    assert_rewrites(
        "no_op_removal",
        '<ir_version: 5, opset_import: ["" : 10]>\n'
        "g (float[2,3] x) => (float[2,3] y) { a = Relu(x)\n d = Dropout<ratio = 0.3>(a)\n y = Relu(d) }",
        ["Relu", "Relu"],
    )


def test_dropout_with_runtime_training_flag_kept():
    text = (
        HEAD
        + "g (float[2,3] x, bool t) => (float[2,3] y) { a = Relu(x)\n r = Constant<value = float {0.0}>()\n"
        "d = Dropout(a, r, t)\n y = Relu(d) }"
    )
    original = parse(text)
    optimized, modified = apply_pass("no_op_removal", original)
    assert not modified and op_types(optimized) == op_types(original)
