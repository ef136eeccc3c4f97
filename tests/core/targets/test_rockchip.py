"""Rockchip RK3588 (rknn-toolkit2): the sourced limits refuse with their reasons, the adapter's own
reasons (CPU-only ops, run-time integer tensors), the legalisation rewrites keep the numerics, the bundle's
convert_rknn.py compiles, the driver reads the toolkit's layer table; and, where the toolchain is installed,
real fixtures compile with rknn-toolkit2 and its simulator matches ONNX Runtime."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from flexdsa_core.targets import load_target
from flexdsa_core.targets.base import BucketModel
from flexdsa_core.targets.rockchip import ADAPTER
from tests.core.fusions.harness import parse, run
from tests.core.targets import _bundle_checks as checks

TARGET = load_target("rockchip-rk3588")
DRIVER = (
    Path(__file__).resolve().parents[3] / "flexdsa_core" / "targets" / "rockchip" / "driver.py"
)


def _model(text: str) -> ir.Model:
    return ir.from_proto(parse(text))


def _reason(text: str, op_type: str) -> str | None:
    return checks.fallback_reason(ADAPTER, TARGET, text, op_type)


def _conv(kernel: int, group: int = 1, pads: int = 0) -> str:
    per_group = 8 // group
    return f"""
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 8, 64, 64] x, float[8, {per_group}, {kernel}, {kernel}] w) => (float[1, 8, 64, 64] y)
{{ y = Conv <group = {group}, pads = [{pads}, {pads}, {pads}, {pads}]> (x, w) }}
"""


# ---- the spec ---------------------------------------------------------------------------------------


def test_spec_carries_only_sourced_figures():
    assert TARGET.peak_ops_per_s == {"int8": 6e12, "float16": None, "float32": None}
    assert TARGET.mem_bandwidth_bytes_per_s == 34e9
    assert TARGET.sram_bytes == 3 * 384 * 1024
    assert TARGET.power_w is None
    assert TARGET.static_shapes and TARGET.toolchain == "rockchip" and TARGET.cpu_fallback
    assert "R6" in TARGET.sources["sram_bytes"] and "third-party" in TARGET.sources["sram_bytes"]
    assert "Neg" not in TARGET.supported_ops and "Conv" in TARGET.supported_ops


# ---- reasons ----------------------------------------------------------------------------------------


def _split_note(text: str) -> str | None:
    node = next(n for n in ir.from_proto(parse(text)).graph)
    return ADAPTER.split_note(node, TARGET)


def test_conv_over_the_kernel_limit_stays_on_the_npu_split_by_the_toolkit():
    """R2 documents kernel <= 31; rknn-toolkit2 2.5.0 splits a larger one into several NPU layers itself
    (seen in its layer table), so it is no fallback, and the report says what it costs."""
    assert _reason(_conv(33), "Conv") is None
    assert _split_note(_conv(33)) == (
        "Conv: kernel 33x33 exceeds the limit of 31 (R2); stays on the accelerator, split by the vendor compiler"
    )
    assert _split_note(_conv(31)) is None


def test_depthwise_kernel_limit():
    assert _reason(_conv(9, group=8, pads=4), "Conv") is None
    assert "depthwise kernel 9x9 exceeds the limit of 8 (R2)" in _split_note(_conv(9, group=8, pads=4))
    assert _split_note(_conv(7, group=8, pads=3)) is None


def test_maxpool_ceil_mode_and_dims():
    ceil = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 8, 64, 64] x) => (float[1, 8, 32, 32] y)
{ y = MaxPool <kernel_shape = [3, 3], strides = [2, 2], ceil_mode = 1> (x) }
"""
    assert _reason(ceil, "MaxPool") is None
    assert "ceil_mode=1 is not supported (only 0) (R2)" in _split_note(ceil)
    wide = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 8, 2, 9000] x) => (float[1, 8, 1, 4500] y)
{ y = MaxPool <kernel_shape = [2, 2], strides = [2, 2]> (x) }
"""
    assert _reason(wide, "MaxPool") == "MaxPool: W = 9000 exceeds the limit of 8192 on the RK3588 NPU (R2)"


def test_softmax_needs_batch_one():
    text = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[{b}, 4, 16, 16] x) => (float[{b}, 4, 16, 16] y)
{{ y = Softmax <axis = -1> (x) }}
"""
    assert "batch 2 exceeds the supported batch of 1" in _reason(text.format(b=2), "Softmax")
    assert _reason(text.format(b=1), "Softmax") is None


