"""nvidia-orin-nano: TensorRT legalisation (LayerNormalization Y only, Compress as Gather, opset into 9-20)
with equal numerics, the op-matrix restrictions as fallback reasons, and the generated trtexec script and
engine builder (TensorRT needs the GPU: the builder runs only where ``tensorrt`` imports)."""

import json
import py_compile
import subprocess
import sys

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from flexdsa_core import FlexDSAOptimizer
from flexdsa_core.options import OptimizeOptions
from flexdsa_core.targets import BucketModel, get_adapter, load_target
from flexdsa_core.targets.nvidia.adapter import profile
from tests.core.fusions.harness import _random_inputs, op_types, parse, run
from tests.models import fixture

TARGET = load_target("nvidia-orin-nano")
ADAPTER = get_adapter(TARGET)


def legalize(text: str, disabled: frozenset[str] = frozenset()):
    proto = parse(text)
    return proto, ADAPTER.legalize(ir.from_proto(proto), TARGET, disabled)


def assert_same_numerics(original: onnx.ModelProto, lowered: onnx.ModelProto, feeds=None) -> None:
    feeds = feeds or _random_inputs(original)
    for expected, got in zip(run(original, feeds), run(lowered, feeds), strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)


def reason(text: str, index: int = 0) -> str | None:
    node = list(ir.from_proto(parse(text)).graph)[index]
    return ADAPTER.fallback_reason(node, TARGET)


def test_layer_norm_keeps_only_y():
    original, result = legalize("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[2, 4, 8] x, float[8] s, float[8] b) => (float[2, 4, 8] y)
{ y, mean, inv = LayerNormalization (x, s, b) }
""")
    assert result.applied == ["layer_norm_y_only"]
    lowered = ir.to_proto(result.model)
    assert list(lowered.graph.node[0].output) == ["y"]
    assert ADAPTER.fallback_reason(next(iter(result.model.graph)), TARGET) is None
    assert_same_numerics(original, lowered)


def test_used_layer_norm_statistics_fall_back():
    assert "only the first output Y" in reason("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[2, 8] x, float[8] s) => (float[2, 8] y, float[2, 1] mean)
{ y, mean = LayerNormalization (x, s) }
""")


@pytest.mark.parametrize("axis", ["<axis: int = 1>", ""])
def test_compress_becomes_gather(axis):
    original, result = legalize(f"""
<ir_version: 9, opset_import: ["" : 17]>
g (float[3, 5] x, bool[5] c) => (float[3, N] y)
{{ y = Compress {axis} (x, c) }}
""")
    lowered = ir.to_proto(result.model)
    assert result.applied == ["compress_to_gather"]
    assert "Compress" not in op_types(lowered) and {"NonZero", "Gather"} <= set(op_types(lowered))
    assert set(op_types(lowered)) <= set(TARGET.supported_ops)
    feeds = {"x": np.arange(15, dtype=np.float32).reshape(3, 5), "c": np.array([1, 0, 1, 1, 0], dtype=bool)}
    assert_same_numerics(original, lowered, feeds)


def test_rms_norm_23_is_lowered_to_opset_20():
    original, result = legalize("""
<ir_version: 10, opset_import: ["" : 23]>
g (float[2, 6, 8] x, float[8] s) => (float[2, 6, 8] y)
{ y = RMSNormalization <epsilon: float = 0.001> (x, s) }
""")
    lowered = ir.to_proto(result.model)
    assert lowered.opset_import[0].version == 20 and "rms_norm_decompose" in result.applied
    assert_same_numerics(original, lowered)


def test_topk_k_4000_falls_back():
    text = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 5000] x) => (float[1, {k}] v, int64[1, {k}] i)
<int64[1] k = {{{k}}}>
{{ v, i = TopK (x, k) }}
"""
    assert reason(text.format(k=4000)) == "TopK: K = 4000 is not below 3840, TensorRT's limit (N5)"
    assert reason(text.format(k=100)) is None


def test_matrix_restrictions():
    pool_1d = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 4, 16] x) => (float[1, 4, 8] y)
{ y = MaxPool <kernel_shape: ints = [2], strides: ints = [2]> (x) }
"""
    assert "2D or 3D only" in reason(pool_1d)
    cubic = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 1, 4, 4] x) => (float[1, 1, 8, 8] y)
