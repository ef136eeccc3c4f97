"""Invariants between stages: a well-formed graph passes; each kind of damage is named with its stage."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest

from flexdsa_core.errors import FlexDSAError
from flexdsa_core.invariants import InvariantError, check_invariants

TEXT = """<ir_version: 8, opset_import: ["" : 17]>
g (float[2,3] x) => (float[2,3] y) {
    a = Relu(x)
    b = Neg(a)
    y = Add(a, b)
}"""


def model() -> ir.Model:
    proto = onnx.shape_inference.infer_shapes(onnx.parser.parse_model(TEXT))
    return ir.serde.deserialize_model(proto)


def test_well_formed_graph_passes():
    check_invariants(model(), stage="ingest")
    check_invariants(
        model(), stage="ingest", supported=lambda op, domain: domain == "" and op in {"Relu", "Neg", "Add"}
    )


def test_invariant_error_is_a_flexdsa_error():
    assert issubclass(InvariantError, FlexDSAError)


def test_unsorted_graph_is_named_with_the_stage():
    m = model()
    nodes = list(m.graph)
    m.graph.remove(nodes[0])
    m.graph.append(nodes[0])  # Relu now after its consumers
    with pytest.raises(InvariantError, match="Stage 'fusion'.*comes before"):
        check_invariants(m, stage="fusion")


def test_duplicate_value_names():
    m = model()
    nodes = list(m.graph)
    nodes[1].outputs[0].name = "dup"
    nodes[0].outputs[0].name = "dup"
    with pytest.raises(InvariantError, match="'dup' is produced twice"):
        check_invariants(m, stage="generic_passes")


def test_dangling_input():
    m = model()
    add = list(m.graph)[2]
    add.replace_input_with(1, ir.Value(name="ghost", type=ir.TensorType(ir.DataType.FLOAT)))
    with pytest.raises(InvariantError, match="reads 'ghost', which nothing provides"):
        check_invariants(m, stage="layout")


def test_shape_that_disagrees_with_the_op():
    m = model()
    neg = list(m.graph)[1]
    neg.outputs[0].shape = ir.Shape([3, 2])
    with pytest.raises(InvariantError, match="'b'.*recorded shape \\[3, 2\\]"):
        check_invariants(m, stage="shape_tracker")


def test_dtype_that_disagrees_with_the_op():
    m = model()
    list(m.graph)[1].outputs[0].dtype = ir.DataType.INT64
    with pytest.raises(InvariantError, match="recorded type INT64"):
        check_invariants(m, stage="shape_tracker")


def test_unsupported_op_for_the_target():
    with pytest.raises(InvariantError, match="Stage 'mapper'.*'Neg' \\(1 node\\(s\\)\\) is not supported"):
        check_invariants(model(), stage="mapper", supported=lambda op, domain: op != "Neg")


def test_unknown_shapes_are_not_a_violation():
    m = model()
    for node in m.graph:
        node.outputs[0].shape = None
    check_invariants(m, stage="ingest")


def test_constant_nodes_are_data_not_unsupported_ops():
    m = ir.serde.deserialize_model(
        onnx.parser.parse_model(
            '<ir_version: 8, opset_import: ["" : 17]>\n'
            "g (float[2] x) => (float[2] y) { c = Constant<value = float[2] {1, 2}>()\n y = Add(x, c) }"
        )
    )
    check_invariants(m, stage="legalize", supported=lambda op, domain: op == "Add")
