"""Qualcomm SM8650 HTP (ONNX Runtime QNN EP): the sourced figures, the op table and the limits QNN's own
validation states (with their reasons), legalisation keeps the numerics, the bundle's scripts parse and its
manifest names files that exist, the driver reads QNN's verbose log; and, where the qualcomm toolchain is
installed, every rule is held against QNN's own validation, and every fixture compiles under HTP emulation
into a context binary, within tolerance, with our placement equal to QNN's."""

import importlib.util
import json
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from flexdsa_core.targets import load_target
from flexdsa_core.targets.base import BucketModel
from flexdsa_core.targets.qualcomm import ADAPTER
from flexdsa_core.toolchains import get_toolchain
from tests.core.fusions.harness import parse, run
from tests.core.targets import _bundle_checks as checks

TARGET = load_target("qualcomm-sm8650")
# The report section toolchain_options reads: precision int8 asks for uint8 QDQ (uint16 on a miss).
INT8 = {"precision": {"requested": "int8"}}
DRIVER = (
    Path(__file__).resolve().parents[3] / "flexdsa_core" / "targets" / "qualcomm" / "driver.py"
)
HEAD = '<ir_version: 9, opset_import: ["" : 17]>\n'


def _model(text: str) -> ir.Model:
    return ir.from_proto(parse(text))


def _reason(text: str, op_type: str) -> str | None:
    return checks.fallback_reason(ADAPTER, TARGET, text, op_type)


# Probe graphs: (name, ONNX text, the op whose placement is judged, whether QNN runs it on the HTP).
# Each refusal is one that onnxruntime-qnn 2.7.0's HTP validation gave on this graph.
PROBES = [
    ("erf", "g (float[4, 8] x) => (float[4, 8] y) { y = Erf (x) }", "Erf", False),
    ("gelu_ms", None, "Gelu", True),
    ("argmax_last_index",
     "g (float[4, 8] x) => (int64[4, 1] y) { y = ArgMax <axis = 1, select_last_index = 1> (x) }", "ArgMax", False),
    ("argmax", "g (float[4, 8] x) => (int64[4, 1] y) { y = ArgMax <axis = 1> (x) }", "ArgMax", True),
    ("cumsum_reverse", "g (float[4, 8] x) => (float[4, 8] y) "
     "{ a = Constant <value = int64 {1}> () y = CumSum <reverse = 1> (x, a) }", "CumSum", False),
    ("cumsum", "g (float[4, 8] x) => (float[4, 8] y) { a = Constant <value = int64 {1}> () y = CumSum (x, a) }",
     "CumSum", True),
    ("pad_wrap", "g (float[1, 2, 8, 8] x) => (float[1, 2, 10, 10] y) "
     "{ p = Constant <value = int64[8] {0, 0, 1, 1, 0, 0, 1, 1}> () y = Pad <mode = \"wrap\"> (x, p) }", "Pad", False),
    ("pad_reflect", "g (float[1, 2, 8, 8] x) => (float[1, 2, 10, 10] y) "
     "{ p = Constant <value = int64[8] {0, 0, 1, 1, 0, 0, 1, 1}> () y = Pad <mode = \"reflect\"> (x, p) }", "Pad", True),
    ("maxpool_dilated", "g (float[1, 4, 9, 9] x) => (float[1, 4, 7, 7] y) "
     "{ y = MaxPool <kernel_shape = [2, 2], dilations = [2, 2]> (x) }", "MaxPool", False),
    ("maxpool_3d", "g (float[1, 4, 4, 8, 8] x) => (float[1, 4, 2, 4, 4] y) "
     "{ y = MaxPool <kernel_shape = [2, 2, 2], strides = [2, 2, 2]> (x) }", "MaxPool", False),
    ("maxpool_ceil", "g (float[1, 4, 9, 9] x) => (float[1, 4, 5, 5] y) "
     "{ y = MaxPool <kernel_shape = [2, 2], strides = [2, 2], ceil_mode = 1> (x) }", "MaxPool", True),
    ("clip_runtime_min", "g (float[4, 8] x, float lo) => (float[4, 8] y) { y = Clip (x, lo) }", "Clip", False),
    ("add_rank6", "g (float[1, 2, 2, 2, 2, 2] a, float[1, 2, 2, 2, 2, 2] b) => (float[1, 2, 2, 2, 2, 2] y) "
     "{ y = Add (a, b) }", "Add", False),
    ("transpose_rank5", "g (float[1, 2, 2, 2, 3] a) => (float[3, 2, 2, 2, 1] y) "
     "{ y = Transpose <perm = [4, 3, 2, 1, 0]> (a) }", "Transpose", True),
    ("layernorm_axis1", "g (float[2, 4, 8] x, float[4, 8] s) => (float[2, 4, 8] y) "
     "{ y = LayerNormalization <axis = 1> (x, s) }", "LayerNormalization", False),
    ("layernorm_last", "g (float[2, 4, 8] x, float[8] s) => (float[2, 4, 8] y) "
     "{ y = LayerNormalization <axis = -1> (x, s) }", "LayerNormalization", True),
    ("einsum_one_input", "g (float[2, 3, 4] a) => (float[2] y) { y = Einsum <equation = \"bij->b\"> (a) }",
     "Einsum", False),
    ("einsum", "g (float[2, 3, 4] a, float[2, 4, 5] b) => (float[2, 3, 5] y) "
     "{ y = Einsum <equation = \"bij,bjk->bik\"> (a, b) }", "Einsum", True),
    ("tile_runtime_repeats", "g (float[2, 8] a, int64[2] r) => (float[4, 8] y) { y = Tile (a, r) }", "Tile", False),
    ("mod_float", "g (float[1, 4] a) => (float[1, 4] y) "
     "{ b = Constant <value = float[1, 4] {2.0, 3.0, 4.0, 5.0}> () y = Mod <fmod = 1> (a, b) }", "Mod", False),
    ("mod_int", "g (int32[1, 4] a) => (int32[1, 4] y) "
     "{ b = Constant <value = int32[1, 4] {2, 3, 4, 5}> () y = Mod (a, b) }", "Mod", True),
    ("reduce_prod", "g (float[1, 4, 8, 8] x) => (float[1, 4, 1, 1] y) "
     "{ y = ReduceProd <axes = [2, 3]> (x) }", "ReduceProd", False),
    ("inverse_3x3", None, "Inverse", False),
    ("inverse_2x2", None, "Inverse", True),
    ("gather_runtime_ids", "g (float[10, 8] t, int64[4] i) => (float[4, 8] y) { y = Gather (t, i) }", "Gather", True),
]  # fmt: skip
GELU_MS = """<ir_version: 9, opset_import: ["" : 17, "com.microsoft" : 1]>
g (float[1, 16] x) => (float[1, 16] y) { y = com.microsoft.Gelu (x) }
"""