def test_cpu_only_ops_and_integer_tensors_fall_back():
    erf = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 16] x) => (float[1, 16] y)
{ y = Erf (x) }
"""
    assert "Erf has no RK3588 NPU kernel" in _reason(erf, "Erf")
    ids = """
<ir_version: 9, opset_import: ["" : 17]>
g (int64[1, 16] ids, float[100, 8] table) => (float[1, 16, 8] y)
{ y = Gather (table, ids) }
"""
    assert "reads the int64 tensor 'ids'" in _reason(ids, "Gather")
    divide = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 16] x, float[1, 16] z) => (float[1, 16] y)
{ y = Div (x, z) }
"""
    assert "Div by a run-time tensor" in _reason(divide, "Div")


GELU = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[2, 16] x) => (float[2, 16] y)
{
  s = Constant <value = float SCALE> ()
  h = Constant <value = float {0.5}> ()
  one = Constant <value = float {1.0}> ()
  t = Mul (x, s)
  e = Erf (t)
  p = Add (e, one)
  q = Mul (x, p)
  y = Mul (q, h)
}
"""


def _legalized(text: str, disabled=frozenset()):
    proto = parse(text)
    model = ir.from_proto(proto)
    result = ADAPTER.legalize(model, TARGET, frozenset(disabled))
    return proto, ir.to_proto(result.model), result


def _same_numerics(before, after, feeds):
    for want, got in zip(run(before, feeds), run(after, feeds), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_erf_gelu_goes_back_to_the_div_form_the_toolkit_fuses():
    before, after, result = _legalized(GELU.replace("SCALE", "{0.70710677}"))
    assert result.applied == ["gelu_erf_div_form"]
    ops = [n.op_type for n in after.graph.node if n.op_type != "Constant"]
    assert ops == ["Div", "Erf", "Add", "Mul", "Mul"]
    _same_numerics(before, after, {"x": np.linspace(-4, 4, 32, dtype=np.float32).reshape(2, 16)})
    # Now fused with its GELU into exGelu: no CPU fallback for the Erf.
    erf = next(n for n in result.model.graph if n.op_type == "Erf")
    assert ADAPTER.fallback_reason(erf, TARGET) is None


def test_erf_after_another_scale_is_left_alone():
    _, after, result = _legalized(GELU.replace("SCALE", "{0.5}"))
    assert result.applied == []
    assert "Div" not in [n.op_type for n in after.graph.node]


def test_neg_and_sum_become_npu_ops():
    text = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[2, 8] a, float[2, 8] b, float[2, 8] c) => (float[2, 8] y, float[2, 8] n)
{
  n = Neg (a)
  y = Sum (n, b, c)
}
"""
    before, after, result = _legalized(text)
    assert result.applied == ["neg_to_mul", "sum_to_add"]
    assert [n.op_type for n in after.graph.node] == ["Mul", "Add", "Add"]
    assert [o.name for o in after.graph.output] == ["y", "n"]
    rng = np.random.default_rng(0)
    _same_numerics(before, after, {k: rng.standard_normal((2, 8)).astype(np.float32) for k in "abc"})
    for node in result.model.graph:
        assert ADAPTER.fallback_reason(node, TARGET) is None


def test_rewrites_can_be_switched_off():
    _, after, result = _legalized(GELU.replace("SCALE", "{0.70710677}"), disabled={"gelu_erf_div_form"})
    assert result.applied == [] and "Div" not in [n.op_type for n in after.graph.node]


