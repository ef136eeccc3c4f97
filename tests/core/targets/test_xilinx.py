"""xilinx-kv260 (DPUCZDX8G B4096): the DPU's op table and limits refuse with sourced reasons, a float bundle
is said to need quantisation, the bundle's quantise script and vai_c_xir script parse and call the compiler
as documented; and, where the amd toolchain (Quark) is installed, real fixtures quantised to power-of-two
int8 stay within the accuracy target in ONNX Runtime."""

import json
import math
import subprocess

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.cost_model import CostModel
from flexdsa_core.errors import InvalidOptionsError
from flexdsa_core.preflight import check_request
from flexdsa_core.targets import load_target
from flexdsa_core.targets.base import BucketModel
from flexdsa_core.targets.xilinx.adapter import ADAPTER, ARCH_JSON
from tests.core.fusions.harness import parse, run
from tests.core.targets import _bundle_checks as checks
from tests.models import fixture

TARGET = load_target("xilinx-kv260")


def _reason(text: str, op_type: str) -> str | None:
    return checks.fallback_reason(ADAPTER, TARGET, text, op_type)


def _conv(kernel: int, cin: int = 8, cout: int = 8, group: int = 1, stride: int = 1) -> str:
    return f"""
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, {cin}, 32, 32] x, float[{cout}, {cin // group}, {kernel}, {kernel}] w) => (float[1, {cout}, 32, 32] y)
{{ y = Conv <group = {group}, strides = [{stride}, {stride}]> (x, w) }}
"""


# ---- the spec ---------------------------------------------------------------------------------------


def test_spec_carries_only_sourced_or_derived_figures():
    assert TARGET.peak_ops_per_s == {"int8": 4096 * 300e6, "float16": None, "float32": None}
    assert "derived" in TARGET.sources["peak_ops_per_s.int8"] and "X2" in TARGET.sources["peak_ops_per_s.int8"]
    assert TARGET.sram_bytes is None and TARGET.power_w is None and TARGET.mem_bandwidth_bytes_per_s is None
    assert TARGET.dtypes == ["int8"] and TARGET.static_shapes and TARGET.toolchain == "amd"
    assert "Softmax" not in TARGET.supported_ops and "Conv" in TARGET.supported_ops
    assert TARGET.op_constraints["Conv"]["source"] == "X11"


# ---- reasons ----------------------------------------------------------------------------------------


def test_conv_kernel_and_stride_limits_cite_the_sibling_dpu():
    assert _reason(_conv(3), "Conv") is None
    assert _reason(_conv(17), "Conv") == "Conv: kernel 17x17 exceeds the limit of 16 on xilinx-kv260 (X11)"
    assert "stride 5 exceeds the limit of 4" in _reason(_conv(3, stride=5), "Conv")


def test_conv_channel_load_and_output_channels():
    # 7x7 x ceil(1024 / 16) = 3136 > 2048; a depthwise Conv of the same size is the DPU's depthwise engine.
    reason = _reason(_conv(7, cin=1024, cout=16), "Conv")
    assert reason.startswith("Conv: kernel 7x7 x ceil(1024 input channels / 16) = 3136 exceeds 2048")
    assert _reason(_conv(7, cin=1024, cout=1024, group=1024), "Conv") is None
    assert "4097 output channels exceed" in _reason(_conv(1, cout=4097), "Conv")


def test_pooling_kernel_limit():
    text = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 8, 32, 32] x) => (float[1, 8, 24, 24] y)
{{ y = MaxPool <kernel_shape = [{k}, {k}]> (x) }}
"""
    assert _reason(text.format(k=8), "MaxPool") is None
    assert "kernel 9x9 exceeds the limit of 8" in _reason(text.format(k=9), "MaxPool")


def test_ops_outside_the_dpu_run_on_the_a53s():
    softmax = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 10] x) => (float[1, 10] y)
{ y = Softmax (x) }
"""
    assert "optional in the DPUCZDX8G IP (X4)" in _reason(softmax, "Softmax")
    sigmoid = softmax.replace("Softmax", "Sigmoid")
    assert _reason(sigmoid, "Sigmoid") == (
        "Sigmoid is not a DPUCZDX8G operator (X4): vai_c_xir puts it in a CPU subgraph that runs on the "
        "board's Cortex-A53s (X9)"
    )


