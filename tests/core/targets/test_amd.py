"""amd-xdna2 (Ryzen AI XDNA 2 NPU, Vitis AI EP): the op table (the quantisable ops, no public NPU list) and
its reasons, the preset per model kind, the bundle's Quark script and Vitis AI EP run script; and, where the
amd toolchain (Quark) is installed, real fixtures quantised by Quark stay within the accuracy target."""

import argparse
import subprocess

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.targets import describe_checks, load_target
from flexdsa_core.targets._vitis_ai import model_kind
from flexdsa_core.targets.amd import ADAPTER
from flexdsa_core.targets.base import BucketModel
from tests.core.fusions.harness import parse, run
from tests.core.targets import _bundle_checks as checks
from tests.models import fixture

TARGET = load_target("amd-xdna2")

ATTENTION = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 8, 16] x) => (float[1, 8, 16] y)
<float[16, 16] wq = {WQ}, float[16, 16] wk = {WK}>
{ q = MatMul (x, wq)
  k = MatMul (x, wk)
  kt = Transpose <perm = [0, 2, 1]> (k)
  s = MatMul (q, kt)
  p = Softmax <axis = -1> (s)
  y = MatMul (p, x) }
"""
CONV = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 3, 16, 16] x) => (float[1, 8, 16, 16] y)
<float[8, 3, 3, 3] w = {W}>
{ c = Conv <pads = [1, 1, 1, 1]> (x, w)
  y = Relu (c) }
"""


def _fill(text: str, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    for key, count in (("{WQ}", 256), ("{WK}", 256), ("{W}", 216)):
        text = text.replace(key, "{" + ", ".join(f"{v:.4f}" for v in rng.standard_normal(count) * 0.3) + "}")
    return text


def _reason(text: str, op_type: str) -> str | None:
    return checks.fallback_reason(ADAPTER, TARGET, text, op_type)


# ---- the spec ---------------------------------------------------------------------------------------


def test_spec_carries_only_sourced_or_derived_figures():
    assert TARGET.peak_ops_per_s == {"int8": 50e12, "float16": None, "float32": None}
    assert "third-party" in TARGET.sources["peak_ops_per_s.int8"]
    assert TARGET.sram_bytes == 6 * 1024 * 1024 and "derived" in TARGET.sources["sram_bytes"]
    assert TARGET.mem_bandwidth_bytes_per_s is None and TARGET.power_w is None
    assert TARGET.toolchain == "amd" and TARGET.static_shapes and TARGET.cpu_fallback
    assert "A10" in TARGET.sources["supported_ops"]
    # Quark quantises; it does not compile: the target's description of its checks says so.
    assert "quantised by the vendor quantiser 'amd' (AMD Quark)" in describe_checks(TARGET)


# ---- reasons ----------------------------------------------------------------------------------------


def test_ops_outside_the_quantisable_list_fall_back_with_the_reason():
    text = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 16] x) => (float[1, 1] y)
{ y = ReduceMean <keepdims = 1> (x) }
"""
    assert _reason(text, "ReduceMean") == (
        "ReduceMean is not among the ops the Vitis AI quantiser quantises (X8), and AMD publishes no NPU op list "
        "(A10): the Vitis AI EP runs it on the CPU beside the NPU (A2)"
    )
    assert _reason(_fill(ATTENTION), "Softmax") is None and _reason(_fill(ATTENTION), "MatMul") is None


def test_integer_tensors_stay_on_the_cpu():
    text = """
<ir_version: 9, opset_import: ["" : 17]>
g (int64[1, 4] ids, float[10, 8] table) => (float[1, 4, 8] y, int64[1, 4] z)
{ y = Gather (table, ids)
  z = Mul (ids, ids) }
