"""weighted_sum: x1 * b1 + x2 * b2 into flexdsa::WeightedSum, defined as a model-local function."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from flexdsa_core.cost_model import CostModel
from flexdsa_core.fusion_switcher import FusionSwitcher
from flexdsa_core.targets import TargetSpec, get_adapter, load_target
from tests.core.fusions.harness import assert_fuses, assert_not_fused, parse, rule


def graph(body: str, *, extra_outputs: str = "") -> str:
    return f"""
<ir_version: 9, opset_import: ["" : 17]>
agraph (float[4, 8] x1, float[4, 8] x2, float[4, 8] x3, float c) => (float[4, 8] y{extra_outputs})
<float b1 = {{0.5}}, float[1] b2 = {{-2.0}}, float[8] row = {{1, 2, 3, 4, 5, 6, 7, 8}}, float[1, 1, 1] wide = {{3.0}}>
{{
    {body}
}}
"""


WEIGHTED = "m1 = Mul(x1, b1)\n m2 = Mul(b2, x2)\n y = Add(m1, m2)"


def _switcher(spec: TargetSpec) -> FusionSwitcher:
    adapter = get_adapter(spec)

    def supports(key: str) -> bool:
        domain, _, op_type = key.rpartition("::")
        return adapter.supports(spec, op_type, domain)

    return FusionSwitcher(spec, supports, CostModel(spec, calibrate=False))


def test_weighted_sum_with_function_definition():
    fused = assert_fuses("weighted_sum", graph(WEIGHTED), ["WeightedSum"])
    assert fused.graph.node[0].domain == "flexdsa"
    assert [(f.domain, f.name) for f in fused.functions] == [("flexdsa", "WeightedSum")]
    assert [n.op_type for n in fused.functions[0].node] == ["Mul", "Mul", "Add"]
    onnx.checker.check_model(fused, full_check=True)


def test_function_model_runs_with_ort_optimizations_on():
    fused = assert_fuses("weighted_sum", graph(WEIGHTED), ["WeightedSum"])
    session = ort.InferenceSession(fused.SerializeToString(), providers=["CPUExecutionProvider"])
    x1, x2 = np.ones((4, 8), np.float32), np.full((4, 8), 3.0, np.float32)
    (y,) = session.run(["y"], {"x1": x1, "x2": x2, "x3": x2, "c": np.array(0, np.float32)})
    np.testing.assert_allclose(y, 0.5 * x1 - 2.0 * x2)


def test_two_sums_share_one_function():
    body = "m1 = Mul(x1, b1)\n m2 = Mul(x2, b2)\n s = Add(m1, m2)\n m3 = Mul(s, b1)\n m4 = Mul(x3, b2)\n y = Add(m3, m4)"
    fused = assert_fuses("weighted_sum", graph(body), ["WeightedSum", "WeightedSum"])
    assert len(fused.functions) == 1


def test_not_when_a_coefficient_is_not_constant():
    assert_not_fused("weighted_sum", graph("m1 = Mul(x1, b1)\n m2 = Mul(x2, c)\n y = Add(m1, m2)"))


def test_not_when_a_coefficient_is_not_scalar():
    assert_not_fused("weighted_sum", graph("m1 = Mul(x1, b1)\n m2 = Mul(x2, row)\n y = Add(m1, m2)"))


def test_not_when_a_coefficient_would_raise_the_rank():
    text = graph("m1 = Mul(x1, b1)\n m2 = Mul(x2, wide)\n y = Add(m1, m2)").replace(
        "=> (float[4, 8] y", "=> (float[1, 4, 8] y"
    )
    assert_not_fused("weighted_sum", text)


def test_not_when_a_product_is_used_elsewhere():
    text = graph(WEIGHTED + "\n z = Relu(m1)", extra_outputs=", float[4, 8] z")
    assert_not_fused("weighted_sum", text)


def test_legal_only_on_a_target_that_lists_the_op():
    rule_ = rule("weighted_sum")
    assert rule_.produces == ("flexdsa::WeightedSum",)

    cpu_model = ir.serde.deserialize_model(parse(graph(WEIGHTED)))
    cpu_plan = _switcher(load_target("cpu-ort")).run(cpu_model, [rule_])
    (cpu_entry,) = cpu_plan.to_json()["candidates"]
    assert "has no flexdsa::WeightedSum" in cpu_entry["reason"]
    assert [n.op_type for n in cpu_model.graph] == ["Mul", "Mul", "Add"]

    dsa = TargetSpec(
        name="test-dsa",
        vendor="test",
        adapter="cpu_ort",
        supported_ops=["Mul", "Add", "flexdsa::WeightedSum"],
        peak_ops_per_s={"float32": 1e12},
        mem_bandwidth_bytes_per_s=1e10,
    )
    dsa_model = ir.serde.deserialize_model(parse(graph(WEIGHTED)))
    dsa_plan = _switcher(dsa).run(dsa_model, [rule_])
    assert dsa_plan.applied == ["weighted_sum"]
    assert [n.op_type for n in dsa_model.graph] == ["WeightedSum"]
    # The switcher's output still runs in ONNX Runtime through the function definition.
    proto = ir.serde.serialize_model(dsa_model)
    onnx.checker.check_model(proto, full_check=True)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x1, x2 = np.arange(32, dtype=np.float32).reshape(4, 8), np.ones((4, 8), np.float32)
    (y,) = session.run(["y"], {"x1": x1, "x2": x2, "x3": x2, "c": np.array(0, np.float32)})
    np.testing.assert_allclose(y, 0.5 * x1 - 2.0 * x2)
