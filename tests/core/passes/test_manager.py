"""run_passes: fixed point, per-pass records, errors naming the pass; generic_passes honours disabled_rules;
the whole generic pipeline keeps a realistic graph's numerics."""

from __future__ import annotations

import json

import onnx
import onnx_ir as ir
import pytest

from flexdsa_core.options import OptimizeOptions
from flexdsa_core.passes import GENERIC_PASS_NAMES, PassFailedError, PassRecord, generic_passes, run_passes
from tests.core.passes.helpers import assert_same_outputs, parse


class _CountDown(ir.passes.InPlacePass):
    """Reports a change on its first ``times`` calls."""

    name = "count_down"

    def __init__(self, times: int) -> None:
        self.times = times

    def call(self, model):
        self.times -= 1
        return ir.passes.PassResult(model, self.times >= 0)


class _Broken(ir.passes.InPlacePass):
    name = "broken_pass"

    def call(self, model):
        raise KeyError("boom")


def _model() -> ir.Model:
    return ir.serde.deserialize_model(
        parse(
            '<ir_version: 8, opset_import: ["" : 17]>\ng (float[2] x) => (float[2] y) { a = Identity(x)\n y = Relu(a) }'
        )
    )


def test_runs_to_a_fixed_point_and_records_each_sweep():
    records = run_passes(_model(), [_CountDown(2)], max_iterations=8)
    assert [(r.name, r.iteration, r.modified) for r in records] == [
        ("count_down", 0, True),
        ("count_down", 1, True),
        ("count_down", 2, False),
    ]
    assert all(isinstance(r, PassRecord) and r.nodes_before == 2 and r.seconds >= 0 for r in records)
    assert set(json.loads(json.dumps(records[0].as_dict()))) == {
        "name", "iteration", "nodes_before", "nodes_after", "seconds", "modified"
    }  # fmt: skip


def test_stops_at_max_iterations():
    assert len(run_passes(_model(), [_CountDown(100)], max_iterations=3)) == 3


def test_records_node_counts():
    model = _model()
    records = run_passes(model, generic_passes(OptimizeOptions()))
    changed = [r for r in records if r.modified]
    assert changed and (changed[0].nodes_before, changed[0].nodes_after) == (2, 1)
    assert records[-1].nodes_after == 1


def test_error_names_the_pass():
    with pytest.raises(PassFailedError, match="'broken_pass'.*KeyError") as caught:
        run_passes(_model(), [_CountDown(0), _Broken()])
    assert caught.value.details["pass"] == "broken_pass"


def test_pass_names_are_stable_and_can_be_disabled():
    assert GENERIC_PASS_NAMES == (
        "shape_folding", "partial_shape_folding", "constant_folding", "no_op_removal",
        "algebraic_simplification", "cse", "dead_code",
    )  # fmt: skip
    kept = generic_passes(OptimizeOptions(disabled_rules=["cse", "no_op_removal"]))
    assert [p.name for p in kept] == [n for n in GENERIC_PASS_NAMES if n not in {"cse", "no_op_removal"}]
    assert all(isinstance(p, ir.passes.PassBase) for p in kept)


def test_whole_pipeline_on_an_exporter_style_block():
    """A transformer-ish block with exporter leftovers (Dropout, x*1, a shape chain, a Transpose pair,
    Div by 8, Neg∘Neg, a duplicate Relu): all of it folds away, the maths stays."""
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[2,8,16] x, float[16,16] w, float[16] b) => (float[2,8,4,4] y) {
        h = MatMul(x, w)
        hb = Add(h, b)
        d = Dropout(hb)
        one = Constant<value = float {1}>()
        m = Mul(d, one)
        s = Shape(m)
        i0 = Constant<value = int64[2] {0, 1}>()
        lead = Gather<axis = 0>(s, i0)
        tail = Constant<value = int64[2] {4, 4}>()
        shape = Concat<axis = 0>(lead, tail)
        r = Reshape(m, shape)
        t1 = Transpose<perm = [0, 2, 1, 3]>(r)
        t2 = Transpose<perm = [0, 2, 1, 3]>(t1)
        c = Constant<value = float {8}>()
        q = Div(t2, c)
        n1 = Neg(q)
        n2 = Neg(n1)
        r1 = Relu(n2)
        r2 = Relu(n2)
        y = Add(r1, r2)
    }"""
    import numpy as np

    proto = parse(text)
    rng = np.random.default_rng(0)
    for init_name, shape in (("w", (16, 16)), ("b", (16,))):  # weights: initializers, not inputs
        weight = rng.standard_normal(shape).astype(np.float32)
        proto.graph.initializer.append(onnx.numpy_helper.from_array(weight, init_name))
    del proto.graph.input[1:]
    model = ir.serde.deserialize_model(proto)
    records = run_passes(model, generic_passes(OptimizeOptions()))
    optimized = ir.serde.serialize_model(model)
    onnx.checker.check_model(optimized, full_check=True)
    assert [n.op_type for n in optimized.graph.node] == [
        "MatMul",
        "Add",
        "Reshape",
        "Mul",
        "Relu",
        "Add",
    ]
    assert_same_outputs(proto, optimized, rtol=1e-6, atol=1e-6)
    assert records[-1].modified is False  # ended at a fixed point


def test_whole_pipeline_inside_subgraphs_keeps_outer_scope_values():
    """No-ops in If branches that forward an outer-scope value keep the branch outputs as Identity."""
    import numpy as np

    from flexdsa_core.invariants import check_invariants

    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[2,3] x, bool c) => (float[2,3] y) {
        a = Relu(x)
        y = If(c) <then_branch = t () => (float[2,3] o) { one = Constant<value = float {1}>()
                                                          o = Mul(a, one) },
                   else_branch = e () => (float[2,3] o2) { i = Identity(a)
                                                           n = Neg(i)
                                                           o2 = Neg(n) }>
    }"""
    proto = parse(text)
    model = ir.serde.deserialize_model(proto)
    run_passes(model, generic_passes(OptimizeOptions()))
    check_invariants(model, stage="generic_passes")
    optimized = ir.serde.serialize_model(model)
    onnx.checker.check_model(optimized, full_check=True)
    branches = {attr.name: [n.op_type for n in attr.g.node] for attr in optimized.graph.node[1].attribute}
    assert branches == {"then_branch": ["Identity"], "else_branch": ["Identity"]}
    for condition in (True, False):
        feeds = {
            "x": np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32),
            "c": np.array(condition),
        }
        assert_same_outputs(proto, optimized, feeds=feeds)