INVERSE = """<ir_version: 9, opset_import: ["" : 17, "com.microsoft" : 1]>
g (float[3, N, N] x) => (float[3, N, N] y) { y = com.microsoft.Inverse (x) }
"""


def _probe_text(text: str | None, name: str = "gelu_ms") -> str:
    if name.startswith("inverse"):
        return INVERSE.replace("N", name[-1])
    return GELU_MS if text is None else HEAD + text


# ---- the spec ---------------------------------------------------------------------------------------


def test_spec_carries_only_sourced_figures():
    assert TARGET.peak_ops_per_s == {"int8": 45e12, "float16": None, "float32": None}
    assert TARGET.mem_bandwidth_bytes_per_s == 76.8e9
    assert TARGET.sram_bytes is None and TARGET.power_w is None
    assert TARGET.static_shapes and TARGET.toolchain == "qualcomm" and TARGET.cpu_fallback
    assert (
        "Q11" in TARGET.sources["peak_ops_per_s.int8"]
        and "third-party" in TARGET.sources["peak_ops_per_s.int8"]
    )
    assert "unsourced" in TARGET.sources["sram_bytes"]
    assert "Erf" not in TARGET.supported_ops and "Conv" in TARGET.supported_ops
    assert "com.microsoft::FusedMatMul" in TARGET.supported_ops
    assert set(TARGET.quantization) == {"int8", "int16", "float16"}


def test_onnxruntime_qnn_stays_out_of_the_projects_environment():
    """The plugin EP lives in the qualcomm toolchain's own environment only; the core never imports it."""
    assert importlib.util.find_spec("onnxruntime_qnn") is None
    toolchain = get_toolchain("qualcomm")
    assert toolchain.targets == ("qualcomm-sm8650",) and toolchain.driver_path() == DRIVER
    assert any("onnxruntime-qnn==" in r for group in toolchain.requirements for r in group)


# ---- reasons ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name, text, op_type, on_htp", PROBES, ids=[p[0] for p in PROBES])
def test_probe_reasons(name, text, op_type, on_htp):
    reason = _reason(_probe_text(text, name), op_type)
    if on_htp:
        assert reason is None, reason
    else:
        assert reason and len(reason) > 20, reason


def test_reasons_say_why_in_qnns_words():
    rank6 = next(p[1] for p in PROBES if p[0] == "add_rank6")
    assert _reason(HEAD + rank6, "Add") == (
        "Add: 'a' has rank 6; HTP tensors have at most 5 dims (QNN validation: 'Failed to add node.')"
    )
    ln = next(p[1] for p in PROBES if p[0] == "layernorm_axis1")
    assert "normalises the last axis only" in _reason(HEAD + ln, "LayerNormalization")
    wrap = next(p[1] for p in PROBES if p[0] == "pad_wrap")
    assert "mode='wrap' is not supported" in _reason(HEAD + wrap, "Pad")
    assert "not in the qualcomm-sm8650 op table" in _reason(HEAD + PROBES[0][1], "Erf")


def test_dynamic_dim_is_refused_with_its_name():
    text = HEAD + "g (float[batch, 8] x) => (float[batch, 8] y) { y = Relu (x) }"
    assert "dynamic dim 'batch'" in _reason(text, "Relu")


# ---- legalisation -----------------------------------------------------------------------------------