# ---- the bundle -------------------------------------------------------------------------------------


def test_convert_script_compiles_and_carries_each_bucket():
    model = _model(_conv(3, pads=1))
    weight = model.graph.inputs.pop()  # the weights are an initializer in a real bucket
    weight.const_value = ir.tensor(np.zeros((8, 8, 3, 3), np.float32))
    model.graph.register_initializer(weight)
    buckets = [BucketModel("batch1", model, {"x": [1, 8, 64, 64]})]
    files = ADAPTER.vendor_files(buckets, TARGET, {"disabled_rewrites": []})
    script = files["convert_rknn.py"].decode()
    compile(script, "convert_rknn.py", "exec")
    namespace = checks.script_constants(script, "BUCKETS = ", "RECORD_FORMAT = ")
    assert namespace["BUCKETS"] == [{
        "name": "batch1", "onnx": "model.batch1.onnx", "rknn": "model.batch1.rknn", "inputs": ["x"],
        "input_size_list": [[1, 8, 64, 64]], "dtypes": ["float32"], "precision": "float16",
    }]  # fmt: skip
    assert namespace["CONFIG"] == {"target_platform": "rk3588", "optimization_level": 3}
    assert namespace["QUANTIZATION"]["quantized_dtype"] == "w8a8"
    steps = ADAPTER.deploy_steps(buckets, TARGET, {})
    assert any("rknn-toolkit-lite2" in step for step in steps) and any(
        "model.batch1.rknn" in s for s in steps
    )


def test_mixed_bundle_convert_script_carries_the_hybrid_list_and_maps_it_as_the_driver_does(tmp_path):
    """Under precision mixed convert_rknn.py lists the float layers' [input, output] tensors (HYBRID) and maps
    them onto the toolkit's tensor names with the driver's rule before hybrid quantisation: rknn-toolkit2 2.5.0
    refuses our ONNX names ("The input name wide is not exists")."""
    report = checks.mixed_bundle("rockchip-rk3588", tmp_path)
    script = (tmp_path / "convert_rknn.py").read_text()
    compile(script, "convert_rknn.py", "exec")
    namespace = checks.script_constants(script, "BUCKETS = ", "RECORD_FORMAT = ")
    assert namespace["HYBRID"] == {"batch1": [["wide", "y"], ["r", "wide"]]}
    assert namespace["HYBRID"] == ADAPTER.toolchain_options(TARGET, report)["custom_hybrid"]
    # The script imports the mapping from rknn_hybrid.py, shipped beside it: the very file the driver imports.
    assert "from rknn_hybrid import layer_pairs, map_hybrid, quantized_tensors" in script
    for shared in ("rknn_hybrid.py", "rknn_outputs.py"):
        assert (tmp_path / shared).read_bytes() == (DRIVER.parent / shared).read_bytes()
    spec = importlib.util.spec_from_file_location("bundle_rknn_hybrid", tmp_path / "rknn_hybrid.py")
    shipped = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shipped)
    graph = onnx.load(tmp_path / "model.batch1.onnx").graph
    # As rknn-toolkit2 2.5.0 names the MLP's tensors: MatMul outputs get '_mm', the Relu is fused away.
    known = {"x", "x_tp-rs", "h_mm", "h_rs_sw", "wide_mm", "y_mm", "y", "x_int8", "y_int8"}
    pairs = [*namespace["HYBRID"]["batch1"], ["nowhere", "gone"]]
    assert shipped.map_hybrid(pairs, known, graph) == _driver().map_hybrid(pairs, known, graph)
    assert shipped.map_hybrid(pairs, known, graph)[0] == [["wide_mm", "y"], ["h_mm", "wide_mm"]]
    readme = (tmp_path / "README.md").read_text()
    assert "the script keeps the mixed plan's float layers (batch1: widen, sensitive) float16" in readme