<float[4] scales = {1.0, 1.0, 2.0, 2.0}>
{ y = Resize <mode: string = "cubic"> (x, , scales) }
"""
    assert "mode='cubic' is not supported" in reason(cubic) and "(N5)" in reason(cubic)
    asymmetric = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[4] x) => (uint8[4] q)
<float s = {0.1}, uint8 zp = {128}>
{ q = QuantizeLinear (x, s, zp) }
"""
    assert "symmetric quantisation only" in reason(asymmetric)
    pad_axes = """
<ir_version: 9, opset_import: ["" : 18]>
g (float[2, 4] x, int64[1] axes) => (float[2, 6] y)
<int64[2] pads = {1, 1}>
{ y = Pad (x, pads, , axes) }
"""
    assert "input 3 ('axes') must be a constant" in reason(pad_axes)
    assert "Unique is not in the nvidia-orin-nano op table" in reason("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[6] x) => (float[N] y)
{ y = Unique (x) }
""")


def _buckets(seqs: list[int], batches: list[int] = (1,)) -> list[BucketModel]:
    buckets = []
    for batch in batches:
        for seq in seqs:
            proto = parse(f"""
<ir_version: 9, opset_import: ["" : 17]>
g (int64[{batch}, {seq}] ids, float[{batch}, 3, 8, 8] pixels) => (int64[{batch}, {seq}] z, float[{batch}, 3, 8, 8] y)
{{ z = Identity (ids)
  y = Relu (pixels) }}
""")
            buckets.append(BucketModel(f"batch{batch}_seq{seq}", ir.from_proto(proto), {}))
    return buckets


def test_profile_spans_the_buckets_with_opt_first():
    span = profile(_buckets([64, 128, 32], batches=[1, 4]))
    assert span["ids"] == {"min": [1, 32], "opt": [1, 64], "max": [4, 128]}
    assert span["pixels"] == {"min": [1, 3, 8, 8], "opt": [1, 3, 8, 8], "max": [4, 3, 8, 8]}
    for shapes in span.values():
        assert all(
            lo <= opt <= hi for lo, opt, hi in zip(shapes["min"], shapes["opt"], shapes["max"], strict=True)
        )


def test_trtexec_script_and_engine_builder(tmp_path):
    report = {"reproducibility": {"options": {"precision": "fp16"}}}
    files = ADAPTER.vendor_files(_buckets([64, 128]), TARGET, report)
    assert set(files) == {"trtexec.sh", "build_engine.py"}
    script = tmp_path / "trtexec.sh"
    script.write_bytes(files["trtexec.sh"])
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = files["trtexec.sh"].decode()
    assert "--onnx=model.batch1_seq64.onnx" in text and "--saveEngine=model.batch1_seq128.plan" in text
    assert 'PRECISION_FLAGS="${PRECISION_FLAGS---fp16}"' in text
    assert "--minShapes=ids:1x64,pixels:1x3x8x8" in text and "--maxShapes=ids:1x128,pixels:1x3x8x8" in text
    assert "--memPoolSize=workspace:" in text

    builder = tmp_path / "build_engine.py"
    builder.write_bytes(files["build_engine.py"])
    py_compile.compile(str(builder), doraise=True)
    namespace = {"__name__": "bundle", "__file__": str(builder)}
    exec(compile(files["build_engine.py"], str(builder), "exec"), namespace)  # module level only: no tensorrt
    assert namespace["PROFILE"]["ids"]["max"] == [1, 128] and namespace["PRECISION"] == "fp16"
    help_text = subprocess.run(
        [sys.executable, str(builder), "--help"], capture_output=True, text=True, check=True
    )
    assert "--dynamic" in help_text.stdout


def test_trtexec_script_runs_with_a_stand_in_trtexec(tmp_path):
    files = ADAPTER.vendor_files(
        _buckets([64, 128]), TARGET, {"reproducibility": {"options": {"precision": "fp16"}}}
    )
    (tmp_path / "trtexec.sh").write_bytes(files["trtexec.sh"])
    record = tmp_path / "argv.txt"
    fake = tmp_path / "bin" / "trtexec"
    fake.parent.mkdir()
    fake.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" >> {record}\necho --- >> {record}\n')
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin"}
    subprocess.run(["bash", str(tmp_path / "trtexec.sh")], check=True, env=env, cwd="/")
    subprocess.run(["bash", str(tmp_path / "trtexec.sh"), "dyn.onnx"], check=True, env=env, cwd=str(tmp_path))
    calls = [call.strip().splitlines() for call in record.read_text().split("---") if call.strip()]
    assert calls[0] == [
        "--onnx=model.batch1_seq64.onnx",
        "--saveEngine=model.batch1_seq64.plan",
        "--memPoolSize=workspace:1024",
        "--fp16",
    ]
    assert (
        calls[2][0] == f"--onnx={tmp_path / 'dyn.onnx'}" and "--optShapes=ids:1x64,pixels:1x3x8x8" in calls[2]
    )


def test_engine_builder_runs_where_tensorrt_imports(tmp_path):
    pytest.importorskip(
        "tensorrt", reason="needs TensorRT and an NVIDIA GPU: pip install tensorrt on a GPU machine"
    )
    buckets = _buckets([16])
    files = ADAPTER.generate(buckets, TARGET, {})
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    subprocess.run([sys.executable, str(tmp_path / "build_engine.py")], check=True)
    assert (tmp_path / "model.batch1_seq16.plan").stat().st_size > 0


@pytest.mark.models
def test_vit_bundle_for_orin(tmp_path):
    result = FlexDSAOptimizer("nvidia-orin-nano").optimize(
        fixture("vit"), OptimizeOptions(shape_buckets={"batch": [1, 2]}, measure_latency=False)
    )
    report = result.report
    assert report["validation"]["ok"] is True
    assert (
        "layer_norm" in report["fusions"]["applied"]
    )  # LayerNormalization is in the matrix (opset 17 <= 20)
    manifest = json.loads(result.artifacts["manifest.json"])
    assert set(manifest["vendor_files"]) == {"trtexec.sh", "build_engine.py"}
    for bucket in result.buckets:
        assert all(
            report["partition"][bucket.name]["placement"][n.name] == "accelerator" for n in bucket.model.graph
        )
    script = tmp_path / "trtexec.sh"
    script.write_bytes(result.artifacts["trtexec.sh"])
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert "--maxShapes=pixel_values:2x3x32x32" in result.artifacts["trtexec.sh"].decode()