"""
    assert "not among the ops" in _reason(text, "Gather")
    assert "reads the int64 tensor 'ids', computed at run time" in _reason(text, "Mul")


def test_preset_follows_the_model_kind():
    assert model_kind(ir.from_proto(parse(_fill(ATTENTION)))) == "transformer"
    assert model_kind(ir.from_proto(parse(_fill(CONV)))) == "cnn"
    [note] = ADAPTER.partition_notes(ir.from_proto(parse(_fill(ATTENTION))), TARGET)
    assert "A8W8 for a transformer model" in note and "BF16" in note


# ---- the bundle -------------------------------------------------------------------------------------


def _buckets() -> list[BucketModel]:
    return [
        BucketModel("cnn", ir.from_proto(parse(_fill(CONV))), {"x": [1, 3, 16, 16]}),
        BucketModel("attn", ir.from_proto(parse(_fill(ATTENTION))), {"x": [1, 8, 16]}),
    ]


def test_quantize_script_picks_quarks_preset_per_bucket():
    files = ADAPTER.vendor_files(_buckets(), TARGET, {})
    assert set(files) == {"quantize_quark.py", "run_npu.py"}
    script = files["quantize_quark.py"].decode()
    compile(script, "quantize_quark.py", "exec")
    namespace = checks.script_constants(script, "\nBUCKETS = ", "class Samples")
    assert [(b["name"], b["preset"], b["qdq"]) for b in namespace["BUCKETS"]] == [
        ("cnn", "XINT8", "model.cnn.qdq.onnx"),
        ("attn", "A8W8", "model.attn.qdq.onnx"),
    ]
    assert namespace["QUANTIZERS"] == ["quark"]


def test_mixed_bundle_quantize_script_carries_the_float_layers(tmp_path):
    report = checks.mixed_bundle("amd-xdna2", tmp_path)
    script = (tmp_path / "quantize_quark.py").read_text()
    [bucket] = checks.script_constants(script, "\nBUCKETS = ", "class Samples")["BUCKETS"]
    assert bucket["float_layers"] == ADAPTER.toolchain_options(TARGET, report)["float_layers"]["batch1"]
    assert bucket["float_layers"] == ["widen", "sensitive"]
    assert bucket["keep_float"] == []  # on the NPU the EP places the CPU nodes itself
    assert "keeps the mixed plan's float layers out of int8" in (tmp_path / "README.md").read_text()


def test_run_script_sets_the_vitis_ai_ep_provider_options():
    script = ADAPTER.vendor_files(_buckets(), TARGET, {})["run_npu.py"].decode()
    compile(script, "run_npu.py", "exec")
    assert "providers=[\"VitisAIExecutionProvider\"]" in script
    namespace = checks.script_constants(script, "import argparse", "def run(")
    bucket = namespace["BUCKETS"][0]
    args = argparse.Namespace(cache_dir="cache", config_file=None, xclbin=None)
    options = namespace["provider_options"](bucket, args)
    assert set(options) == {"cache_dir", "cache_key"} and options["cache_key"] == "model.cnn.qdq"
    args = argparse.Namespace(cache_dir="cache", config_file="vaip_config.json", xclbin="npu.xclbin")
    assert namespace["provider_options"](bucket, args)["config_file"] == "vaip_config.json"


def test_deploy_steps_quantise_then_run_through_the_ep():
    steps = ADAPTER.deploy_steps(_buckets(), TARGET, {})
    assert "quantize_quark.py" in steps[0] and "XINT8" in steps[0] and "A8W8" in steps[0]
    assert any("VitisAIExecutionProvider" in step and "cache_key" in step for step in steps)


@pytest.mark.models
def test_bert_bundle_for_the_npu():
    result = FlexDSAOptimizer("amd-xdna2").optimize(
        fixture("bert"), OptimizeOptions(shape_buckets={"batch": [1], "seq": [16]}, measure_latency=False)
    )
    report = result.report
    assert report["validation"]["ok"] is True
    part = report["partition"]["batch1_seq16"]
    assert part["accelerator_flop_share"] > 0.9  # the MatMuls and Gemms, which carry the FLOPs
    assert any("A8W8 for a transformer model" in note for note in part["notes"])
    # The embedding Gathers, the unfused norms' elementwise ops and the Erfs are outside X8's list.
    assert part["fallback"], "expected BERT's Gathers, norm ops and Erfs on the CPU beside the NPU; none fell back"
    for fallback in part["fallback"]:
        assert "(X8)" in fallback["reason"] or "computed at run time" in fallback["reason"], fallback


# ---- with the amd toolchain (Quark) installed --------------------------------------------------------


def _toolchain_or_skip():
    return checks.toolchain_or_skip("amd", "amd-quark")


def test_attention_block_quantised_with_a8w8(tmp_path):
    toolchain = _toolchain_or_skip()
    proto = parse(_fill(ATTENTION))
    path = tmp_path / "model.attn.onnx"
    onnx.save(proto, path)
    x = np.random.default_rng(1).standard_normal((1, 8, 16)).astype(np.float32)
    options = ADAPTER.toolchain_options(TARGET, {"precision": {"requested": "int8"}})
    bucket = checks.run_bucket(toolchain, TARGET, path, {"x": x}, tmp_path, options, name="attn")
    quantization = bucket["quantization"]
    assert quantization["preset"] == "A8W8" and quantization["model_kind"] == "transformer"
    assert quantization["qdq_pairs"] > 0 and quantization["reached"], quantization
    quantized = onnx.load(tmp_path / "out" / "model.attn.qdq.onnx")
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in quantized.graph.node}
    assert checks.cosine(run(proto, {"x": x})[0], np.load(bucket["outputs"]["y"])) >= 0.99


@pytest.mark.models
@pytest.mark.parametrize(
    "name, buckets, preset",
    [("resnet", {"batch": [1]}, "XINT8"), ("bert", {"batch": [1], "seq": [16]}, "A8W8"),
     ("vit", {"batch": [1]}, "A8W8")],
)  # fmt: skip
def test_fixture_quantised_by_quark_within_the_accuracy_target(name, buckets, preset):
    _toolchain_or_skip()
    result, toolchain = checks.optimized_with_toolchain(  # random weights: judged by cosine, not near-tied top-1
        "amd-xdna2", name, shape_buckets=buckets, precision="int8", accuracy={"top1_outputs": []}
    )
    assert toolchain["buckets"], f"{name}: expected the toolchain section to list the buckets it quantised; it lists none"
    assert set(toolchain["buckets"]) == {b.name for b in result.buckets}, (name, list(toolchain["buckets"]))
    for bucket, entry in toolchain["buckets"].items():
        assert f"model.{bucket}.qdq.onnx" in result.artifacts
        assert entry["quantization"]["preset"] == preset
        assert entry["numerics"] and all(o["cosine"] >= 0.99 for o in entry["numerics"]), entry["numerics"]
        assert entry["vendor_placement"] == {}  # the EP places at session creation on the device


def test_bundle_quantize_script_runs_with_quark(tmp_path):
    """The generated quantize_quark.py, run with Quark as a user would, writes a QDQ model per bucket."""
    toolchain = _toolchain_or_skip()
    buckets = _buckets()
    for bucket in buckets:
        ir.save(bucket.model, tmp_path / ADAPTER.model_filename(bucket))
    (tmp_path / "quantize_quark.py").write_bytes(ADAPTER.vendor_files(buckets, TARGET, {})["quantize_quark.py"])
    done = subprocess.run(
        [str(toolchain.python(checks.TOOLCHAIN_ROOT)), "quantize_quark.py", "--random", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "wrote rebuilt/model.cnn.qdq.onnx with quark XINT8" in done.stdout
    assert "wrote rebuilt/model.attn.qdq.onnx with quark A8W8" in done.stdout
    for bucket in buckets:
        quantized = onnx.load(tmp_path / "rebuilt" / ADAPTER.qdq_filename(bucket))
        assert "QuantizeLinear" in {n.op_type for n in quantized.graph.node}


def test_mixed_bundle_quantize_script_keeps_the_float_layers_float_with_quark(tmp_path):
    """quantize_quark.py from a mixed bundle, run with Quark on the bundle's calibration samples: the layers the
    search kept out of int8 read float weights and tensors in the QDQ model, the others dequantised int8 ones."""
    toolchain = _toolchain_or_skip()
    checks.mixed_bundle("amd-xdna2", tmp_path)
    shipped = {p.name: p.read_bytes() for p in tmp_path.glob("*.qdq.onnx")}
    out = checks.run_script(toolchain, tmp_path, "quantize_quark.py", "--dataset", "dataset.txt", timeout=600)
    assert "wrote rebuilt/model.batch1.qdq.onnx with quark XINT8 (2 node(s) left in float)" in out
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.qdq.onnx")} == shipped  # the bundle's own untouched
    again = subprocess.run(
        [str(toolchain.python(checks.TOOLCHAIN_ROOT)), "quantize_quark.py", "--dataset", "dataset.txt"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert again.returncode != 0 and "exists" in again.stderr and "--force" in again.stderr
    quantized = onnx.load(tmp_path / "rebuilt" / "model.batch1.qdq.onnx")
    dequantized = {o for n in quantized.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    nodes = {n.name: n for n in quantized.graph.node}
    assert all(i in dequantized for i in nodes["first"].input)
    for layer in ("widen", "sensitive"):
        assert nodes[layer].input[1] in {i.name for i in quantized.graph.initializer}  # its float weight
    assert nodes["sensitive"].input[0] == "wide"  # its input not quantised either
