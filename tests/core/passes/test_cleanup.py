"""cse and dead_code: duplicate computations merge, unread nodes/initializers/opsets go, outputs stay."""

from __future__ import annotations

import onnx_ir as ir

from tests.core.passes.helpers import apply_pass, assert_rewrites, assert_unchanged, parse

HEAD = '<ir_version: 8, opset_import: ["" : 17]>\n'


def test_cse_merges_identical_nodes():
    assert_rewrites(
        "cse",
        HEAD + "g (float[2,3] x) => (float[2,3] y) { a = Relu(x)\n b = Relu(x)\n y = Add(a, b) }",
        ["Relu", "Add"],
    )


def test_cse_keeps_nodes_with_different_attributes():
    assert_unchanged(
        "cse",
        HEAD + "g (float[2,3] x) => (float[2,3] y) { a = LeakyRelu<alpha = 0.1>(x)\n"
        "b = LeakyRelu<alpha = 0.2>(x)\n y = Add(a, b) }",
    )


def test_cse_keeps_both_graph_outputs():
    optimized, _ = apply_pass(
        "cse", parse(HEAD + "g (float[2,3] x) => (float[2,3] y, float[2,3] z) { y = Relu(x)\n z = Relu(x) }")
    )
    assert [output.name for output in optimized.graph.output] == ["y", "z"]


def test_dead_code_removes_unread_nodes_initializers_and_opsets():
    text = (
        '<ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>\n'
        "g (float[2,3] x) => (float[2,3] y) < float[3] unused_w = {1, 2, 3} > {\n"
        "a = Relu(x)\n dead = Neg(a)\n dead2 = com.microsoft.Gelu(dead)\n y = Sigmoid(a) }"
    )
    optimized = assert_rewrites("dead_code", text, ["Relu", "Sigmoid"])
    assert [init.name for init in optimized.graph.initializer] == []
    assert {opset.domain for opset in optimized.opset_import} == {""}


def test_dead_code_keeps_everything_that_is_read():
    assert_unchanged(
        "dead_code",
        HEAD
        + "g (float[2,3] x) => (float[2,3] y) < float[3] w = {1, 2, 3} > { a = Mul(x, w)\n y = Relu(a) }",
    )


def test_dead_code_keeps_graph_input_initializers():
    model = ir.serde.deserialize_model(
        parse(HEAD + "g (float[2] x, float[2] w) => (float[2] y) < float[2] w = {1, 2} > { y = Relu(x) }")
    )
    from flexdsa_core.passes.cleanup import DeadCodeEliminationPass

    DeadCodeEliminationPass()(model)
    assert [value.name for value in model.graph.inputs] == ["x", "w"]