# A stand-in for rknn-toolkit2's RKNN class: each call logged as a JSON line (a build's dataset as the files it lists),
# export_rknn writes a file. Enough to run convert_rknn.py's choices (precision, samples, file names) without the toolkit.
FAKE_RKNN = """
import json, os


class RKNN:
    def __init__(self, verbose=False):
        pass

    def _log(self, *call):
        with open(os.environ["FAKE_RKNN_LOG"], "a") as handle:
            handle.write(json.dumps(call) + "\\n")
        return 0

    def config(self, **switches):
        return self._log("config", switches)

    def load_onnx(self, **load):
        return self._log("load_onnx", load)

    def build(self, do_quantization=False, dataset=None, auto_hybrid=False):
        rows = open(dataset).read().split() if dataset else None
        return self._log("build", do_quantization, rows, auto_hybrid)

    def export_rknn(self, path):
        open(path, "w").write("built by the stand-in")
        return self._log("export_rknn", path)

    def release(self):
        pass
"""


def _convert(folder: Path, stub: Path, *args: str):
    """convert_rknn.py run in ``folder`` against the stand-in toolkit; (exit status, output, logged calls)."""
    import os
    import subprocess
    import sys

    (stub / "rknn").mkdir(parents=True, exist_ok=True)
    (stub / "rknn" / "__init__.py").write_text("")
    (stub / "rknn" / "api.py").write_text(FAKE_RKNN)
    log = stub / "calls.jsonl"
    log.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(stub), "FAKE_RKNN_LOG": str(log)}
    done = subprocess.run([sys.executable, "convert_rknn.py", *args], cwd=folder, env=env, capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.is_file() else []
    return done.returncode, done.stdout + done.stderr, calls


def test_convert_script_rebuilds_what_shipped_and_never_overwrites_it(tmp_path):
    """A bundle shipping an int8 .rknn: by default convert_rknn.py rebuilds int8 with the build record's switches on
    the samples the record names (found by sha256 among the bundle's, in the record's order), into rebuilt/; it
    refuses to write over a file there or, without --force, into the bundle's own folder; another precision is a
    flag away."""
    from tests.runtime import rknn_bundles

    folder, stub = tmp_path / "bundle", tmp_path / "stub"
    folder.mkdir()
    calibrated = [3, 0, 7, 12, 5]
    rknn_bundles.shipped(folder, calibrated=calibrated, judged=[1, 2])
    shipped_bytes = (folder / "model.batch1.rknn").read_bytes()
    files = rknn_bundles.sample_files(folder)

    status, out, calls = _convert(folder, stub)
    assert status == 0, out
    assert "batch1: rebuilding as it shipped (int8, model.batch1.rknn.build.json)" in out
    assert "calibrating on the 5 sample(s) of dataset.txt the shipped .rknn was calibrated on (27 held out)" in out
    assert ["config", rknn_bundles.CONFIG] in calls
    [build] = [c for c in calls if c[0] == "build"]
    assert build == ["build", True, [str((folder / files[i]).resolve()) for i in calibrated], False]
    assert ["export_rknn", "rebuilt/model.batch1.rknn"] in calls and "wrote rebuilt/model.batch1.rknn" in out
    assert (folder / "model.batch1.rknn").read_bytes() == shipped_bytes

    status, out, _ = _convert(folder, stub)
    assert status != 0 and "rebuilt/model.batch1.rknn exists: give another --out, or --force to replace it" in out
    status, out, calls = _convert(folder, stub, "--out", ".")
    assert status != 0 and "--out . writes over the shipped .rknn files" in out and calls == []
    assert (folder / "model.batch1.rknn").read_bytes() == shipped_bytes

    status, out, calls = _convert(folder, stub, "--precision", "float16", "--out", "f16")
    assert status == 0, out
    assert [c for c in calls if c[0] == "build"] == [["build", False, None, False]]
    assert ["config", {"target_platform": "rk3588", "optimization_level": 3}] in calls
    assert (folder / "f16" / "model.batch1.rknn").is_file()


# ---- the driver's reading of the toolkit's log -------------------------------------------------------


def _driver():
    spec = importlib.util.spec_from_file_location("rockchip_driver", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LOG = """\
D     convert_gemm_by_exmatmul: remove node = ['fc'], add node = ['fc#1', 'out_rs']
D RKNN: [21:28:47.468]                                    Network Layer Information Table
D RKNN: [21:28:47.468] ----------------------------------------------------------------------------------------
D RKNN: [21:28:47.468] ID   OpType          DataType Target InputShape        OutputShape   Cycles(DDR/NPU/Total)    RW(KB)       FullName
D RKNN: [21:28:47.468] ----------------------------------------------------------------------------------------
D RKNN: [21:28:47.468] 0    InputOperator   FLOAT16  CPU    \\                 (1,3,8,8)     0/0/0                    0            InputOperator:x
D RKNN: [21:28:47.468] 1    ConvRelu        FLOAT16  NPU    (1,3,8,8),(4,3,3,3),(4) (1,4,8,8) 200/576/576            3            Conv:conv_ConvRelu
D RKNN: [21:28:47.468] 2    Erf             FLOAT16  CPU    (1,4,8,8)         (1,4,8,8)     0/0/0                    1            Erf:erf
D RKNN: [21:28:47.468] 3    Conv            FLOAT16  NPU    (1,4,8,8),(2,4,1,1),(2) (1,2,1,1) 64/32/64               1            Conv:fc#2
D RKNN: [21:28:47.468] 4    Reshape         FLOAT16  CPU    (1,2,1,1),(2)     (1,2)         0/0/0                    0            Reshape:out_rs
D RKNN: [21:28:47.468] 5    OutputOperator  FLOAT16  CPU    (1,2)             \\             0/0/0                    0            OutputOperator:y
D RKNN: [21:28:47.468] ----------------------------------------------------------------------------------------
"""


def test_layer_table_becomes_placement_and_cycles():
    onnx = pytest.importorskip("onnx")
    driver = _driver()
    layers = driver.parse_layer_table(LOG)
    assert [(r["op"], r["target"], r["cycles"]) for r in layers][1:3] == [
        ("ConvRelu", "NPU", 576),
        ("Erf", "CPU", 0),
    ]
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Conv", ["x", "w"], ["c"], name="conv"),
         onnx.helper.make_node("Relu", ["c"], ["r"], name="relu"),
         onnx.helper.make_node("Erf", ["r"], ["e"], name="erf"),
         onnx.helper.make_node("Gemm", ["e", "v"], ["y"], name="fc")],
        "g", [], [],
    )  # fmt: skip
    rows, placement = driver.place_nodes(graph, layers, driver.parse_lineage(LOG))
    # The Relu has no layer of its own: fused into the NPU's ConvRelu.
    assert placement == {"conv": "accelerator", "relu": "accelerator", "erf": "cpu", "fc": "accelerator"}
    assert [r["onnx_nodes"] for r in rows if r["op"] == "Reshape"] == [["fc"]]


