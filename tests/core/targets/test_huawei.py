"""huawei-ascend310b: opset lowering into ATC's 11-15 with equal numerics, fallback reasons, and the
generated ATC scripts and fusion switch file (ATC itself does not install here)."""

import json
import re
import subprocess

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from flexdsa_core import FlexDSAOptimizer
from flexdsa_core.options import OptimizeOptions
from flexdsa_core.targets import BucketModel, get_adapter, load_target
from flexdsa_core.targets.opset_convert import convert_opset
from tests.core.fusions.harness import _random_inputs, op_types, parse, run
from tests.models import fixture

TARGET = load_target("huawei-ascend310b")
ADAPTER = get_adapter(TARGET)

LAYER_NORM_17 = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[2, 5, 16] x, float[16] s, float[16] b) => (float[2, 5, 16] y, float[2, 5, 1] mean, float[2, 5, 1] inv)
{ y, mean, inv = LayerNormalization <axis: int = -1, epsilon: float = 0.001> (x, s, b) }
"""


def legalize(text: str, disabled: frozenset[str] = frozenset()):
    proto = parse(text)
    result = ADAPTER.legalize(ir.from_proto(proto), TARGET, disabled)
    return proto, result


def assert_same_numerics(original: onnx.ModelProto, lowered: onnx.ModelProto) -> None:
    feeds = _random_inputs(original)
    for expected, got in zip(run(original, feeds), run(lowered, feeds), strict=True):
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)


def test_layer_norm_17_becomes_opset_15_ops_with_equal_outputs():
    original, result = legalize(LAYER_NORM_17)
    lowered = ir.to_proto(result.model)
    onnx.checker.check_model(lowered, full_check=True)
    assert lowered.opset_import[0].version == 15
    assert "LayerNormalization" not in op_types(lowered)
    assert set(op_types(lowered)) <= set(TARGET.supported_ops)
    assert result.applied == ["opset_downgrade", "layer_norm_decompose"]
    assert_same_numerics(original, lowered)


def test_gelu_and_opset_18_signatures_are_lowered():
    original, result = legalize("""
<ir_version: 9, opset_import: ["" : 20]>
g (float[2, 6, 8] x) => (float[2, 6, 4] a, float[2, 6, 4] b, float[2, 1, 8] m, float[2, 6, 10] p)
<int64[1] axes = {1}, int64[2] pads = {1, 1}, int64[1] pad_axes = {2}>
{ t = Gelu <approximate: string = "tanh"> (x)
  e = Gelu (t)
  a, b = Split <axis: int = -1, num_outputs: int = 2> (e)
  m = ReduceMean (x, axes)
  p = Pad (x, pads, , pad_axes) }
""")
    lowered = ir.to_proto(result.model)
    onnx.checker.check_model(lowered, full_check=True)
    assert lowered.opset_import[0].version == 15
    assert "Gelu" not in op_types(lowered) and "Erf" in op_types(lowered) and "Tanh" in op_types(lowered)
    assert "gelu_decompose" in result.applied
    assert_same_numerics(original, lowered)


def test_group_norm_21_becomes_instance_norm():
    original, result = legalize("""
<ir_version: 10, opset_import: ["" : 21]>
g (float[2, 6, 4, 4] x, float[6] s, float[6] b) => (float[2, 6, 4, 4] y)
{ y = GroupNormalization <num_groups: int = 3, epsilon: float = 0.01> (x, s, b) }
""")
    lowered = ir.to_proto(result.model)
    assert "InstanceNormalization" in op_types(lowered) and lowered.opset_import[0].version == 15
    assert_same_numerics(original, lowered)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            """
<ir_version: 9, opset_import: ["" : 17]>
g (bool c, float[2, 8] x, float[8] s) => (float[2, 8] y)
{ y = If (c) <then_branch = t () => (float[2, 8] a) { a = LayerNormalization (x, s) },
              else_branch = e () => (float[2, 8] b) { b = Identity (x) }> }
""",
            id="inside-a-subgraph",
        ),
        pytest.param(
            """