def test_legalisation_names_nodes_and_keeps_the_numerics():
    text = (
        HEAD
        + """g (float[2, 4, 8] x, float[8] s) => (float[2, 4, 8] y)
{
  n = LayerNormalization (x, s)
  y = Relu (n)
}"""
    )
    before = parse(text)
    model = ir.from_proto(before)
    result = ADAPTER.legalize(model, TARGET, frozenset())
    after = ir.to_proto(result.model)
    assert all(node.name for node in after.graph.node)
    assert {a.name for a in after.graph.node[0].attribute} == {"axis", "epsilon"}
    assert result.applied == []  # QNN takes every fixture as it is: no rewrite of ours is needed
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 4, 8)).astype(np.float32), "s": np.ones(8, np.float32)}
    for want, got in zip(run(before, feeds), run(after, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


# ---- the bundle -------------------------------------------------------------------------------------


def _bucket() -> BucketModel:
    text = (
        HEAD
        + """g (float[1, 8, 16, 16] x, float[8, 8, 3, 3] w) => (float[1, 8, 16, 16] y)
{ y = Conv <pads = [1, 1, 1, 1]> (x, w) }"""
    )
    model = _model(text)
    weight = model.graph.inputs.pop()
    weight.const_value = ir.tensor(np.zeros((8, 8, 3, 3), np.float32))
    model.graph.register_initializer(weight)
    return BucketModel("batch1", model, {"x": [1, 8, 16, 16]})


def test_scripts_parse_and_carry_each_bucket(tmp_path):
    buckets = [_bucket()]
    files = ADAPTER.vendor_files(buckets, TARGET, {})
    assert set(files) == {"compile_qnn.py", "run_qnn.py", "convert_qnn.sh"}
    for name in ("compile_qnn.py", "run_qnn.py"):
        compile(files[name], name, "exec")
    compile_script = files["compile_qnn.py"].decode()
    constants = checks.script_constants(compile_script, "BUCKETS =", "def qnn_devices")
    assert constants["BUCKETS"] == [{
        "name": "batch1", "onnx": "model.batch1.onnx", "qdq": "model.batch1.qdq.onnx",
        "context": "model.batch1.qnn_ctx.onnx", "inputs": ["x"], "shapes": [[1, 8, 16, 16]], "dtypes": ["float32"],
        "precision": "fp16", "act": "uint8", "uint16_tensors": [], "weights": "int8-per-channel", "corrected": False,
    }]  # fmt: skip
    assert constants["PROVIDER"] == {"backend_type": "htp", "htp_arch": "75", "soc_model": "57"}
    shell = tmp_path / "convert_qnn.sh"
    shell.write_bytes(files["convert_qnn.sh"])
    subprocess.run(["bash", "-n", str(shell)], check=True)
    text = files["convert_qnn.sh"].decode()
    assert "qnn-onnx-converter --input_network model.batch1.onnx" in text and "-d x 1,8,16,16" in text
    steps = ADAPTER.deploy_steps(buckets, TARGET, {})
    assert any("model.batch1.qnn_ctx.onnx" in s for s in steps) and any("run_qnn.py" in s for s in steps)


def test_manifest_names_files_that_exist():
    files = ADAPTER.generate([_bucket()], TARGET, {})
    manifest = json.loads(files["manifest.json"])
    assert [entry["name"] for entry in manifest["buckets"]] == ["batch1"], "the manifest should list the one bucket"
    for entry in manifest["buckets"]:
        assert entry["file"] in files
    assert manifest["vendor_files"] == ["compile_qnn.py", "convert_qnn.sh", "run_qnn.py"]
    for name in manifest["vendor_files"]:
        assert name in files
    assert manifest["static_shapes"] is True
    assert "flexdsa toolchains install qualcomm" in files["README.md"].decode()


def test_toolchain_options_ask_for_the_sm8650_htp():
    options = ADAPTER.toolchain_options(TARGET, INT8)
    core = options.pop("correct_biases")
    # Learned rounding runs with the same interpreter, on a uint8 build that misses the target.
    assert options.pop("learn_rounding") == core
    assert options == {
        "precision": "int8",
        "activation_type": "auto",
        "provider": {"backend_type": "htp", "htp_arch": "75", "soc_model": "57"},
        "conv_per_channel": True,
        "matmul_per_channel": True,
    }
    # The driver runs the core's bias correction and learned rounding with this interpreter, from the folder
    # holding flexdsa_core.
    assert Path(core["python"]).is_file() and (Path(core["path"]) / "flexdsa_core" / "precision").is_dir()
    # The vendor alone keeps QNN's defaults: uint8 per-tensor weights, the quantiser's own biases.
    assert {**options, **ADAPTER.vendor_alone_options} == {
        **options, "vendor_preprocess": True, "conv_per_channel": False, "matmul_per_channel": False,
        "correct_biases": None,
        "learn_rounding": None, "packed_uint16": None,
    }
    # fp16 quantises nothing: no weight format, no correction.
    fp16 = ADAPTER.toolchain_options(TARGET, {"precision": {"requested": "fp16"}})
    assert not {"correct_biases", "learn_rounding", "conv_per_channel", "matmul_per_channel"} & set(fp16)


def test_mixed_bundle_script_carries_the_plans_uint16_tensors(tmp_path):
    """A bundle made under precision mixed: compile_qnn.py's bucket lists the tensors of the layers the search
    kept out of int8, and quantises them at uint16 by default, as the toolchain run here would."""
    report = checks.mixed_bundle("qualcomm-sm8650", tmp_path)
    [bucket] = checks.script_constants(
        (tmp_path / "compile_qnn.py").read_text(), "BUCKETS =", "def qnn_devices"
    )["BUCKETS"]
    assert bucket["act"] == "mixed" and bucket["uint16_tensors"] == ["r", "wide", "y"]
    assert ADAPTER.toolchain_options(TARGET, report)["uint16_tensors"] == {"batch1": bucket["uint16_tensors"]}
    readme = (tmp_path / "README.md").read_text()
    assert (
        "the mixed plan's float layers kept out of it, their tensors at uint16 (3 in bucket batch1)" in readme
    )
    # Where the toolchain here had to go a16w8 everywhere, that is the script's default.
    ran = {**report, "toolchain": {"buckets": {"batch1": {"quantization": "QDQ: uint16 activations, ..."}}}}
    files = ADAPTER.vendor_files(
        [BucketModel("batch1", ir.load(tmp_path / "model.batch1.onnx"), {})], TARGET, ran
    )
    [bucket] = checks.script_constants(files["compile_qnn.py"].decode(), "BUCKETS =", "def qnn_devices")[
        "BUCKETS"
    ]
    assert bucket["act"] == "uint16"


# ---- the driver's reading of QNN's verbose log -------------------------------------------------------


def _driver():
    spec = importlib.util.spec_from_file_location("qualcomm_driver", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_V = "2026-11-25 08:30:32.572640939 [V:onnxruntime:, "
LOG = f"""\
{_V}qnn_execution_provider.cc:2198 GetCapabilityImpl] GetCapability pass 1 (pre-Layout-Transform)
{_V}qnn_execution_provider.cc:1713 LogNodeSupport] Validation FAILED for 1 nodes in OrtNodeUnit (QuantizeLinear) :
\tOperator type: QuantizeLinear Node name: x_QuantizeLinear Node index: 26
\tREASON : QNN EP is configured to not take Q nodes that consume a graph input.

{_V}qnn_execution_provider.cc:1713 LogNodeSupport] Validation PASSED for 5 nodes in OrtNodeUnit (Conv) :
\tOperator type: DequantizeLinear Node name: x_DequantizeLinear Node index: 27
\tOperator type: Conv Node name: conv Node index: 28
\tOperator type: QuantizeLinear Node name: c_QuantizeLinear Node index: 29
{_V}qnn_execution_provider.cc:1713 LogNodeSupport] Validation FAILED for 1 nodes in OrtNodeUnit (Erf) :
\tOperator type: Erf Node name: erf Node index: 30
\tREASON : Operators of type `Erf` are not supported by QNN EP.Erf node `erf` will not be assigned to QNN EP.

{_V}qnn_execution_provider.cc:2198 GetCapabilityImpl] GetCapability pass 2 (post-Layout-Transform)
{_V}qnn_execution_provider.cc:1713 LogNodeSupport] Validation PASSED for 5 nodes in OrtNodeUnit (Conv) :
\tOperator type: Conv Node name: conv_token_1 Node index: 96
{_V}session_state.cc:1598 VerifyEachNodeIsAssignedToAnEp] Node placements
{_V}session_state.cc:1604 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [QNNExecutionProvider]. Number of nodes: 1
{_V}session_state.cc:1606 VerifyEachNodeIsAssignedToAnEp]   QNNExecutionProvider_1_1 (QNNExecutionProvider_1_1_0)
{_V}session_state.cc:1604 VerifyEachNodeIsAssignedToAnEp]  Node(s) placed on [CPUExecutionProvider]. Number of nodes: 2
{_V}session_state.cc:1606 VerifyEachNodeIsAssignedToAnEp]   QuantizeLinear (x_QuantizeLinear)
{_V}session_state.cc:1606 VerifyEachNodeIsAssignedToAnEp]   Erf (erf)
{_V}session_state.cc:1618 VerifyEachNodeIsAssignedToAnEp] Some nodes were not assigned to the preferred providers
"""


def test_verbose_log_becomes_placement_and_reasons():
    driver = _driver()
    units = driver.parse_units(LOG)
    assert [(u["pass"], u["unit"], u["passed"]) for u in units] == [
        (1, "QuantizeLinear", False), (1, "Conv", True), (1, "Erf", False), (2, "Conv", True),
    ]  # fmt: skip
    assert units[3]["nodes"] == ["conv"]  # the layout transform's _token_1 taken off
    assert driver.parse_cpu_nodes(LOG) == {"x_QuantizeLinear", "erf"}
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
         onnx.helper.make_node("Relu", ["c"], ["r"], name="relu"),
         onnx.helper.make_node("Erf", ["r"], ["y"], name="erf")],
        "g", [], [],
    )  # fmt: skip
    placement, reasons = driver.place_nodes({"conv", "relu", "erf"}, units, driver.parse_cpu_nodes(LOG))
    assert placement == {"conv": "accelerator", "erf": "cpu"}
    assert reasons == {"erf": "Operators of type `Erf` are not supported by QNN EP.Erf node `erf` will not be "
                       "assigned to QNN EP."}  # fmt: skip
    # The quantiser folded the Relu into the Conv's output range: it runs where the Conv runs.
    assert driver.place_folded(graph, {"conv", "erf"}, placement) == ["relu"]
    assert placement["relu"] == "accelerator"


# ---- with onnxruntime-qnn installed -----------------------------------------------------------------


def _toolchain_or_skip():
    return checks.toolchain_or_skip("qualcomm", "onnxruntime-qnn")


def _int8_on_calibration(name: str):
    """The trained fixture ``name`` optimised for the target at ``precision: int8`` on its calibration part."""
    import io

    from bench.trained import fixture as trained_fixture
    from flexdsa_core import FlexDSAOptimizer, OptimizeOptions

    trained = trained_fixture(name)
    calibration, _ = trained.split()
    buffer = io.BytesIO()
    np.savez(buffer, **calibration)
    options = OptimizeOptions(precision="int8", accuracy=trained.accuracy, measure_latency=False)
    return FlexDSAOptimizer(TARGET, toolchain_root=checks.TOOLCHAIN_ROOT).optimize(
        trained.model, options, calibration=buffer.getvalue()
    )


def _through_driver(toolchain, proto: onnx.ModelProto, tmp_path: Path) -> tuple[ir.Model, dict, dict]:
    model = ir.from_proto(proto)
    ADAPTER.legalize(model, TARGET, frozenset())
    path = tmp_path / "model.b.onnx"
    ir.save(model, path)
    rng = np.random.default_rng(0)
    feeds = {}
    for value in model.graph.inputs:
        shape = [int(d) for d in value.shape]
        dtype = value.dtype.numpy()
        array = (rng.integers(0, 4, shape) if dtype.kind in "iu" else rng.standard_normal(shape)).astype(
            dtype
        )
        feeds[value.name] = array
    options = ADAPTER.toolchain_options(TARGET, INT8)
    bucket = checks.run_bucket(toolchain, TARGET, path, feeds, tmp_path, options)
    return model, bucket, feeds


@pytest.mark.parametrize("name, text, op_type, on_htp", PROBES, ids=[p[0] for p in PROBES])
def test_probe_placement_equals_qnns(name, text, op_type, on_htp, tmp_path):
    """Every rule of ours, held against QNN's own validation on the same graph."""
    toolchain = _toolchain_or_skip()
    model, bucket, _ = _through_driver(toolchain, parse(_probe_text(text, name)), tmp_path)
    node = next(n for n in model.graph if n.op_type == op_type)
    ours = "cpu" if ADAPTER.fallback_reason(node, TARGET) else "accelerator"
    assert bucket["placement"][node.name] == ours == ("accelerator" if on_htp else "cpu"), bucket.get(
        "reasons"
    )
    if not on_htp:
        assert bucket["reasons"][node.name]  # QNN said why


def test_small_graph_compiles_to_a_context_binary(tmp_path):
    toolchain = _toolchain_or_skip()
    text = (
        HEAD
        + """g (float[1, 3, 16, 16] x) => (float[1, 8, 16, 16] y)
{
  c = Conv <pads = [1, 1, 1, 1]> (x, w)
  y = Relu (c)
}"""
    )
    proto = parse(text.replace("(float[1, 3, 16, 16] x)", "(float[1, 3, 16, 16] x, float[8, 3, 3, 3] w)"))
    rng = np.random.default_rng(1)
    weight = onnx.numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    proto.graph.initializer.append(weight)
    del proto.graph.input[1]
    model, bucket, feeds = _through_driver(toolchain, proto, tmp_path)
    assert bucket["artifacts"] == ["model.b.qdq.onnx", "model.b.qnn_ctx.onnx", "model.b.qnn_ctx_qnn.bin"]
    for artifact in bucket["artifacts"]:
        assert (tmp_path / "out" / artifact).stat().st_size > 0
    assert bucket["placement"] == {"Conv_0": "accelerator", "Relu_1": "accelerator"}
    want = run(ir.to_proto(model), feeds)[0]
    got = np.load(bucket["outputs"]["y"])
    assert got.shape == want.shape
    cosine = checks.cosine(want, got)
    assert cosine > 0.999, cosine  # uint8 QDQ on the emulated HTP


@pytest.mark.parametrize(
    "name, buckets",
    [("resnet", None), ("mobilenetv2", None), ("bert", {"batch": [1], "seq": [16]}),
     ("gpt2", {"batch": [1], "seq": [16]}), ("llama", {"batch": [1], "seq": [16]}), ("vit", None)],
)  # fmt: skip
def test_fixture_compiles_under_htp_emulation(name, buckets):
    _toolchain_or_skip()
    # Random-weight fixtures on synthetic inputs have near-tied logits: judged by cosine, as before, not top-1.
    result, toolchain = checks.optimized_with_toolchain(
        "qualcomm-sm8650", name, shape_buckets=buckets, precision="int8", accuracy={"top1_outputs": []}
    )
    assert toolchain["buckets"], f"{name}: expected the toolchain section to list the buckets it compiled; it lists none"
    assert set(toolchain["buckets"]) == {b.name for b in result.buckets}, (name, list(toolchain["buckets"]))
    for bucket, entry in toolchain["buckets"].items():
        assert f"model.{bucket}.qnn_ctx.onnx" in result.artifacts
        assert f"model.{bucket}.qnn_ctx_qnn.bin" in result.artifacts  # the context binary
        assert entry["numerics"], f"{name}/{bucket}: expected the emulated outputs compared to ONNX Runtime's"
        for output in entry["numerics"]:
            assert output["cosine"] >= 0.99, (name, output)  # quantised: the accuracy target, not fp32 bars
        agreement = entry["placement_agreement"]
        assert agreement["share"] == 1.0, json.dumps(agreement)
        # QNN's log speaks for every node of ours (none unaccounted for).
        assert agreement["compared"] == len(result.report["partition"][bucket]["placement"]), agreement


def test_fixture_with_cpu_fallbacks_agrees_node_for_node():
    """BERT with the erf-GELU fusion switched off: the two Erf nodes are not in the QNN EP's op set; our
    partition puts them on the CPU, and QNN leaves exactly them on the CPU. The vendor alone (the original
    through qnn_preprocess_model, which fuses the GELU) leaves none there, so never worse than the vendor
    alone, the original ships, built as the vendor alone built it, and the report says why."""
    _toolchain_or_skip()
    result, toolchain = checks.optimized_with_toolchain(
        "qualcomm-sm8650",
        "bert",
        shape_buckets={"batch": [1], "seq": [16]},
        disabled_rules=["gelu_erf"],
        precision="int8",
        accuracy={"top1_outputs": []},
    )
    [(bucket, entry)] = toolchain["buckets"].items()
    part = result.report["partition"][bucket]
    assert sorted(f["node"] for f in part["fallback"]) == ["/layers.0/Erf", "/layers.1/Erf"]
    plan = json.loads(result.artifacts["fusion_plan.json"])[bucket]["vendor_exploration"]
    ours = next(c for c in plan["candidates"] if c["candidate"] == "ours")
    assert sorted(ours["vendor"]["cpu_layers"]) == ["/layers.0/Erf", "/layers.1/Erf"]
    vendor = result.report["vendor"]["buckets"][bucket]
    assert vendor["shipped"] == "original" and vendor["vendor_alone"]["cpu_nodes"] == 0
    assert "2 node(s) of ours on the CPU and 0 of the original alone" in vendor["decision"]
    assert vendor["ours"]["cpu_nodes"] == 0  # the shipped build, prepared as the vendor alone's
    assert min(o["cosine"] for o in entry["numerics"]) >= 0.99


def test_mixed_bundle_script_quantises_the_float_layers_tensors_at_uint16(tmp_path):
    """compile_qnn.py from a mixed bundle, run with onnxruntime-qnn on the bundle's calibration samples: the
    float layers' tensors come out uint16 in its QDQ model, the rest uint8, and it compiles for the HTP; with
    --act uint8 everything is uint8."""
    toolchain = _toolchain_or_skip()
    checks.mixed_bundle("qualcomm-sm8650", tmp_path)
    out = checks.run_script(toolchain, tmp_path, "compile_qnn.py")  # the bundle's own samples by default
    assert "samples from dataset.txt" in out and "activations mixed (3 tensor(s) at uint16)" in out
    assert "wrote rebuilt/model.batch1.qnn_ctx.onnx" in out
    assert (tmp_path / "rebuilt" / "model.batch1.qnn_ctx.onnx").is_file()
    types = checks.quantize_types(tmp_path / "rebuilt" / "model.batch1.qdq.onnx")
    uint8, uint16 = onnx.TensorProto.UINT8, onnx.TensorProto.UINT16
    assert {t: types[t] for t in ("r", "wide", "y")} == {"r": uint16, "wide": uint16, "y": uint16}
    assert types["x"] == types["h"] == uint8
    checks.run_script(
        toolchain, tmp_path, "compile_qnn.py", "--dataset", "dataset.txt", "--act", "uint8", "--out", "uint8"
    )
    types = checks.quantize_types(tmp_path / "uint8" / "model.batch1.qdq.onnx")
    assert {types[t] for t in ("x", "r", "wide", "y")} == {uint8}, types
    # The MatMul weights: int8 per output channel, as the toolchain here quantises them (the bundle's "weights").
    assert {types[w] for w in ("w1", "w2", "w3")} == {onnx.TensorProto.INT8}, types


def test_fp16_runs_the_float_graph_on_the_htp(tmp_path):
    toolchain = _toolchain_or_skip()
    text = (
        HEAD
        + """g (float[2, 16, 32] x, float[32] s) => (float[2, 16, 32] y)
{
  n = LayerNormalization (x, s)
  y = Softmax <axis = -1> (n)
}"""
    )
    model = ir.from_proto(parse(text))
    ADAPTER.legalize(model, TARGET, frozenset())
    path = tmp_path / "model.b.onnx"
    ir.save(model, path)
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((2, 16, 32)).astype(np.float32), "s": np.ones(32, np.float32)}
    options = ADAPTER.toolchain_options(TARGET, {"precision": {"requested": "fp16"}})
    bucket = checks.run_bucket(toolchain, TARGET, path, feeds, tmp_path, options)
    assert bucket["artifacts"] == ["model.b.qnn_ctx.onnx", "model.b.qnn_ctx_qnn.bin"]  # no QDQ model
    assert set(bucket["placement"].values()) == {"accelerator"} and len(bucket["placement"]) == 2
    want = run(ir.to_proto(model), feeds)[0]
    np.testing.assert_allclose(np.load(bucket["outputs"]["y"]), want, atol=2e-3)  # fp16 on the HTP


