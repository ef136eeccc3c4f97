"""The manifest as the deploy contract: each file's role and bucket told by its name, and on a real bundle
every file listed with its size and sha256, each bucket with its dims and its artifacts (preferred first)."""

from __future__ import annotations

import hashlib
import json

import pytest

from flexdsa_core import FlexDSAOptimizer, RequestSpec
from flexdsa_core.vendor_runs.deploy_manifest import FORMAT, _bucket_of, file_role
from tests.runtime.tiny_models import MASKED, model_bytes

BUCKETS = ["batch1_seq8", "batch1_seq16"]


@pytest.mark.parametrize(
    "name, role, bucket",
    [
        ("model.batch1_seq8.onnx", "onnx", "batch1_seq8"),
        ("model.batch1_seq16.onnx", "onnx", "batch1_seq16"),
        ("model.batch1_seq8.portable.onnx", "onnx-portable", "batch1_seq8"),
        ("model.batch1_seq8.onnx.data", "onnx-external-data", "batch1_seq8"),
        ("model.batch1_seq8.rknn", "rknn", "batch1_seq8"),
        ("model.batch1_seq16.qnn_ctx.onnx", "qnn-context", "batch1_seq16"),
        ("model.batch1_seq16.qnn_ctx_qnn.bin", "qnn-context-binary", "batch1_seq16"),
        ("model.batch1_seq8.qdq.onnx", "qdq-onnx", "batch1_seq8"),
        ("calibration.npz", "calibration", "batch1_seq8"),
        ("calibration/000_x.npy", "calibration", "batch1_seq8"),
        ("dataset.txt", "calibration", "batch1_seq8"),
        ("calibration.batch1_seq16.npz", "calibration", "batch1_seq16"),
        ("calibration/batch1_seq16/000_x.npy", "calibration", "batch1_seq16"),
        ("dataset.batch1_seq16.txt", "calibration", "batch1_seq16"),
        ("report.json", "report", None),
        ("README.md", "readme", None),
    ],
)
def test_roles_and_buckets_by_name(name, role, bucket):
    assert file_role(name) == role
    assert _bucket_of(name, BUCKETS) == bucket


def test_vendor_files_are_scripts_and_the_single_bucket_owns_model_onnx():
    assert file_role("convert_rknn.py", frozenset({"convert_rknn.py"})) == "script"
    assert (
        _bucket_of("model.onnx", ["dynamic"]) == "dynamic"
        and _bucket_of("model.onnx.data", ["static"]) == "static"
    )


def test_a_bundle_lists_every_file_with_its_checksum():
    request = RequestSpec.model_validate(
        {
            "target": "rockchip-rk3588",
            "shape_buckets": {"batch": [1], "seq": [8, 16]},
            "measure_latency": False,
        }
    )
    result = FlexDSAOptimizer(request.target_spec()).optimize(model_bytes(MASKED), request.options())
    manifest = json.loads(result.artifacts["manifest.json"])
    assert manifest["format"] == FORMAT
    assert set(manifest["files"]) == set(result.artifacts) - {"manifest.json"}
    for name, entry in manifest["files"].items():
        data = result.artifacts[name]
        data = data if isinstance(data, bytes) else data.read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["size"] == len(data)
    assert [b["dims"] for b in manifest["buckets"]] == [{"batch": 1, "seq": 8}, {"batch": 1, "seq": 16}]
    for bucket in manifest["buckets"]:
        assert bucket["artifacts"][0] == {
            "file": f"model.{bucket['name']}.onnx",
            "role": "onnx",
            "runtime": "onnxruntime",
            "load": bucket["artifacts"][0]["load"],
        }
    assert manifest["files"]["convert_rknn.py"]["role"] == "script"
    assert manifest["runtime"]["policy"] == "fewest_padded_elements"
    assert "runtime" in manifest["pick_bucket"]


@pytest.mark.parametrize(
    "target, runtime, says",
    [("qualcomm-sm8650", None, "compile_qnn.py"), ("amd-xdna2", "onnxruntime", "VitisAIExecutionProvider"),
     ("xilinx-kv260", None, "compile_kv260.sh")],
)  # fmt: skip
def test_a_qdq_model_is_loaded_as_its_vendor_loads_it(target, runtime, says):
    """The QDQ model's runtime and load text come from the target's own vendor folder, not the generic ONNX one."""
    from flexdsa_core.targets import load_target
    from flexdsa_core.vendor_runs.deploy_manifest import complete_manifest

    spec = load_target(target)
    artifacts = {
        "manifest.json": json.dumps({"buckets": [{"name": "batch1_seq8"}]}).encode(),
        "model.batch1_seq8.qdq.onnx": b"qdq",
    }
    manifest = json.loads(complete_manifest(artifacts, {}, spec))
    (artifact,) = manifest["buckets"][0]["artifacts"]
    assert artifact["role"] == "qdq-onnx" and artifact["runtime"] == runtime and says in artifact["load"]