# ---- with rknn-toolkit2 installed --------------------------------------------------------------------


def _toolchain_or_skip():
    return checks.toolchain_or_skip("rockchip", "rknn-toolkit2")


def test_small_graph_through_the_driver(tmp_path):
    toolchain = _toolchain_or_skip()
    rng = np.random.default_rng(0)
    model = ir.from_proto(checks.conv_relu(rng))
    ADAPTER.legalize(model, TARGET, frozenset())
    path = tmp_path / "model.b.onnx"
    ir.save(model, path)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    options = ADAPTER.toolchain_options(TARGET, {})
    bucket = checks.run_bucket(toolchain, TARGET, path, {"x": x}, tmp_path, options)
    assert bucket["artifacts"] == ["model.b.rknn", "model.b.rknn.build.json"]
    assert (tmp_path / "out" / "model.b.rknn").is_file()
    # Beside it, how it was built: what the runtime's simulator bridge and convert_rknn.py repeat.
    record = json.loads((tmp_path / "out" / "model.b.rknn.build.json").read_text())
    assert record["format"] == "flexdsa-rknn-build/1" and record["precision"] == "float16"
    assert record["config"] == {"target_platform": "rk3588", "optimization_level": 3}
    assert record["inputs"] == ["x"] and record["input_size_list"] == [[1, 3, 16, 16]]
    assert record["calibration"] == [] and record["toolkit"]
    assert set(bucket["placement"].values()) == {"accelerator"}
    assert any(row["op"] == "ConvRelu" and row["target"] == "NPU" for row in bucket["layers"])
    want = run(ir.to_proto(model), {"x": x})[0]
    got = np.load(bucket["outputs"]["y"])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-2, rtol=2e-2)  # float16 on the NPU


