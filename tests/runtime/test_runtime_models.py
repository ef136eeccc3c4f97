"""flexdsa_runtime on the real-architecture fixtures, for every target: shapes between and below the buckets
give the original model's outputs (ONNX Runtime on the bundle's ONNX, which every bundle has, within the
float32 validation tolerances); with a vendor toolchain installed, the vendor's own runtime through the bridge
(rknn-toolkit2's simulator, QNN's HTP emulation) gives them within the vendor check's cosine. The manifest is
the deploy contract: every file of the bundle listed with its role, bucket and sha256, nothing else read."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from flexdsa_runtime import Runtime
from tests.core.targets._bundle_checks import mixed_bundle, toolchain_or_skip
from tests.models import fixture
from tests.runtime.conftest import assert_close, cosine, input_names, original_outputs, text_feeds

pytestmark = pytest.mark.models

TARGETS = (
    "cpu-ort", "rockchip-rk3588", "qualcomm-sm8650", "huawei-ascend310b", "nvidia-orin-nano", "amd-xdna2",
    "xilinx-kv260",
)  # fmt: skip
TEXT = ("bert", "gpt2", "llama")
VISION = ("vit", "resnet", "mobilenetv2")
TEXT_BUCKETS = {"batch": [1], "seq": [8, 16]}
VISION_BUCKETS = {"batch": [2]}
# The vendor toolchain's own bar on its simulator/emulator (flexdsa_core.toolchains.base.MIN_COSINE).
MIN_COSINE = 0.99


def vision_feeds(model: Path, batch: int, seed: int = 0) -> dict:
    import onnxruntime as ort

    [value] = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).get_inputs()
    shape = [batch, *value.shape[1:]]
    return {value.name: np.random.default_rng(seed + batch).standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", TEXT)
def test_text_models_between_and_below_the_buckets(make_bundle, name, target):
    model = fixture(name)
    bundle = make_bundle(model, target, shape_buckets=TEXT_BUCKETS)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["runtime"]["padding"]["seq"]["tolerated"] is True, manifest["runtime"]["padding"]
    names = input_names(model)
    with Runtime.open(bundle, backend="onnxruntime") as runtime:
        for seq in (1, 5, 8, 12, 16):
            feeds = text_feeds(names, 1, seq)
            assert_close(original_outputs(model, feeds), runtime.run(feeds))
        assert runtime.traffic.padding_waste() > 0


@pytest.mark.parametrize("target", ("cpu-ort", "rockchip-rk3588", "qualcomm-sm8650"))
@pytest.mark.parametrize("name", VISION)
def test_vision_models_pad_the_batch(make_bundle, name, target):
    model = fixture(name)
    bundle = make_bundle(model, target, shape_buckets=VISION_BUCKETS)
    with Runtime.open(bundle, backend="onnxruntime") as runtime:
        for batch in (1, 2):
            feeds = vision_feeds(model, batch)
            assert_close(original_outputs(model, feeds), runtime.run(feeds))


VENDOR = {  # target -> (toolchain, package, bridge backend, the compiled artifact's role)
    "rockchip-rk3588": ("rockchip", "rknn-toolkit2", "rknn-simulator", "rknn"),
    "qualcomm-sm8650": ("qualcomm", "onnxruntime-qnn", "qnn-emulator", "qnn-context"),
}


@pytest.mark.parametrize("target", list(VENDOR))
@pytest.mark.parametrize("name", ("bert", "resnet"))
def test_the_vendor_runtime_serves_the_compiled_artifact(make_bundle, name, target):
    toolchain, package, backend, role = VENDOR[target]
    toolchain_or_skip(toolchain, package)
    model = fixture(name)
    buckets = TEXT_BUCKETS if name in TEXT else VISION_BUCKETS
    bundle = make_bundle(model, target, toolchain=True, shape_buckets=buckets)
    manifest = json.loads((bundle / "manifest.json").read_text())
    for bucket in manifest["buckets"]:
        assert bucket["artifacts"][0]["role"] == role, bucket["artifacts"]  # the compiled one is preferred
    shapes = [(1, seq) for seq in (5, 8, 12)] if name in TEXT else [(batch, None) for batch in (1, 2)]
    with Runtime.open(bundle, backend=backend) as runtime:
        assert set(runtime.backend_names().values()) == {backend}
        for batch, seq in shapes:
            feeds = text_feeds(input_names(model), batch, seq) if seq else vision_feeds(model, batch)
            want, got = original_outputs(model, feeds), runtime.run(feeds)
            for output, value in want.items():
                assert got[output].shape == value.shape
                assert cosine(value, got[output]) >= MIN_COSINE, (output, batch, seq)


@pytest.mark.parametrize("target", list(VENDOR) + ["cpu-ort"])
def test_the_manifest_lists_every_file_of_the_bundle(make_bundle, target):
    toolchain = target in VENDOR
    if toolchain:
        toolchain_or_skip(*VENDOR[target][:2])
    bundle = make_bundle(fixture("bert"), target, toolchain=toolchain, shape_buckets=TEXT_BUCKETS)
    _check_listing(bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    roles = {name: entry["role"] for name, entry in manifest["files"].items()}
    for bucket in manifest["buckets"]:
        own = {a["file"]: a["role"] for a in bucket["artifacts"]}
        assert own[f"model.{bucket['name']}.onnx"] == "onnx"
        if target == "rockchip-rk3588":
            assert own[f"model.{bucket['name']}.rknn"] == "rknn"
        if target == "qualcomm-sm8650":
            assert own[f"model.{bucket['name']}.qnn_ctx.onnx"] == "qnn-context"
            assert own[f"model.{bucket['name']}.qnn_ctx_qnn.bin"] == "qnn-context-binary"
        assert all(a["load"] for a in bucket["artifacts"])
    assert roles["report.json"] == "report" and roles.get("README.md", "readme") == "readme"


def test_calibration_sets_and_scripts_are_listed_per_bucket(tmp_path):
    mixed_bundle("rockchip-rk3588", tmp_path)
    _check_listing(tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    calibration = {n: e for n, e in manifest["files"].items() if e["role"] == "calibration"}
    assert "calibration.npz" in calibration and "dataset.txt" in calibration
    assert any(name.startswith("calibration/") for name in calibration)
    [bucket] = manifest["buckets"]
    assert all(entry.get("bucket") == bucket["name"] for entry in calibration.values())
    assert manifest["files"]["convert_rknn.py"]["role"] == "script"


def _check_listing(bundle: Path) -> None:
    """Every file but the manifest is listed, with its size and sha256; nothing listed is absent."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    on_disk = {p.relative_to(bundle).as_posix() for p in bundle.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest["files"]) == on_disk
    for name, entry in manifest["files"].items():
        data = (bundle / name).read_bytes()
        assert entry["size"] == len(data) and entry["sha256"] == hashlib.sha256(data).hexdigest(), name
