"""The Subgraph Mapper: placement with reasons, convex partitions with few transitions, kernels grouped
against SRAM, identical layers explored once, and estimates that never undercut their roofline bound."""

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper

from flexdsa_core.cost_model import CostModel
from flexdsa_core.memory_planner import plan_memory
from flexdsa_core.subgraph_mapper import ACCELERATOR, CPU, SubgraphMapper
from flexdsa_core.targets import TargetSpec
from flexdsa_core.targets.accelerator import ADAPTER
from flexdsa_core.vendor_runs.estimate import target_estimate


def _target(**changes) -> TargetSpec:
    base = dict(
        name="test-npu", vendor="test", adapter="accelerator",
        peak_ops_per_s={"float16": 4e12}, mem_bandwidth_bytes_per_s=25.6e9, sram_bytes=1 << 20,
        static_shapes=True, supported_ops=["Conv", "Relu", "Add", "Reshape", "Flatten", "Gemm"],
    )  # fmt: skip
    base.update(changes)
    return TargetSpec(**base)


def _chain(blocks: int, channels: int = 8, size: int = 16, extra: list | None = None) -> ir.Model:
    """``blocks`` identical Conv(3x3)+Relu layers, then ``extra`` nodes."""
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(blocks):
        w = helper.make_tensor(f"w{i}", TensorProto.FLOAT, [channels, channels, 3, 3],
                               rng.standard_normal(channels * channels * 9).astype(np.float32))  # fmt: skip
        inits.append(w)
        nodes.append(helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1], name=f"conv{i}"))
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        x = f"r{i}"
    nodes += extra or []
    out = nodes[-1].output[0]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)], inits,
    )  # fmt: skip
    model = onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    return ir.from_proto(model)


def test_unsupported_ops_fall_back_with_their_reason():
    extra = [helper.make_node("Sigmoid", ["r1"], ["s"], name="sig"), helper.make_node("Relu", ["s"], ["y"], name="after")]
    mapping = SubgraphMapper(_target(), ADAPTER, CostModel(_target())).map(_chain(2, extra=extra))
    assert mapping.placement["sig"] == CPU
    assert mapping.placement["after"] == ACCELERATOR
    assert mapping.fallback == [{"node": "sig", "op": "Sigmoid", "reason": "Sigmoid is not in the test-npu op table"}]
    assert [p.device for p in mapping.partitions] == [ACCELERATOR, CPU, ACCELERATOR]
    assert mapping.transitions == 2


def test_a_constraint_sends_one_conv_to_the_cpu_and_says_why():
    target = _target(op_constraints={"Conv": {"kernel_max": 1, "source": "X9"}})
    mapping = SubgraphMapper(target, ADAPTER, CostModel(target)).map(_chain(1))
    assert mapping.placement["conv0"] == CPU
    assert mapping.fallback[0]["reason"] == "Conv: kernel 3x3 exceeds the limit of 1 on test-npu (X9)"


def test_data_movement_alone_between_cpu_nodes_joins_the_cpu():
    extra = [
        helper.make_node("Sigmoid", ["r0"], ["s1"], name="sig1"),
        helper.make_node("Flatten", ["s1"], ["f"], name="flat"),
        helper.make_node("Sigmoid", ["f"], ["y"], name="sig2"),
    ]
    mapping = SubgraphMapper(_target(), ADAPTER, CostModel(_target())).map(_chain(1, extra=extra))
    assert mapping.placement["flat"] == CPU
    assert "two transitions" in next(f["reason"] for f in mapping.fallback if f["node"] == "flat")
    assert mapping.transitions == 1


def test_partitions_are_runs_of_a_topological_order():
    """Two independent branches, one supported and one not: the order keeps each device's nodes together."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a1"], name="a1"), helper.make_node("Sigmoid", ["x"], ["b1"], name="b1"),
        helper.make_node("Relu", ["a1"], ["a2"], name="a2"), helper.make_node("Sigmoid", ["b1"], ["b2"], name="b2"),
        helper.make_node("Add", ["a2", "b2"], ["y"], name="join"),
    ]  # fmt: skip
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])  # fmt: skip
    model = ir.from_proto(onnx.shape_inference.infer_shapes(helper.make_model(graph)))
    mapping = SubgraphMapper(_target(), ADAPTER, CostModel(_target())).map(model)
    assert [[n.name for n in p.nodes] for p in mapping.partitions] == [["a1", "a2"], ["b1", "b2"], ["join"]]


def test_identical_layers_are_explored_once():
    target = _target(sram_bytes=None)  # no grouping: one kernel per node
    mapping = SubgraphMapper(target, ADAPTER, CostModel(target)).map(_chain(8))
    assert len(mapping.groups) == 16
    assert mapping.explored == 2  # one Conv, one Relu
    assert mapping.hits == 14
    assert "SRAM size unsourced" in mapping.notes[0]


def test_a_shared_cache_explores_nothing_the_second_time():
    from flexdsa_core.cache import LRUCache

    cache = LRUCache()
    first = SubgraphMapper(_target(), ADAPTER, CostModel(_target()), cache).map(_chain(4))
    second = SubgraphMapper(_target(), ADAPTER, CostModel(_target()), cache).map(_chain(4))
    assert first.explored > 0
    assert second.explored == 0 and second.hits == first.explored + first.hits


def test_intermediates_stay_in_sram_when_they_fit_and_tiles_when_they_do_not():
    roomy = SubgraphMapper(_target(), ADAPTER, CostModel(_target())).map(_chain(4))
    assert len(roomy.groups) == 1 and roomy.groups[0].tiles == 1
    # Group DRAM traffic: the input, the output and the weights, never the intermediates.
    group = roomy.groups[0]
    assert group.dram_bytes == 2 * 8 * 16 * 16 * 4 + 4 * 8 * 8 * 9 * 4
    # A small SRAM: activations no longer fit whole, so the group is tiled (or split).
    tight = _target(sram_bytes=16 * 1024)
    mapping = SubgraphMapper(tight, ADAPTER, CostModel(tight)).map(_chain(4))
    assert all(g.sram_bytes <= 16 * 1024 for g in mapping.groups if len(g.nodes) > 1)
    assert any(g.tiles > 1 for g in mapping.groups)


def test_estimate_is_labelled_partial_on_fallback_and_never_below_its_roofline():
    extra = [helper.make_node("Sigmoid", ["r1"], ["y"], name="sig")]
    model = _chain(2, extra=extra)
    target = _target(power_w=8.0)
    cost_model = CostModel(target)
    mapping = SubgraphMapper(target, ADAPTER, cost_model).map(model)
    estimate = target_estimate(target, mapping, cost_model.graph_cost(model), plan_memory(model).as_dict())
    assert estimate["partial"] is True
    assert any("no sourced throughput" in n for n in estimate["notes"])
    assert estimate["latency_s"] >= estimate["roofline_bound_s"] > 0
    assert estimate["energy_j"] == 8.0 * estimate["latency_s"]
    assert estimate["transfer_bytes"] == 8 * 16 * 16 * 4  # r1 crosses to the CPU once
    assert 0 < estimate["accelerator_flop_share"] < 1
    assert "not a measurement" in estimate["label"]


def test_no_power_no_energy():
    target = _target()
    cost_model = CostModel(target)
    model = _chain(1)
    mapping = SubgraphMapper(target, ADAPTER, cost_model).map(model)
    estimate = target_estimate(target, mapping, cost_model.graph_cost(model), plan_memory(model).as_dict())
    assert estimate["energy_j"] is None and estimate["partial"] is False