@pytest.mark.timeout(600)
def test_a_uint8_build_below_the_target_is_quantised_again_with_learned_rounding_before_uint16(tmp_path):
    """The ladder under ``activation_type: auto``: a uint8 build below ``min_cosine`` on the samples is quantised
    again with its int8 weights' rounding learned (the core's AdaRound, run with the core's interpreter, before the
    bias correction), still uint8 activations, and judged again; only then uint16 everywhere. A target no 8-bit
    build meets (cosine 0.999999) walks the whole ladder; each rung says what it reached. A build further below
    the target than ``learn_rounding_within`` skips the learned rung."""
    toolchain = _toolchain_or_skip()
    from tests.core.precision.test_bias_correction import _depthwise_net

    path = tmp_path / "model.b.onnx"
    _depthwise_net(path)
    model = onnx.load(str(path))
    for index, node in enumerate(model.graph.node):
        node.name = f"{node.op_type.lower()}{index}"  # as the core's buckets are: QNN and AdaRound go by name
    onnx.save(model, str(path))
    rng = np.random.default_rng(3)
    samples = [{"x": rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)} for _ in range(8)]
    options = {**ADAPTER.toolchain_options(TARGET, INT8), "min_cosine": 0.999999}
    bucket = checks.run_bucket(toolchain, TARGET, path, samples[0], tmp_path, options, samples=samples)
    assert not bucket.get("error"), bucket.get("error")
    [uint8, learned] = [note for note in bucket["notes"] if "below 0.999999" in note]
    assert uint8.startswith("uint8 activations gave cosine") and "rounding learned on the calibration" in uint8
    assert learned.startswith("uint8 activations with learned rounding gave cosine") and "uint16" in learned
    # Every quantised layer's rounding was learned (3 Convs, the Gemm head), each below nearest's output error.
    assert "4 layers' weight rounding learned on 8 calibration samples by Flex-DSA's AdaRound" in learned, learned
    cosines = [float(note.split("cosine ")[1].split(" ")[0]) for note in (uint8, learned)]
    assert all(0.9 < c < 0.999999 for c in cosines), cosines
    assert bucket["quantization"].startswith("QDQ: uint16 activations"), bucket["quantization"]
    assert "rounding learned" not in bucket["quantization"]  # the uint16 rung is built without it

    # On this net learned rounding gains (deterministic: QDQ and emulation are). With the target between the two,
    # uint8 with learned rounding ships: no uint16 build.
    assert cosines[1] > cosines[0], cosines
    options["min_cosine"] = (cosines[0] + cosines[1]) / 2
    (tmp_path / "met").mkdir()
    bucket = checks.run_bucket(toolchain, TARGET, path, samples[0], tmp_path / "met", options, samples=samples)
    assert bucket["quantization"].startswith("QDQ: uint8 activations"), bucket["quantization"]
    assert "4 layers' weight rounding learned" in bucket["quantization"], bucket["quantization"]
    assert not any("uint16" in note for note in bucket["notes"]), bucket["notes"]
    # The shipped QDQ model carries the learned weights: the bundle's compile_qnn.py builds from it, uint8.
    from flexdsa_core.targets.qualcomm.adapter import _bucket_entry

    entry = _bucket_entry("model.b.onnx", BucketModel("b", ir.load(path), {}), ran=bucket)
    assert entry["corrected"] and entry["act"] == "uint8", entry

    # A build further below the target than learned rounding recovers goes straight to uint16: where uint8 missed
    # by more on the trained models, the activations lost it (here the margin is made tiny to show it).
    (tmp_path / "far").mkdir()
    far = {**options, "learn_rounding_within": 1e-6}
    bucket = checks.run_bucket(toolchain, TARGET, path, samples[0], tmp_path / "far", far, samples=samples)
    [note] = [note for note in bucket["notes"] if "below" in note]
    assert "learned rounding not tried, more than 1e-06 below" in note and note.endswith("(a16w8)"), note
    assert bucket["quantization"].startswith("QDQ: uint16 activations"), bucket["quantization"]