@pytest.mark.parametrize(
    "name, buckets",
    [("resnet", None), ("mobilenetv2", None), ("bert", {"batch": [1], "seq": [16]}),
     ("gpt2", {"batch": [1], "seq": [16]}), ("llama", {"batch": [1], "seq": [16]}), ("vit", None)],
)  # fmt: skip
def test_fixture_compiles_and_simulates_within_tolerance(name, buckets):
    _toolchain_or_skip()
    result, toolchain = checks.optimized_with_toolchain("rockchip-rk3588", name, shape_buckets=buckets)
    assert toolchain["buckets"], f"{name}: expected the toolchain section to list the buckets it compiled; it lists none"
    assert set(toolchain["buckets"]) == {b.name for b in result.buckets}, (name, list(toolchain["buckets"]))
    for bucket, entry in toolchain["buckets"].items():
        assert f"model.{bucket}.rknn" in result.artifacts
        assert entry["numerics"], f"{name}/{bucket}: expected the simulator's outputs compared to ONNX Runtime's"
        for output in entry["numerics"]:
            assert output["cosine"] >= 0.9999, (name, output)
        # Our partition and rknn-toolkit2's agree on all but the Conv over a sourced limit it splits itself.
        assert entry["placement_agreement"]["share"] >= 0.98, json.dumps(entry["placement_agreement"])
        # The vendor alone compiled the original at the same shapes, and ours is never worse by its estimate.
        vendor = result.report["vendor"]["buckets"][bucket]
        assert vendor["vendor_alone"]["cycles"] > 0 and vendor["ours"]["cycles"] > 0
        assert vendor["ratio"] <= 1.0 and vendor["ours"]["cpu_nodes"] <= vendor["vendor_alone"]["cpu_nodes"]


def test_mixed_bundle_convert_script_keeps_the_float_layers_float16(tmp_path):
    """convert_rknn.py from a mixed bundle, run with rknn-toolkit2 on the bundle's calibration samples: hybrid
    quantisation keeps the float layers' tensors (as the toolkit names them) float16, the rest int8."""
    toolchain = _toolchain_or_skip()
    checks.mixed_bundle("rockchip-rk3588", tmp_path)
    # By default: the precision planned (the toolchain did not run, so no .rknn shipped), on the bundle's samples.
    out = checks.run_script(toolchain, tmp_path, "convert_rknn.py")
    assert "batch1: building int8" in out
    assert "kept float16 (hybrid quantisation): [['wide_mm', 'y'], ['h_mm', 'wide_mm']]" in out
    assert "wrote rebuilt/model.batch1.rknn" in out and (tmp_path / "rebuilt" / "model.batch1.rknn").is_file()
    config = (tmp_path / "model.batch1.quantization.cfg").read_text()
    custom = config[: config.index("quantize_parameters:")]
    assert "    wide_mm: float16" in custom and "    y_mm: float16" in custom
    assert "h_mm:" not in custom  # the first layer's output stays int8
