"""The common accelerator adapter and the toolchain contract, on a custom target spec: legalisation,
the bundle (per-bucket ONNX, manifest, README), fusion legality by opset and by what the vendor fuses,
and the vendor driver run through its JSON contract."""

import json
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from pydantic import ValidationError

from flexdsa_core import FlexDSAOptimizer, RequestSpec
from flexdsa_core.targets import list_targets
from flexdsa_core.targets.accelerator import name_nodes, write_default_attributes
from flexdsa_core.toolchains import Toolchain, ToolchainError
from flexdsa_core.vendor_runs.toolchain_run import _agreement, _compare
from tests.core.fusions.harness import parse
from tests.models import fixture

CUSTOM = {
    "name": "custom-npu", "vendor": "acme", "adapter": "accelerator", "description": "A test NPU.",
    "peak_ops_per_s": {"float16": 2e12}, "mem_bandwidth_bytes_per_s": 1e10, "sram_bytes": 512 * 1024,
    "static_shapes": True, "default_shape_buckets": {"batch": [1]},
    "supported_ops": ["Conv", "Relu", "Add", "MaxPool", "GlobalAveragePool", "Flatten", "Gemm", "BatchNormalization"],
    "op_constraints": {"Conv": {"kernel_max": 5, "source": "datasheet 3.1"}},
}  # fmt: skip


def test_legalisation_writes_defaults_and_names_nodes():
    model = ir.from_proto(parse("""
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 4, 8] x, float[8] s, float[8] b) => (float[1, 4, 8] y)
{ n = LayerNormalization (x, s, b)
  y = Relu (n) }
"""))
    for node in model.graph:
        node.name = ""
    assert write_default_attributes(model) == 2
    layer_norm = next(iter(model.graph))
    assert layer_norm.attributes["epsilon"].value == pytest.approx(1e-5)
    assert layer_norm.attributes["axis"].value == -1
    assert name_nodes(model) == 2
    assert len({n.name for n in model.graph}) == 2


@pytest.fixture(scope="module")
def resnet_result():
    request = RequestSpec.model_validate({"target": CUSTOM, "measure_latency": False})
    return FlexDSAOptimizer(request.target_spec()).optimize(fixture("resnet"), request.options())


def test_custom_target_bundle(resnet_result):
    files = resnet_result.artifacts
    assert {"model.batch1.onnx", "manifest.json", "README.md", "report.json"} <= set(files)
    manifest = json.loads(files["manifest.json"])
    assert manifest["static_shapes"] is True
    assert manifest["buckets"][0]["inputs"] == [{"name": "pixel_values", "shape": [1, 3, 64, 64], "dtype": "float32"}]
    assert "pick_bucket" in manifest
    assert all(name in files for name in (b["file"] for b in manifest["buckets"]))
    readme = files["README.md"].decode()
    assert "model.batch1.onnx" in readme and "Compile it on your side" in readme


def test_custom_target_partition_and_estimates(resnet_result):
    report = resnet_result.report
    assert report["validation"]["ok"] is True
    part = report["partition"]["batch1"]
    stem = [f for f in part["fallback"] if f["op"] == "Conv"]
    assert stem and stem[0]["reason"] == "Conv: kernel 7x7 exceeds the limit of 5 on custom-npu (datasheet 3.1)"
    # Every op on the accelerator is in the table and keeps its constraints.
    model = resnet_result.buckets[0].model
    accelerated = [node for node in model.graph if part["placement"][node.name] == "accelerator"]
    assert accelerated, "expected the ResNet's other Convs, pools and Gemm on custom-npu; none were placed there"
    for node in accelerated:
        assert node.op_type in CUSTOM["supported_ops"] + ["Constant"]
    estimate = report["estimates"]["per_bucket"]["batch1"]["on_target"]
    assert estimate["latency_s"] >= estimate["roofline_bound_s"]
    assert estimate["partial"] is True  # the stem Conv runs on a CPU with no sourced throughput