@pytest.mark.models
@pytest.mark.timeout(1200)
def test_a_depthwise_cnn_ships_uint8_on_the_htp_where_qnns_defaults_lose_it():
    """EfficientNet-Lite0, trained, on real photos. QNN's defaults (uint8 weights per tensor, MinMax) give its
    logits cosine 0.82 to the float model on held-out photos in HTP emulation (worst photo 0.58): a depthwise
    filter's few weights share one scale with the whole layer. Per-channel int8 weights give 0.986, and the
    core's bias correction of QNN's own QDQ model 0.998. So int8 ships with uint8 activations (no fall back to
    uint16), every node on the HTP, and the shipped QDQ model keeps the target on the photos the job never saw."""
    _toolchain_or_skip()
    import io

    from bench.trained import fixture as trained_fixture
    from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
    from flexdsa_core.accuracy import score
    from flexdsa_core.options import AccuracyTarget

    trained = trained_fixture("efficientnet-lite0")
    calibration, held_out = trained.split()
    buffer = io.BytesIO()
    np.savez(buffer, **calibration)
    options = OptimizeOptions(precision="int8", accuracy=trained.accuracy, measure_latency=False,
                              shape_buckets={"batch": [1]})  # fmt: skip
    result = FlexDSAOptimizer(TARGET, toolchain_root=checks.TOOLCHAIN_ROOT).optimize(
        trained.model, options, calibration=buffer.getvalue()
    )
    assert result.report["precision"]["shipped"] == "int8"
    [(bucket, entry)] = result.report["toolchain"]["buckets"].items()
    assert entry["quantization"].startswith(
        "QDQ: uint8 activations, uint8 per-tensor, Conv's int8 per-channel, MatMul/Gemm's int8 per-channel"
    ), entry["quantization"]
    assert "Conv biases corrected" in entry["quantization"]
    assert entry["accuracy"]["ok"] and "held-out" in entry["accuracy"]["measured_on"], entry["accuracy"]
    assert set(entry["vendor_placement"].values()) == {"accelerator"}
    # The bundle's compile_qnn.py builds from the shipped, corrected QDQ model, not from a fresh quantisation.
    script = result.artifacts["compile_qnn.py"]
    script = (script if isinstance(script, bytes) else Path(script).read_bytes()).decode()
    [listed] = checks.script_constants(script, "BUCKETS =", "def qnn_devices")["BUCKETS"]
    assert listed["corrected"] and listed["weights"] == "int8-per-channel", listed
    qdq = result.artifacts[f"model.{bucket}.qdq.onnx"]
    qdq = qdq if isinstance(qdq, bytes) else Path(qdq).read_bytes()
    feeds = trained.feeds(held_out)
    names = [o.name for o in onnx.load_from_string(qdq).graph.output]

    def outputs(model):
        import onnxruntime as ort

        # The QDQ model's own numerics, as QNN compiles it: its Quantize/DequantizeLinear evaluated as written.
        # Not fused into ONNX Runtime's CPU int8 kernels: without VNNI their uint8 x int8 products go through
        # 16-bit pair sums that saturate (this model: cosine 0.90 on an AVX2-only CPU, 0.998 as written).
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        return [dict(zip(names, session.run(names, feed), strict=True)) for feed in feeds]

    found = score(outputs(str(trained.model)), outputs(qdq), AccuracyTarget(**trained.accuracy))
    assert found["ok"], found
    assert found["outputs"]["logits"]["cosine"] >= 0.99, found["outputs"]["logits"]


