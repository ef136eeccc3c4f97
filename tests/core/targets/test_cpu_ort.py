"""cpu-ort adapter: its op table is ORT's CPU kernel registry, and residual Adds the switcher left unfused
are pinned as Sum so ONNX Runtime's load-time SkipLayerNormalization fusion cannot undo the decision."""

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from flexdsa_core.targets import get_adapter, load_target
from flexdsa_core.targets.cpu_ort.adapter import convolution_share, pin_unfused_residuals
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


CONV = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 8, 16, 16] x) => (float[1, 16, 16, 16] y)
<float[16, 8, 3, 3] w = {W}>
{
    c = Conv <pads = [1, 1, 1, 1]> (x, w)
    y = Relu(c)
}
"""


def test_ort_layout_runs_offline_and_keeps_a_portable_model_beside_a_blocked_one():
    from flexdsa_core.targets.cpu_ort.adapter import cpu_features

    weights = ", ".join(f"{v:.4f}" for v in np.random.default_rng(1).standard_normal(16 * 8 * 9))
    original = parse(CONV.replace("{W}", "{" + weights + "}"))
    target = load_target("cpu-ort")
    legalized = get_adapter(target).legalize(ir.serde.deserialize_model(original), target, frozenset())

    assert "ort_layout" in legalized.applied
    tuned = ir.serde.serialize_model(legalized.model)
    if "avx2" in cpu_features()["vector_extensions"]:  # ORT blocks convolutions only with wide vectors
        assert "com.microsoft.nchwc" in {n.domain for n in tuned.graph.node}
        assert [n.op_type for n in legalized.portable.graph] == ["Conv", "Relu"]
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 8, 16, 16)).astype(np.float32)}
    np.testing.assert_allclose(run(tuned, feeds)[0], run(original, feeds)[0], rtol=1e-4, atol=1e-5)


def test_adapter_rewrites_can_be_switched_off():
    original = parse(RESIDUAL_LN)
    target = load_target("cpu-ort")
    legalized = get_adapter(target).legalize(
        ir.serde.deserialize_model(original), target, frozenset({"ort_layout", "pin_residual_sum"})
    )
    assert legalized.applied == [] and legalized.portable is None
    assert [n.op_type for n in legalized.model.graph] == ["Add", "LayerNormalization"]


def test_graph_without_convolutions_skips_the_offline_pass_and_says_why():
    target = load_target("cpu-ort")
    legalized = get_adapter(target).legalize(
        ir.serde.deserialize_model(parse(RESIDUAL_LN)), target, frozenset()
    )
    assert legalized.applied == ["pin_residual_sum"]
    assert legalized.portable is None  # no blocked layout: model.onnx itself runs on any CPU
    assert [n.op_type for n in legalized.model.graph] == ["Sum", "LayerNormalization"]
    assert any("offline pass skipped: convolutions are 0% of the heavy kernels" in n for n in legalized.notes)


def _patches_then_matmuls(matmuls: int) -> ir.Model:
    """One Conv (a patch embedding) followed by ``matmuls`` MatMuls: a vision transformer's kernel mix."""
    h = onnx.helper
    nodes = [h.make_node("Conv", ["x", "w"], ["c"]), h.make_node("Flatten", ["c"], ["t0"])]
    nodes += [h.make_node("MatMul", [f"t{i}", "m"], [f"t{i + 1}"]) for i in range(matmuls)]
    graph = h.make_graph(
        nodes, "g",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 4, 4])],
        [h.make_tensor_value_info(f"t{matmuls}", onnx.TensorProto.FLOAT, [1, 16])],
        [h.make_tensor("w", onnx.TensorProto.FLOAT, [1, 1, 1, 1], [1.0]),
         h.make_tensor("m", onnx.TensorProto.FLOAT, [16, 16], [0.0] * 256)],
    )  # fmt: skip
    return ir.serde.deserialize_model(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9))


def test_the_offline_pass_runs_only_where_convolutions_are_a_tenth_of_the_heavy_kernels():
    target = load_target("cpu-ort")
    adapter = get_adapter(target)
    assert convolution_share(_patches_then_matmuls(9)) == 0.1
    assert "ort_layout" in adapter.legalize(_patches_then_matmuls(9), target, frozenset()).applied
    mostly_matmuls = adapter.legalize(_patches_then_matmuls(10), target, frozenset())
    assert mostly_matmuls.applied == [] and "convolutions are 9% of the heavy kernels" in mostly_matmuls.notes[0]
