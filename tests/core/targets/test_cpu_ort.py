"""cpu-ort adapter: its op table is ORT's CPU kernel registry, and residual Adds the switcher left unfused
are pinned as Sum so ONNX Runtime's load-time SkipLayerNormalization fusion cannot undo the decision."""

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from flexdsa_core.targets import get_adapter, load_target
from flexdsa_core.targets.cpu_ort import pin_unfused_residuals
from tests.core.fusions.harness import parse, run

ONES = ", ".join(["1.0"] * 32)
ZEROS = ", ".join(["0.0"] * 32)
RESIDUAL_LN = f"""
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 16, 32] x, float[1, 16, 32] y) => (float[1, 16, 32] z)
<float[32] gamma = {{{ONES}}}, float[32] beta = {{{ZEROS}}}>
{{
    s = Add(x, y)
    z = LayerNormalization <axis = -1, epsilon = 1e-5> (s, gamma, beta)
}}
"""

BROADCAST_ADD = RESIDUAL_LN.replace("float[1, 16, 32] y", "float[32] y")


def _ort_optimized_ops(model: onnx.ModelProto, tmp_path) -> list[str]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp_path / "ort.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [n.op_type for n in onnx.load(str(tmp_path / "ort.onnx")).graph.node]


def test_op_table_is_the_ort_cpu_registry():
    target = load_target("cpu-ort")
    adapter = get_adapter(target)
    assert adapter.supports(target, "SkipLayerNormalization", "com.microsoft")
    assert adapter.supports(target, "Conv")
    assert not adapter.supports(target, "WeightedSum", "flexdsa")


def test_residual_add_is_pinned_and_survives_ort_load_time_fusion(tmp_path):
    original = parse(RESIDUAL_LN)
    assert "SkipLayerNormalization" in _ort_optimized_ops(original, tmp_path)  # what ORT would do

    model = ir.serde.deserialize_model(original)
    assert pin_unfused_residuals(model) == 1
    pinned = ir.serde.serialize_model(model)
    onnx.checker.check_model(pinned)
    assert [n.op_type for n in pinned.graph.node] == ["Sum", "LayerNormalization"]
    assert "SkipLayerNormalization" not in _ort_optimized_ops(pinned, tmp_path)

    rng = np.random.default_rng(0)
    feeds = {name: rng.standard_normal((1, 16, 32)).astype(np.float32) for name in ("x", "y")}
    np.testing.assert_array_equal(run(pinned, feeds)[0], run(original, feeds)[0])


def test_broadcasting_add_is_left_alone():
    model = ir.serde.deserialize_model(parse(BROADCAST_ADD))
    assert pin_unfused_residuals(model) == 0
    assert [n.op_type for n in model.graph] == ["Add", "LayerNormalization"]