@pytest.mark.models
@pytest.mark.timeout(1200)
def test_a_sentence_encoder_ships_int8_on_the_htp_with_its_projections_weights_per_channel():
    """MiniLM-L6, trained, on real sentences. QNN's uint8 weights with one scale per tensor let a projection's
    outlier columns set the whole matrix's scale: even at uint16 activations its embedding reached cosine 0.9893
    on held-out sentences, below the target, and the job shipped fp32. With MatMul/Gemm weights int8 per output
    channel (as Conv's) a16w8 keeps the target on the sentences the job never saw, every node on the HTP."""
    _toolchain_or_skip()
    result = _int8_on_calibration("minilm-l6")
    assert result.report["precision"]["shipped"] == "int8", result.report["precision"]["warnings"]
    [(_, entry)] = result.report["toolchain"]["buckets"].items()
    assert "MatMul/Gemm's int8 per-channel" in entry["quantization"], entry["quantization"]
    embedding = entry["accuracy"]["outputs"]["sentence_embedding"]
    assert entry["accuracy"]["ok"] and "held-out" in entry["accuracy"]["measured_on"], entry["accuracy"]
    assert embedding["cosine_bound"] >= 0.99, embedding
    assert set(entry["vendor_placement"].values()) == {"accelerator"}


def test_a_packed_outputs_tensors_go_uint16_where_the_samples_show_unlike_ranges():
    """The core finds the pack on the calibration samples (``forms.packed_outputs``) and hands its tensors to the
    driver as uint16 overrides: the Concat's computed inputs, its output and the shape-only ops after it. A pack
    of alike quantities asks for nothing; the vendor alone never gets them."""
    from tests.core.targets.forms.test_packed_outputs import _detector, _samples

    bucket = BucketModel("static", _detector(), {})
    options = ADAPTER.calibrated_options(bucket, _samples())
    assert options["packed_uint16"] == ["boxes", "score", "packed", "cells", "detections"]
    assert "pack" in options["packed_sites"]
    assert ADAPTER.calibrated_options(BucketModel("static", _detector(box_scale=1.0), {}), _samples()) == {}
    assert ADAPTER.vendor_alone_options["packed_uint16"] is None