def test_clip_is_relu6_only():
    text = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 8] x) => (float[1, 8] y)
{{ lo = Constant <value = float {{{lo}}}> ()
  hi = Constant <value = float {{{hi}}}> ()
  y = Clip (x, lo, hi) }}
"""
    assert _reason(text.format(lo=0.0, hi=6.0), "Clip") is None
    assert "Clip with min -1.0, max 1.0 is not a DPU activation" in _reason(text.format(lo=-1.0, hi=1.0), "Clip")


def test_fully_connected_needs_constant_weights_and_integer_tensors_stay_on_the_cpu():
    matmul = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[4, 8] a, float[8, 4] b) => (float[4, 4] y)
{ y = MatMul (a, b) }
"""
    assert "input 1 ('b') must be a constant" in _reason(matmul, "MatMul")
    integer = """
<ir_version: 9, opset_import: ["" : 17]>
g (int64[1, 4] a, int64[1, 4] b) => (int64[1, 4] y)
{ y = Add (a, b) }
"""
    assert "reads the int64 tensor 'a', computed at run time" in _reason(integer, "Add")


def test_float_bundle_is_said_to_need_quantisation_and_a_qdq_one_is_not():
    float_model = ir.from_proto(parse(_conv(3)))
    [note] = ADAPTER.partition_notes(float_model, TARGET)
    assert "computes int8 only" in note and "Quark XINT8" in note
    qdq = ir.from_proto(parse("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 8] x) => (float[1, 8] y)
{ s = Constant <value = float {0.125}> ()
  q = QuantizeLinear (x, s)
  y = DequantizeLinear (q, s) }
"""))
    assert ADAPTER.partition_notes(qdq, TARGET) == ["the model is already quantised (QDQ): xilinx-kv260 takes it as it is"]


def test_float_graphs_are_costed_at_the_int8_peak():
    cost_model = CostModel(TARGET)
    assert cost_model.peak("float32") == TARGET.peak_ops_per_s["int8"]
    assert any("int8-only" in note for note in cost_model.notes)


# ---- the bundle -------------------------------------------------------------------------------------


def _buckets(*batches: int) -> list[BucketModel]:
    buckets = []
    for batch in batches:
        model = ir.from_proto(parse(f"""
<ir_version: 9, opset_import: ["" : 17]>
g (float[{batch}, 3, 16, 16] x) => (float[{batch}, 8, 16, 16] y)
<float[8, 3, 3, 3] w = {{{", ".join(["0.1"] * 216)}}}>
{{ c = Conv <pads = [1, 1, 1, 1]> (x, w)
  y = Relu (c) }}
"""))
        buckets.append(BucketModel(f"batch{batch}", model, {"x": [batch, 3, 16, 16]}))
    return buckets


def test_quantize_script_carries_each_bucket_and_the_dpu_scheme():
    files = ADAPTER.vendor_files(_buckets(1, 4), TARGET, {})
    assert set(files) == {"quantize_kv260.py", "compile_kv260.sh"}
    script = files["quantize_kv260.py"].decode()
    compile(script, "quantize_kv260.py", "exec")
    namespace = checks.script_constants(script, "\nBUCKETS = ", "class Samples")
    assert namespace["QUANTIZERS"] == ["quark", "vai_q_onnx"]
    assert namespace["BUCKETS"][1] == {
        "name": "batch4", "onnx": "model.batch4.onnx", "qdq": "model.batch4.qdq.onnx", "inputs": ["x"],
        "shapes": [[4, 3, 16, 16]], "dtypes": ["float32"], "preset": "XINT8", "float_layers": [], "keep_float": [],
    }  # fmt: skip
    assert "PowerOfTwoMethod.MinMSE" in script and "per_channel=False" in script


def test_quantize_script_leaves_the_mixed_plans_layers_and_the_cpu_nodes_float(tmp_path):
    """Under precision mixed the bundle's quantise step excludes the layers the search kept out of int8, and on
    the DPU the nodes the partition puts on the CPU, as the toolchain run here does (its options)."""
    report = checks.mixed_bundle("xilinx-kv260", tmp_path)
    script = (tmp_path / "quantize_kv260.py").read_text()
    namespace = checks.script_constants(script, "\nBUCKETS = ", "class Samples")
    [bucket] = namespace["BUCKETS"]
    options = ADAPTER.toolchain_options(TARGET, report)
    assert bucket["float_layers"] == ["widen", "sensitive"] == options["float_layers"]["batch1"]
    assert namespace["float_nodes"](bucket) == ["sensitive", "widen"]
    assert "config.exclude = float_nodes(bucket)" in script  # Quark
    assert "nodes_to_exclude=float_nodes(bucket)" in script  # vai_q_onnx
    readme = (tmp_path / "README.md").read_text()
    assert "keeps the mixed plan's float layers out of int8 (batch1: widen, sensitive)" in readme
    # A node the partition put on the CPU: left float too (the DPU compiler makes a CPU subgraph of it).
    buckets = _buckets(1)
    relu = next(n.name for n in buckets[0].model.graph if n.op_type == "Relu")
    on_cpu = {"partition": {"batch1": {"placement": {relu: "cpu"}}}}
    script = ADAPTER.vendor_files(buckets, TARGET, on_cpu)["quantize_kv260.py"].decode()
    [bucket] = checks.script_constants(script, "\nBUCKETS = ", "class Samples")["BUCKETS"]
    assert bucket["keep_float"] == ADAPTER.toolchain_options(TARGET, on_cpu)["keep_float"]["batch1"] == [relu]


def test_compile_script_runs_vai_c_xir_per_bucket_with_the_kv260_arch(tmp_path):
    files = ADAPTER.vendor_files(_buckets(1, 4), TARGET, {})
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    for name, content in files.items():
        (bundle / name).write_bytes(content)
    subprocess.run(["bash", "-n", str(bundle / "compile_kv260.sh")], check=True)
    record = tmp_path / "argv.txt"
    stand_ins = tmp_path / "bin"
    stand_ins.mkdir()
    for tool in ("vai_c_xir", "python3"):  # record each call instead of quantising and compiling
        (stand_ins / tool).write_text(f'#!/usr/bin/env bash\necho {tool} "$@" >> {record}\n')
        (stand_ins / tool).chmod(0o755)
    (bundle / "quantized").mkdir()
    (bundle / "quantized" / "model_batch1_int.xmodel").write_bytes(b"")  # only batch1 has its xmodel
    (tmp_path / "ds.txt").write_text("x.npy\n")
    done = subprocess.run(
        ["bash", str(bundle / "compile_kv260.sh"), str(tmp_path / "ds.txt")],
        env={"PATH": f"{stand_ins}:/usr/bin:/bin"}, cwd="/", capture_output=True, text=True, check=True,
    )  # fmt: skip
    calls = record.read_text().splitlines()
    assert calls[0] == f"python3 quantize_kv260.py --dataset {tmp_path / 'ds.txt'} --quantizer quark"
    assert calls[1] == (
        f'vai_c_xir -x quantized/model_batch1_int.xmodel -a {ARCH_JSON} -o compiled/batch1 -n model_batch1'
    )
    assert len(calls) == 2 and "bucket batch4: model_batch4_int.xmodel not found" in done.stderr


def test_deploy_steps_name_the_quantise_step_and_the_compiler():
    steps = ADAPTER.deploy_steps(_buckets(1), TARGET, {})
    assert "int8 only" in steps[0] and "quantize_kv260.py" in steps[0]
    assert any(f"-a {ARCH_JSON}" in step for step in steps)


@pytest.mark.models
def test_resnet_bundle_for_the_kv260():
    result = FlexDSAOptimizer("xilinx-kv260").optimize(
        fixture("resnet"),
        OptimizeOptions(shape_buckets={"batch": [1]}, measure_latency=False, allow_synthetic_calibration=True),
    )
    report = result.report
    assert report["validation"]["ok"] is True
    part = report["partition"]["batch1"]
    assert {f["op"] for f in part["fallback"]} == {"Flatten"}  # everything else is a DPU operator
    assert any("computes int8 only" in note for note in part["notes"])
    manifest = json.loads(result.artifacts["manifest.json"])
    assert manifest["vendor_files"] == ["compile_kv260.sh", "quantize_kv260.py"]
    assert "vai_c_xir" in result.artifacts["README.md"].decode()
    # Quantised on synthetic inputs because the request allowed it: said, as numerics only.
    warning = next(w for w in report["warnings"] if "computes int8 only" in w)
    assert "allow_synthetic_calibration" in warning and "no accuracy claim" in warning


def test_the_dpu_without_samples_is_refused_naming_the_fix():
    with pytest.raises(InvalidOptionsError) as refused:
        FlexDSAOptimizer("xilinx-kv260").optimize(
            fixture("resnet"), OptimizeOptions(shape_buckets={"batch": [1]}, measure_latency=False)
        )
    message = refused.value.message
    assert "computes int8 only" in message and "calibration" in message and "allow_synthetic_calibration" in message
    # With samples it is not refused at this check (the same request with a calibration .npz).
    check_request(fixture("resnet"), OptimizeOptions(precision="int8"), TARGET, has_samples=True)
    with pytest.raises(InvalidOptionsError):
        check_request(fixture("resnet"), OptimizeOptions(), TARGET, has_samples=False)


# ---- with the amd toolchain (Quark) installed --------------------------------------------------------


def _toolchain_or_skip():
    return checks.toolchain_or_skip("amd", "amd-quark")


def test_small_conv_quantised_to_power_of_two_int8(tmp_path):
    toolchain = _toolchain_or_skip()
    rng = np.random.default_rng(0)
    proto = checks.conv_relu(rng)
    path = tmp_path / "model.b.onnx"
    onnx.save(proto, path)
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    options = ADAPTER.toolchain_options(TARGET, {})
    bucket = checks.run_bucket(toolchain, TARGET, path, {"x": x}, tmp_path, options)
    assert bucket["artifacts"] == ["model.b.qdq.onnx"] and bucket["placement"] == {}
    assert bucket["quantization"]["preset"] == "XINT8" and bucket["quantization"]["reached"]
    quantized = onnx.load(tmp_path / "out" / "model.b.qdq.onnx")
    scales = [
        float(onnx.numpy_helper.to_array(init).ravel()[0])
        for init in quantized.graph.initializer
        if any(n.op_type == "DequantizeLinear" and n.input[1] == init.name for n in quantized.graph.node)
    ]
    assert scales and all(math.log2(s) == round(math.log2(s)) for s in scales)  # power-of-two scales
    zero_points = [init for init in quantized.graph.initializer if "zero_point" in init.name]
    assert zero_points, "expected the QDQ model's zero points (initializers named '*zero_point'); found none"
    assert all(onnx.numpy_helper.to_array(z).dtype == np.int8 for z in zero_points)  # int8 activations too
    assert checks.cosine(run(proto, {"x": x})[0], np.load(bucket["outputs"]["y"])) >= 0.99


@pytest.mark.models
@pytest.mark.parametrize("name", ["resnet", "mobilenetv2", "vit"])
def test_fixture_quantised_by_quark_within_the_accuracy_target(name):
    _toolchain_or_skip()
    result, toolchain = checks.optimized_with_toolchain(
        "xilinx-kv260", name, shape_buckets={"batch": [1]}, allow_synthetic_calibration=True
    )
    entry = toolchain["buckets"]["batch1"]
    assert "model.batch1.qdq.onnx" in result.artifacts
    quantization = entry["quantization"]
    assert quantization["preset"] == "XINT8"
    # The nodes our partition puts on the CPU stay float (CPU subgraphs); a CNN keeps every DPU node int8.
    cpu_nodes = [f["node"] for f in result.report["partition"]["batch1"]["fallback"]]
    assert quantization["kept_float_for_cpu"] == len(cpu_nodes)
    if name != "vit":
        assert quantization["float_nodes"] == len(cpu_nodes), quantization
    assert entry["numerics"] and all(o["cosine"] >= 0.99 for o in entry["numerics"]), entry["numerics"]
    assert entry["placement_agreement"] == {  # Quark places nothing; nothing is invented
        "share": None, "compared": 0, "note": "the vendor toolchain reports no placement"
    }
    assert any("vendor placement is not available" in note for note in entry["notes"])