<ir_version: 9, opset_import: ["" : 17]>
g (float16[2, 8] x, float16[8] s) => (float16[2, 8] y)
{ y = LayerNormalization (x, s) }
""",
            id="float16-statistics-in-float32",
        ),
    ],
)
def test_layer_norm_lowering_variants(text):
    original, result = legalize(text)
    lowered = ir.to_proto(result.model)
    onnx.checker.check_model(lowered, full_check=True)
    assert "layer_norm_decompose" in result.applied and lowered.opset_import[0].version == 15
    feeds = _random_inputs(original)
    if "c" in feeds:
        feeds["c"] = np.array(True)
    for expected, got in zip(run(original, feeds), run(lowered, feeds), strict=True):
        np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), atol=1e-3, rtol=1e-3)


def test_switched_off_decomposition_keeps_the_model_and_says_why():
    original, result = legalize(LAYER_NORM_17, frozenset({"layer_norm_decompose"}))
    assert result.applied == []
    assert any("layer_norm_decompose is off" in note for note in result.notes)
    layer_norm = next(iter(result.model.graph))
    assert "ATC parses opset 11-15 (H7)" in ADAPTER.fallback_reason(layer_norm, TARGET)


def test_wrap_padding_has_no_older_form():
    conversion = convert_opset(
        ir.from_proto(
            parse("""
<ir_version: 9, opset_import: ["" : 19]>
g (float[1, 4] x) => (float[1, 6] y)
<int64[4] pads = {0, 1, 0, 1}>
{ y = Pad <mode: string = "wrap"> (x, pads) }
""")
        ),
        11,
        15,
    )
    assert conversion.refused and "wrap" in conversion.refused


def test_old_opset_is_lifted_into_the_range():
    original, result = legalize("""
<ir_version: 7, opset_import: ["" : 9]>
g (float[2, 3] x) => (float[2, 3] y)
{ y = Relu (x) }
""")
    assert result.applied == ["opset_upgrade"]
    assert ir.to_proto(result.model).opset_import[0].version == 11


def test_loop_falls_back_to_the_ai_cpu():
    model = ir.from_proto(
        parse("""
<ir_version: 9, opset_import: ["" : 15]>
g (int64 n, bool c, float[2] x) => (float[2] y)
{ y = Loop (n, c, x) <body = body (int64 i, bool cond, float[2] v) => (bool co, float[2] vo) {
    co = Identity (cond)
    vo = Relu (v) }> }
""")
    )
    loop = next(iter(model.graph))
    reason = ADAPTER.fallback_reason(loop, TARGET)
    assert reason.startswith("Loop:") and "AI CPU" in reason and "H21" in reason


def test_zero_sized_dim_and_qdq_reasons():
    model = ir.from_proto(
        parse("""
<ir_version: 9, opset_import: ["" : 15]>
g (float[1, 0] x, float s) => (float[1, 0] y, uint8[1, 0] q)
{ y = Relu (x)
  q = QuantizeLinear (x, s) }
""")
    )
    relu, quantize = list(model.graph)
    assert "zero-sized dim" in ADAPTER.fallback_reason(relu, TARGET)
    assert "AMCT" in ADAPTER.fallback_reason(quantize, TARGET)


def _buckets(seqs: list[int]) -> list[BucketModel]:
    buckets = []
    for seq in seqs:
        proto = parse(f"""
<ir_version: 9, opset_import: ["" : 15]>
g (float[1, 3, 8, 8] pixels, int64[1, {seq}] ids) => (float[1, 3, 8, 8] y, int64[1, {seq}] z)
{{ y = Relu (pixels)
  z = Identity (ids) }}