@pytest.mark.models
@pytest.mark.timeout(1200)
def test_a_detector_whose_output_packs_boxes_and_scores_ships_uint8_with_the_pack_at_uint16():
    """MTCNN's P-Net, trained, on real photos: its one output packs boxes in pixels (up to about 170) with scores
    in 0..1. At QNN's one uint8 scale for the pack the scores were at cosine 0.7959 on held-out photos, and int8
    failed. With the pack's tensors at uint16 the scores keep the target on the held-out samples in HTP
    emulation, and every node stays on the HTP."""
    _toolchain_or_skip()
    result = _int8_on_calibration("mtcnn-pnet")
    assert result.report["precision"]["shipped"] == "int8", result.report["precision"]["warnings"]
    [(bucket, entry)] = result.report["toolchain"]["buckets"].items()
    assert "tensor(s) of a packed output at uint16" in entry["quantization"], entry["quantization"]
    scores = entry["accuracy"]["outputs"]["detections"]["slices"]["scores"]
    assert entry["accuracy"]["ok"] and scores["cosine"] >= 0.99, scores
    assert set(entry["vendor_placement"].values()) == {"accelerator"}
    # The bundle's compile_qnn.py, asked to quantise again, raises the same tensors.
    script = result.artifacts["compile_qnn.py"]
    script = (script if isinstance(script, bytes) else Path(script).read_bytes()).decode()
    [listed] = checks.script_constants(script, "BUCKETS =", "def qnn_devices")["BUCKETS"]
    assert listed["act"] == "mixed" and set(entry["packed_uint16"]) <= set(listed["uint16_tensors"]), listed
