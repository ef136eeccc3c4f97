"""The memory planner: lifetimes, in-place reuse, buffer sharing, and the arena's invariants."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

from flexdsa_core.memory_planner import ALIGNMENT, MemoryPlan, plan_memory


def parse(text: str) -> ir.Model:
    proto = onnx.shape_inference.infer_shapes(onnx.parser.parse_model(text), strict_mode=True)
    onnx.checker.check_model(proto)
    return ir.from_proto(proto)


def assert_sound(plan: MemoryPlan) -> None:
    """No two tensors live at the same step share a byte (bar an in-place pair); both bounds hold."""
    assert plan.violations() == []
    tensors = list(plan.assignments.values())
    for a, b in itertools.combinations(tensors, 2):
        live_together = a.start <= b.end and b.start <= a.end
        share_bytes = a.offset < b.offset + b.size and b.offset < a.offset + a.size
        in_place_pair = a.in_place_of == b.name or b.in_place_of == a.name
        assert not (live_together and share_bytes and not in_place_pair), (a, b)
    assert plan.peak_live_bytes <= plan.arena_bytes <= plan.naive_bytes
    assert all(t.offset % ALIGNMENT == 0 for t in tensors)


BYTES = 256 * 4  # float[1, 256]

TRANSPOSE_CHAIN = """
<ir_version: 10, opset_import: ["" : 21]>
g (float[16, 64] x) => (float[16, 64] y) {
    a = Transpose(x)
    b = Transpose(a)
    c = Transpose(b)
    d = Transpose(c)
    e = Transpose(d)
    y = Transpose(e)
}
"""


def test_chain_shares_two_buffers():
    plan = plan_memory(parse(TRANSPOSE_CHAIN))
    assert_sound(plan)
    assert set(plan.assignments) == {"a", "b", "c", "d", "e"}  # x and y are caller-bound
    assert plan.naive_bytes == 5 * 16 * 64 * 4
    # Each tensor lives from its producer to its consumer: at most two at once, and no in-place for Transpose.
    assert plan.arena_bytes == plan.peak_live_bytes == 2 * 16 * 64 * 4
    assert plan.in_place == 0
    assert plan.assignments["a"].offset == plan.assignments["c"].offset == plan.assignments["e"].offset


ELEMENTWISE_CHAIN = """
<ir_version: 10, opset_import: ["" : 21]>
g (float[1, 256] x, float[256] bias) => (float[1, 256] y) {
    a = Relu(x)
    b = Sigmoid(a)
    c = Add(b, bias)
    d = Mul(c, c)
    y = Tanh(d)
}
"""


def test_elementwise_chain_runs_in_place():
    plan = plan_memory(parse(ELEMENTWISE_CHAIN))
    assert_sound(plan)
    assert plan.in_place == 3  # b over a, c over b (bias broadcasts), d over c (Mul(c, c))
    assert plan.assignments["b"].in_place_of == "a"
    assert plan.assignments["c"].in_place_of == "b"
    assert plan.assignments["d"].in_place_of == "c"
    assert {t.offset for t in plan.assignments.values()} == {0}
    assert plan.arena_bytes == plan.peak_live_bytes == BYTES
    assert plan.naive_bytes == 4 * BYTES


DIAMOND = """
<ir_version: 10, opset_import: ["" : 21]>
g (float[1, 256] x) => (float[1, 256] y) {
    a = Relu(x)
    b = Sigmoid(a)
    c = Tanh(a)
    d = Add(b, c)
    e = Transpose(d)
    f = Transpose(e)
    y = Neg(f)
}
"""


def test_diamond_keeps_the_shared_input_alive():
    plan = plan_memory(parse(DIAMOND))
    assert_sound(plan)
    a, b, c = (plan.assignments[n] for n in "abc")
    # 'a' feeds both branches, so 'b' cannot overwrite it; 'c' is its last use and may.
    assert b.in_place_of is None
    assert c.in_place_of == "a"
    assert plan.assignments["d"].in_place_of == "b"
    assert a.end == c.start
    assert b.offset != a.offset
    assert plan.in_place == 2
    assert plan.arena_bytes == plan.peak_live_bytes == 2 * BYTES
    assert plan.arena_bytes < plan.naive_bytes == 6 * BYTES


def test_in_place_needs_same_size_and_dtype():
    plan = plan_memory(
        parse("""
        <ir_version: 10, opset_import: ["" : 21]>
        g (float[1, 256] x, float[8, 256] big) => (float[8, 256] y, int32[1, 256] z) {
            a = Relu(x)
            b = Add(a, big)
            y = Relu(b)
            c = Relu(x)
            d = Cast<to = 6>(c)
            z = Neg(d)
        }
        """)
    )
    assert_sound(plan)
    assert plan.assignments["b"].in_place_of is None  # 'a' dies at the Add but is 8x smaller than 'b'
    assert plan.assignments["d"].in_place_of is None  # Cast is not in the element-wise set
    assert plan.in_place == 0


def test_inputs_outputs_and_weights_stay_out_of_the_arena():
    plan = plan_memory(
        parse("""
        <ir_version: 10, opset_import: ["" : 21]>
        g (float[4, 2] x) => (float[4, 2] y) <float[2, 2] w = {1.0, 2.0, 3.0, 4.0}> {
            k = Constant<value = float[2] {1.0, 2.0}>()
            h = MatMul(x, w)
            y = Add(h, k)
        }
        """)
    )
    assert set(plan.assignments) == {"h"}
    assert plan.io_bytes == 2 * 4 * 2 * 4
    assert plan.weight_bytes == 2 * 2 * 4 + 2 * 4


def test_symbolic_dims_are_assumed_or_taken_from_dims():
    model = parse("""
    <ir_version: 10, opset_import: ["" : 21]>
    g (float[batch, seq, 32] x) => (float[batch, 32, seq] y) {
        a = Relu(x)
        y = Transpose<perm = [0, 2, 1]>(a)
    }
    """)
    plan = plan_memory(model)
    assert plan.assumed_dims == ["batch", "seq"]
    assert plan.dims == {"batch": 1, "seq": 128}
    assert plan.assignments["a"].size == 1 * 128 * 32 * 4
    assert any("assumed" in note for note in plan.notes)

    plan = plan_memory(model, dims={"batch": 2, "seq": 10})
    assert plan.assumed_dims == []
    assert plan.assignments["a"].size == 2 * 10 * 32 * 4


def test_data_dependent_sizes_are_listed_not_guessed():
    plan = plan_memory(
        parse("""
        <ir_version: 10, opset_import: ["" : 21]>
        g (float[4, 4] x) => (float[N] y) {
            nz = NonZero(x)
            idx = Transpose(nz)
            y = GatherND(x, idx)
        }
        """)
    )
    assert [u["tensor"] for u in plan.unknown_size] == ["nz", "idx"]
    assert plan.unknown_size[0]["op_type"] == "NonZero"
    assert plan.assignments == {}
    assert plan.arena_bytes == 0


def test_a_graph_stored_out_of_order_is_planned_in_topological_order():
    model = parse(TRANSPOSE_CHAIN)
    nodes = list(model.graph)
    model.graph.remove(nodes[2])
    model.graph.append(nodes[2])  # 'c = Transpose(b)' now stored last
    plan = plan_memory(model)
    assert_sound(plan)
    assert [plan.assignments[n].start for n in "abcde"] == [0, 1, 2, 3, 4]


def test_as_dict_leaves_out_assignments_unless_asked():
    plan = plan_memory(parse(DIAMOND))
    assert "assignments" not in plan.as_dict()
    full = plan.as_dict(with_assignments=True)
    assert full["assignments"]["c"]["in_place_of"] == "a"
    assert full["saving"] == pytest.approx(1 - 2 / 6, abs=1e-4)


def random_graph(seed: int) -> ir.Model:
    """A random DAG of unary/binary/reshaping ops over a few tensor sizes."""
    rng = np.random.default_rng(seed)
    available = {"x": 64}
    nodes, counter = [], itertools.count()
    for _ in range(int(rng.integers(8, 30))):
        name = f"t{next(counter)}"
        kind = rng.choice(["unary", "binary", "widen", "shrink"])
        source = str(rng.choice(sorted(available)))
        width = available[source]
        if kind == "unary":
            nodes.append(helper.make_node(str(rng.choice(["Relu", "Sigmoid", "Exp"])), [source], [name]))
        elif kind == "binary":
            peers = [n for n, w in available.items() if w == width]
            other = str(rng.choice(peers))
            nodes.append(helper.make_node(str(rng.choice(["Add", "Mul", "Sub"])), [source, other], [name]))
        elif kind == "widen" and width <= 256:
            factor = int(rng.integers(2, 5))
            nodes.append(helper.make_node("Concat", [source] * factor, [name], axis=1))
            width *= factor
        else:
            nodes.append(helper.make_node("ReduceSum", [source], [name], keepdims=1))
            width = 1
        available[name] = width
    last = nodes[-1].output[0]
    graph = helper.make_graph(
        [*nodes, helper.make_node("Identity", [last], ["y"])],
        "random",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    proto = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    return ir.from_proto(proto)


@pytest.mark.parametrize("seed", range(40))
def test_invariants_hold_on_random_graphs(seed):
    assert_sound(plan_memory(random_graph(seed)))


@pytest.mark.models
@pytest.mark.parametrize("name", ["bert", "gpt2", "llama", "vit", "resnet", "mobilenetv2"])
def test_real_models_plan_soundly(name):
    from flexdsa_core.shape_tracker import ShapeTracker
    from flexdsa_core.targets import load_target
    from tests.models import fixture

    tracker = ShapeTracker(ir.from_proto(onnx.load(fixture(name))))
    [bucket] = tracker.buckets(
        {d: [1] if d == "batch" else [32] for d in tracker.infer().dims}, load_target("cpu-ort")
    )
    plan = plan_memory(tracker.specialize(bucket))
    assert_sound(plan)
    assert plan.unknown_size == []
    assert plan.in_place > 0
    assert plan.arena_bytes < plan.naive_bytes / 2


def test_uses_by_nodes_outside_the_graph_are_ignored():
    model = parse(TRANSPOSE_CHAIN)
    nodes = list(model.graph)
    stray = ir.Node("", "Relu", inputs=[nodes[0].outputs[0]])  # reads 'a' but was never added to the graph
    assert stray.graph is None
    plan = plan_memory(model)
    assert_sound(plan)
    assert plan.assignments["a"].end == 1


def test_the_invariant_check_catches_a_broken_plan():
    plan = plan_memory(parse(TRANSPOSE_CHAIN))
    plan.assignments["b"].offset = plan.assignments["a"].offset  # 'a' is still read when 'b' is written
    assert any("'a' [0,1] and 'b' [1,2] are live together" in p for p in plan.violations())
    plan = plan_memory(parse(DIAMOND))
    plan.assignments["c"].offset += 8
    assert any("not 64-byte aligned" in p for p in plan.violations())
