"""Everything the report says was applied is in the delivered model: each taken fusion's nodes are in the
output (or folded into a later fusion that is, or turned by ONNX Runtime's offline layout pass into its
blocked kernel); no opset import is left that nothing uses."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.delivery import check_delivery
from flexdsa_core.fusion_switcher import RULE_TAG
from flexdsa_core.targets import TargetSpec, op_key
from tests.core.fusions.test_weighted_sum import WEIGHTED, graph
from tests.models import FIXTURES, fixture


@pytest.mark.models
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_every_taken_fusion_is_in_the_delivered_model(name):
    result = FlexDSAOptimizer("cpu-ort").optimize(fixture(name), OptimizeOptions(measure_latency=False))
    model = onnx.load_from_string(result.model_bytes())
    ops = {op_key(n.op_type, n.domain) for n in model.graph.node}
    tags = {
        next((p.value for p in n.metadata_props if p.key == RULE_TAG), None): op_key(n.op_type, n.domain)
        for n in model.graph.node
    }
    taken = {c["rule"]: c for c in result.report["fusions"]["candidates"] if c["taken"]}
    assert taken and not result.report["warnings"]
    for rule, candidate in taken.items():
        status = candidate["delivered"]["status"]
        if status == "delivered":
            assert rule in tags and (set(candidate["produces"]) & ops), (rule, candidate["produces"])
        elif status == "subsumed":
            assert any(
                taken[later]["delivered"]["status"] != "not delivered" for later in candidate["subsumed_by"]
            )
        else:
            assert status.startswith("delivered as ") and status.removeprefix("delivered as ") in ops, status
    # Unused opset imports dropped (ONNX Runtime's offline pass writes one for every domain it knows).
    used = {n.domain for n in model.graph.node} | {""}
    assert {o.domain for o in model.opset_import} <= used


def test_a_fusion_missing_from_the_model_is_reported_not_delivered():
    model = ir.serde.deserialize_model(onnx.parser.parse_model(graph(WEIGHTED)))
    plan = {"candidates": [{"rule": "weighted_sum", "taken": 1, "produces": ["flexdsa::WeightedSum"]}]}
    [warning] = check_delivery(plan, model)
    assert plan["candidates"][0]["delivered"]["status"] == "not delivered"
    assert "'weighted_sum' was applied but is not in the delivered model" in warning


def test_weighted_sum_survives_to_the_delivered_model_on_a_target_that_runs_it():
    # ONNX Runtime's offline pass would inline the model-local function: on cpu_ort's adapter it is skipped.
    dsa = TargetSpec(
        name="test-dsa", vendor="test", adapter="cpu_ort", supported_ops=["Mul", "Add", "flexdsa::WeightedSum"],
        peak_ops_per_s={"float32": 1e12}, mem_bandwidth_bytes_per_s=1e10,
    )  # fmt: skip
    source = onnx.parser.parse_model(graph(WEIGHTED)).SerializeToString()
    result = FlexDSAOptimizer(dsa).optimize(source, OptimizeOptions(measure_latency=False))
    model = onnx.load_from_string(result.model_bytes())
    assert [n.op_type for n in model.graph.node] == ["WeightedSum"]
    [candidate] = [c for c in result.report["fusions"]["candidates"] if c["rule"] == "weighted_sum"]
    assert candidate["taken"] and candidate["delivered"]["status"] == "delivered"
    assert any("would inline the model-local function" in n for n in result.report["legalization"]["static"])
    assert not result.report["warnings"]