def test_fusions_beyond_the_opset_range_or_left_to_the_vendor_are_refused():
    spec = {**CUSTOM, "supported_ops": [*CUSTOM["supported_ops"], "LayerNormalization", "MatMul", "Gemm",
            "Softmax", "Transpose", "Reshape", "Mul", "Div", "Sub", "Pow", "Sqrt", "ReduceMean", "Erf", "Gather",
            "Cast", "Unsqueeze", "Slice", "Concat", "Shape", "Tanh", "Where", "Expand", "Equal", "ConstantOfShape"],
            "opset_range": [11, 15], "toolchain_fuses": {"gelu_erf": "it fuses Erf-GELU into one kernel"},
            "default_shape_buckets": {"batch": [1], "seq": [16]}}  # fmt: skip
    request = RequestSpec.model_validate({"target": spec, "measure_latency": False})
    result = FlexDSAOptimizer(request.target_spec()).optimize(fixture("bert"), request.options())
    candidates = {c["rule"]: c for c in result.report["fusions"]["candidates"]}
    assert "has no LayerNormalization" in candidates["layer_norm"]["reason"]
    assert "left to the custom-npu compiler" in candidates["gelu_erf"]["reason"]
    assert "LayerNormalization" not in {n.op_type for n in result.buckets[0].model.graph}


def test_custom_spec_errors_are_refused_before_any_work():
    with pytest.raises(ValidationError, match="unknown toolchain 'fake'"):
        RequestSpec.model_validate({"target": {**CUSTOM, "toolchain": "fake"}}).target_spec()
    with pytest.raises(ValidationError, match="unknown key"):
        RequestSpec.model_validate({"target": {**CUSTOM, "op_constraints": {"Conv": {"kernal_max": 3}}}}).target_spec()


# ---- the driver contract ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ScriptToolchain(Toolchain):
    script: str = ""

    def driver_path(self) -> Path:
        return Path(self.script)


def _fake_ready(tmp_path: Path, driver_body: str) -> tuple[ScriptToolchain, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(driver_body))
    toolchain = ScriptToolchain(name="fake", description="", targets=("custom-npu",), requirements=(("x==1",),),
                                driver="driver.py", script=str(script))  # fmt: skip
    root = tmp_path / "root"
    (root / "fake" / "venv" / "bin").mkdir(parents=True)
    (root / "fake" / "venv" / "bin" / "python").symlink_to(sys.executable)
    (root / "fake" / "ready.json").write_text(json.dumps({"requirements": [["x==1"]], "versions": {"x": "1"}}))
    return toolchain, root


def test_toolchain_status(tmp_path):
    toolchain, root = _fake_ready(tmp_path, "")
    assert toolchain.status(root).ready and toolchain.status(root).versions == {"x": "1"}
    assert not toolchain.status(tmp_path / "elsewhere").ready
    assert "flexdsa toolchains install fake" in toolchain.status(tmp_path / "elsewhere").detail
    (root / "fake" / "ready.json").write_text(json.dumps({"requirements": [["x==2"]]}))
    assert "other pins" in toolchain.status(root).detail


def test_driver_contract_round_trip(tmp_path):
    toolchain, root = _fake_ready(tmp_path, """
        import json, sys
        request = json.load(open(sys.argv[1]))
        json.dump({"ok": True, "buckets": [{"name": b["name"], "artifacts": []} for b in request["buckets"]]},
                  open(sys.argv[2], "w"))
    """)
    result = toolchain.run(root, {"buckets": [{"name": "b1"}]}, workdir=tmp_path)
    assert result["buckets"] == [{"name": "b1", "artifacts": []}]


def test_driver_failure_is_a_plain_toolchain_error(tmp_path):
    toolchain, root = _fake_ready(tmp_path, """
        import json, sys
        json.dump({"ok": False, "error": "layer 3: unsupported op Foo"}, open(sys.argv[2], "w"))
    """)
    with pytest.raises(ToolchainError, match="failed: layer 3: unsupported op Foo"):
        toolchain.run(root, {}, workdir=tmp_path)
    crashing, root2 = _fake_ready(tmp_path / "c", "raise SystemExit('boom')")
    with pytest.raises(ToolchainError, match="without a result"):
        crashing.run(root2, {}, workdir=tmp_path)


def test_vendor_outputs_and_placement_are_compared(tmp_path):
    want = np.linspace(-1, 1, 100, dtype=np.float32)
    np.save(tmp_path / "y.npy", want + 1e-3)
    [check] = _compare({"y": want}, {"y": str(tmp_path / "y.npy")})
    assert check["cosine"] > 0.999 and check["max_abs"] == pytest.approx(1e-3, rel=1e-3)
    assert _compare({"y": want}, {})[0]["note"] == "not returned by the toolchain"
    agreement = _agreement({"a": "accelerator", "b": "cpu", "c": "accelerator"},
                           {"a": "accelerator", "b": "accelerator", "d": "cpu"})  # fmt: skip
    assert agreement["share"] == 0.5 and agreement["compared"] == 2
    assert agreement["differ"] == [{"node": "b", "ours": "cpu", "vendor": "accelerator"}]