""")
        buckets.append(BucketModel(f"batch1_seq{seq}", ir.from_proto(proto), {}))
    return buckets


def _bash_parses(script: bytes, tmp_path, name: str) -> None:
    path = tmp_path / name
    path.write_bytes(script)
    subprocess.run(["bash", "-n", str(path)], check=True)


def test_atc_scripts_and_fusion_switch_file(tmp_path):
    report = {
        "disabled_rewrites": ["conv_bn_fold", "matmul_add_gemm"],
        "rollbacks": [{"rewrite": "matmul_add_gemm", "reason": "numerics", "detail": "..."}],
        "reproducibility": {"options": {"precision": "fp16"}},
    }
    files = ADAPTER.vendor_files(_buckets([64, 128]), TARGET, report)
    assert set(files) == {"atc.sh", "fusion_switch.cfg", "atc_dynamic_dims.sh"}
    for name in ("atc.sh", "atc_dynamic_dims.sh"):
        _bash_parses(files[name], tmp_path, name)

    cfg_lines = files["fusion_switch.cfg"].decode().splitlines()
    assert cfg_lines  # the documented form: one 'PassName:off' per line, names from the spec (H10, H11)
    for line in cfg_lines:
        name, _, state = line.partition(":")
        assert re.fullmatch(r"[A-Za-z0-9]+", name) and state == "off" and name in TARGET.fusion_switches
    assert "ConvBatchnormFusionPass:off" in cfg_lines and "ATbeMatMulElemwiseFusionPass:off" in cfg_lines

    atc = files["atc.sh"].decode()
    assert atc.count("--framework=5") == 2 and "Ascend310B1" in atc
    assert "--input_shape='pixels:1,3,8,8;ids:1,64'" in atc and "--input_format=NCHW" in atc
    assert "--output=model.batch1_seq128" in atc and "allow_fp32_to_fp16" in atc
    assert "--fusion_switch_file=fusion_switch.cfg" in atc and "broke the numerics" in atc

    dynamic = files["atc_dynamic_dims.sh"].decode()
    assert "--input_format=ND" in dynamic and "--input_shape='pixels:1,3,8,8;ids:1,-1'" in dynamic
    assert "--dynamic_dims='64;128'" in dynamic


def test_atc_scripts_run_with_a_stand_in_atc(tmp_path):
    """The argv each atc call gets, through a stand-in ``atc`` that records it (quoting and gears)."""
    files = ADAPTER.vendor_files(_buckets([64, 128]), TARGET, {})
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    record = tmp_path / "argv.txt"
    fake = tmp_path / "bin" / "atc"
    fake.parent.mkdir()
    fake.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" >> {record}\necho --- >> {record}\n')
    fake.chmod(0o755)
    env = {"PATH": f"{fake.parent}:/usr/bin:/bin"}
    subprocess.run(["bash", str(tmp_path / "atc.sh")], check=True, env=env, cwd="/")
    subprocess.run(
        ["bash", str(tmp_path / "atc_dynamic_dims.sh"), str(tmp_path / "model.onnx")], check=True, env=env
    )
    calls = [call.strip().splitlines() for call in record.read_text().split("---") if call.strip()]
    assert len(calls) == 3
    assert calls[0][:3] == ["--model=model.batch1_seq64.onnx", "--framework=5", "--soc_version=Ascend310B1"]
    assert "--input_shape=pixels:1,3,8,8;ids:1,64" in calls[0] and not any("precision" in a for a in calls[0])
    assert f"--model={tmp_path / 'model.onnx'}" in calls[2] and "--dynamic_dims=64;128" in calls[2]


def test_one_bucket_has_no_gears_and_no_switches(tmp_path):
    files = ADAPTER.vendor_files(_buckets([128]), TARGET, {})
    assert set(files) == {"atc.sh", "fusion_switch.cfg"}
    assert files["fusion_switch.cfg"] == b""
    assert "--fusion_switch_file" not in files["atc.sh"].decode()
    _bash_parses(files["atc.sh"], tmp_path, "atc.sh")


@pytest.mark.models
def test_bert_bundle_for_ascend(tmp_path):
    result = FlexDSAOptimizer("huawei-ascend310b").optimize(
        fixture("bert"), OptimizeOptions(shape_buckets={"batch": [1], "seq": [16, 32]}, measure_latency=False)
    )
    report = result.report
    assert report["validation"]["ok"] is True
    manifest = json.loads(result.artifacts["manifest.json"])
    assert {"atc.sh", "fusion_switch.cfg", "atc_dynamic_dims.sh"} <= set(manifest["vendor_files"])
    assert [b.name for b in result.buckets] == ["batch1_seq16", "batch1_seq32"], "expected one bucket per seq"
    for bucket in result.buckets:  # every node ATC sees is in the op list, at an opset it parses
        assert bucket.model.opset_imports[""] <= 15
        assert all(
            report["partition"][bucket.name]["placement"][n.name] == "accelerator" for n in bucket.model.graph
        )
    _bash_parses(result.artifacts["atc.sh"], tmp_path, "atc.sh")
    assert "bash atc.sh" in result.artifacts["README.md"].decode()