def test_a_dynamic_dim_left_on_a_static_part_takes_the_plans_value_and_says_why():
    # No default at all on this part: the Shape Tracker's plan sizes seq, capped by BERT's 64 positions.
    spec = {**CUSTOM, "default_shape_buckets": {}}
    request = RequestSpec.model_validate({"target": spec, "measure_latency": False})
    result = FlexDSAOptimizer(request.target_spec()).optimize(fixture("bert"), request.options())
    assert [b.name for b in result.buckets] == ["batch1_seq64"]
    plan = result.report["shapes"]["plan"]["dims"]
    assert plan["seq"]["value"] == 64 and plan["seq"]["kind"] == "sequence"
    assert "does not run at 128" in plan["seq"]["why"]
    assert result.report["validation"]["ok"]


CONV_96 = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[1, 3, 96, 96] x, float[8, 3, 3, 3] w, float[8] b) => (float[1, 8, 96, 96] y)
{ c = Conv <pads = [1, 1, 1, 1]> (x, w, b)
  y = Relu (c) }
"""
_ACCELERATORS = [t.name for t in list_targets() if t.name != "cpu-ort"]


@pytest.mark.parametrize("target", _ACCELERATORS)
def test_no_generated_text_carries_shapes_other_than_the_buckets(target):
    """Issue 23: a generic converter snippet (RKNN input_size_list [[1,3,640,640]], ATC input:1,3,224,224) in
    the README or manifest would build a wrong model; every shape the bundle's text names is this model's."""
    import re

    import onnx

    proto = parse(CONV_96)
    rng = np.random.default_rng(0)
    for name, shape in (("w", (8, 3, 3, 3)), ("b", (8,))):
        proto.graph.initializer.append(onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name))
    request = RequestSpec.model_validate(
        {"target": target, "measure_latency": False, "allow_synthetic_calibration": True}
    )
    result = FlexDSAOptimizer(request.target_spec()).optimize(proto, request.options())
    readme = result.artifacts["README.md"].decode()
    manifest = json.loads(result.artifacts["manifest.json"])
    assert "Converter reference" not in readme and "command" not in (manifest.get("converter") or {})
    texts = {"README.md": readme, "manifest.json": json.dumps(manifest)}
    texts.update({name: data.decode() for name, data in result.artifacts.items()
                  if isinstance(data, bytes) and name.endswith((".py", ".sh", ".json", ".cfg", ".txt", ".md"))
                  and name not in ("report.json", "fusion_plan.json")})  # fmt: skip
    four = re.compile(r"(?<![\d.])(\d+)\s*,\s*(\d+)\s*,\s*(\d+)\s*,\s*(\d+)(?![\d.])")
    ours = {(1, 3, 96, 96), (1, 8, 96, 96), (1, 96, 96, 3), (1, 96, 96, 8), (8, 3, 3, 3)}
    named = []
    for name, text in texts.items():
        for match in four.finditer(text):
            shape = tuple(int(g) for g in match.groups())
            assert shape in ours, f"{name} names shape {shape}, not this model's: ...{text[max(0, match.start() - 80):match.end() + 40]}"
            named.append(shape)
    # The pattern does find shapes: the bundle names the model's own somewhere (its manifest's inputs at least).
    assert named, f"expected the bundle's text to name this model's shapes; the pattern found none in {sorted(texts)}"


def test_a_vendor_failure_reads_as_one_line_naming_the_exception():
    from flexdsa_core.vendor_runs.toolchain_run import one_line_reason

    traceback = (
        "The rockchip toolchain exited with status 1 without a result. Last lines of its log:\n"
        "Traceback (most recent call last):\n  File \"convert.py\", line 3, in build\n    rknn.build()\n"
        "RuntimeError: Unsupported op Foo in layer 3\n"
    )
    assert one_line_reason(traceback) == (
        "The rockchip toolchain exited with status 1 without a result: RuntimeError: Unsupported op Foo in layer 3"
    )
    assert one_line_reason("The qualcomm toolchain failed: no context binary") == (
        "The qualcomm toolchain failed: no context binary"
    )
    assert "\n" not in one_line_reason("first line\nsecond line") and one_line_reason("") == "no reason given"
