"""``precision`` on the accelerator targets: what each adapter asks its vendor toolchain for, dtypes a part
cannot compute refused before any work, every shape bucket quantised, ``mixed``'s float layers handed to the
vendor (QNN uint16 overrides, RKNN hybrid quantisation, Quark exclusions), and, with a toolchain installed,
each format made by the real vendor tool on our calibration samples and judged by the accuracy target on
them (``report.json`` → ``precision.toolchain_accuracy``)."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions, RequestSpec
from flexdsa_core.calibration import CalibrationError, load_calibration
from flexdsa_core.errors import InvalidOptionsError, ValidationFailedError
from flexdsa_core.options import AccuracyTarget
from flexdsa_core.targets import get_adapter, load_target
from tests.core.targets import _bundle_checks as checks
from tests.core.test_precision import _clear_images, _mlp_calibration, _sensitive_mlp
from tests.models import fixture

NOT_A_CLASSIFIER = AccuracyTarget(top1_outputs=[])
TARGETS = Path(__file__).resolve().parents[3] / "flexdsa_core" / "targets"
# A mixed plan as the precision stage writes it for one bucket: layer 'sensitive' kept out of int8.
MIXED_PLAN = {
    "requested": "mixed", "bucket": "batch1", "accuracy_target": {"min_cosine": 0.995},
    "float_layers": ["sensitive"], "float_layer_tensors": {"sensitive": ["wide", "y"]},
}  # fmt: skip


def _options(target: str, plan: dict) -> dict:
    return get_adapter(load_target(target)).toolchain_options(load_target(target), {"precision": plan})


def _npz(**arrays) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


# ---- unsupported dtypes: refused before any work ------------------------------------------------------
@pytest.mark.parametrize(
    "target, says",
    [("xilinx-kv260", "xilinx-kv260 computes int8, not float16"),
     ("amd-xdna2", "its half-precision type is bfloat16")],
)  # fmt: skip
def test_fp16_on_a_part_without_float16_is_refused_as_unsupported_dtype(target, says):
    with pytest.raises(InvalidOptionsError, match="unsupported dtype on target") as err:
        FlexDSAOptimizer(target).optimize(fixture("resnet"), OptimizeOptions(precision="fp16"))
    assert says in err.value.message and err.value.http_status == 422
    assert err.value.details["target_dtypes"] == load_target(target).dtypes


# ---- what each adapter asks its toolchain for ---------------------------------------------------------
def test_qnn_format_follows_precision():
    assert _options("qualcomm-sm8650", {"requested": "int8"})["precision"] == "int8"
    assert _options("qualcomm-sm8650", {"requested": "int8"})["activation_type"] == "auto"  # uint16 on a miss
    assert _options("qualcomm-sm8650", {"requested": "fp16"})["precision"] == "fp16"
    fp32 = _options("qualcomm-sm8650", {"requested": "fp32"})
    assert fp32["precision"] == "fp16" and "computes no float32" in fp32["why"]
    mixed = _options("qualcomm-sm8650", MIXED_PLAN)
    assert mixed["precision"] == "mixed" and mixed["uint16_tensors"] == {"batch1": ["wide", "y"]}
    assert mixed["min_cosine"] == 0.995  # the user's accuracy target decides uint8 vs uint16


def test_rknn_quantiser_and_hybrid_list_follow_precision():
    assert "dtype" not in _options("rockchip-rk3588", {"requested": "fp32"})  # float16, no calibration
    int8 = _options("rockchip-rk3588", {"requested": "int8"})
    assert int8["dtype"] == "int8" and int8["quantized_dtype"] == "w8a8" and "custom_hybrid" not in int8
    assert _options("rockchip-rk3588", MIXED_PLAN)["custom_hybrid"] == {"batch1": [["wide", "y"]]}


def test_quark_preset_follows_precision_and_the_part():
    assert _options("amd-xdna2", {"requested": "int8"})["precision"] == "int8"
    npu = _options("amd-xdna2", {"requested": "fp32"})
    assert npu["precision"] == "bf16" and "BF16" in npu["why"]  # what the Vitis AI EP makes of fp32 (A1)
    dpu = _options("xilinx-kv260", {"requested": "fp32"})
    assert dpu["precision"] == "int8" and "int8 only" in dpu["why"]  # XINT8 is all the DPU runs
    assert _options("xilinx-kv260", MIXED_PLAN)["float_layers"] == {"batch1": ["sensitive"]}


def test_rknn_tensor_names_are_mapped_onto_the_toolkits_renames():
    spec = importlib.util.spec_from_file_location("rockchip_driver", TARGETS / "rockchip" / "driver.py")
    driver = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(driver)
    graph = onnx.load_from_string(_sensitive_mlp()).graph
    # As rknn-toolkit2 2.5.0 names the MLP's tensors: MatMul outputs get '_mm', the Relu is fused away.
    known = {"x", "x_tp-rs", "h_mm", "h_rs_sw", "wide_mm", "y_mm", "y", "x_int8", "y_int8"}
    mapped, unmapped = driver.map_hybrid([["wide", "y"], ["r", "wide"], ["nowhere", "gone"]], known, graph)
    assert mapped == [["wide_mm", "y"], ["h_mm", "wide_mm"]]  # 'r' (the fused Relu's) -> its producer's input
    assert unmapped == [["nowhere", "gone"]]


# ---- every shape bucket ------------------------------------------------------------------------------
def test_int8_quantises_every_shape_bucket_each_at_its_own_shapes():
    """TensorRT's symmetric QDQ (validated in ONNX Runtime) on two batch buckets: the samples (batch 1 rows)
    fit both, each bucket is quantised and judged separately. The random-weight ResNet's logits on noise are
    near-tied, so their top-1 means nothing: they are judged as a tensor (cosine)."""
    images = np.random.default_rng(5).standard_normal((8, 3, 64, 64)).astype(np.float32)
    options = OptimizeOptions(precision="int8", shape_buckets={"batch": [1, 2]}, measure_latency=False,
                              accuracy={"outputs": {"logits": "cosine"}})  # fmt: skip
    result = FlexDSAOptimizer("nvidia-orin-nano").optimize(fixture("resnet"), options, calibration=_npz(pixel_values=images))
    precision = result.report["precision"]
    assert set(precision["buckets"]) == {"batch1", "batch2"}
    for name, section in precision["buckets"].items():
        assert section["bucket"] == name and section["shipped"] == "static_qdq" and section["accuracy"]["ok"]
        assert section["calibration"]["input_shapes"]["pixel_values"][0] == int(name.removeprefix("batch"))
    shipped = {b.name: {n.op_type for n in b.model.graph} for b in result.buckets}
    assert all("QuantizeLinear" in ops for ops in shipped.values()), shipped


def test_a_bucket_the_samples_do_not_fit_is_calibrated_on_synthetic_inputs_and_said():
    ids = np.random.default_rng(2).integers(0, 200, size=(8, 8)).astype(np.int64)
    samples = _npz(input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=np.zeros_like(ids))
    options = OptimizeOptions(precision="int8", shape_buckets={"batch": [1], "seq": [8, 16]}, measure_latency=False)
    result = FlexDSAOptimizer("rockchip-rk3588").optimize(fixture("bert"), options, calibration=samples)
    precision = result.report["precision"]
    assert precision["buckets"]["batch1_seq8"]["calibration"]["source"] == "uploaded"
    assert precision["buckets"]["batch1_seq16"]["calibration"]["source"] == "synthetic"
    assert any("do not fit shape bucket 'batch1_seq16'" in w for w in precision["warnings"])
    # Each bucket's samples ship for the vendor's quantiser, at that bucket's shapes.
    assert load_calibration(result.artifacts["calibration.npz"])["input_ids"].shape == (8, 8)
    assert load_calibration(result.artifacts["calibration.batch1_seq16.npz"])["input_ids"].shape[1] == 16
    assert result.artifacts["dataset.batch1_seq16.txt"].decode().startswith("calibration/batch1_seq16/000_")


def test_samples_that_fit_no_bucket_are_refused():
    ids = np.zeros((4, 12), np.int64)
    samples = _npz(input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=ids)
    options = OptimizeOptions(precision="int8", shape_buckets={"batch": [1], "seq": [8, 16]}, measure_latency=False)
    with pytest.raises(CalibrationError, match="bucket 'batch1_seq8'"):
        FlexDSAOptimizer("rockchip-rk3588").optimize(fixture("bert"), options, calibration=samples)


# ---- mixed on a vendor-quantised target, no toolchain needed -------------------------------------------
def test_mixed_ranks_layers_for_the_vendor_and_says_what_it_could_not_check():
    """Ascend (no toolchain installs): the stand-in search keeps the huge-range layer out of int8 and names
    it in the report; the vendor step did not run, so the report says the result is unchecked."""
    options = OptimizeOptions(precision="mixed", accuracy=NOT_A_CLASSIFIER, measure_latency=False)
    result = FlexDSAOptimizer("huawei-ascend310b").optimize(_sensitive_mlp(), options, calibration=_mlp_calibration())
    precision = result.report["precision"]
    assert precision["vendor_quantiser"] and precision["shipped"] == "fp32"
    assert "sensitive" in precision["float_layers"] and "first" not in precision["float_layers"]
    assert not precision["stand_in_all_int8"]["ok"] and precision["stand_in_mixed"]["ok"]
    rows = {row["layer"]: row for row in precision["layers"]}
    assert rows["sensitive"]["on_target"] == "float16" and rows["first"]["on_target"] == "int8"
    assert any("was not checked against the accuracy target" in w for w in result.report["warnings"])


# ---- with the vendor toolchains installed --------------------------------------------------------------
def _with_toolchain(target: str, model, precision: str, calibration=None, **options):
    request = RequestSpec.model_validate(
        {"target": target, "measure_latency": False, "precision": precision, **options}
    )
    return FlexDSAOptimizer(request.target_spec(), toolchain_root=checks.TOOLCHAIN_ROOT).optimize(
        model, request.options(), calibration=calibration
    )


def _judged(result, samples: int = 8) -> dict:
    """The vendor's quantised model, judged on samples held out from its quantiser's dataset (up to 8 of the
    ones our stage judged on): it ran and meets the target."""
    precision, toolchain = result.report["precision"], result.report["toolchain"]
    assert toolchain["ran"], toolchain
    accuracy = precision["toolchain_accuracy"]
    assert accuracy["ok"] and accuracy["samples"] == samples, accuracy
    assert accuracy["measured_on"] == f"{samples} held-out samples, not in the vendor quantiser's dataset"
    [entry] = toolchain["buckets"].values()
    return entry


MLP_ACCURACY = {"accuracy": {"top1_outputs": []}}


def test_qnn_mixed_gives_the_sensitive_layers_uint16_on_the_emulated_htp():
    """ViT misses the target with uint8 activations on the HTP (cosine 0.950): mixed raises the activations of
    the layers the stand-in search keeps out of int8 to uint16, and the emulated HTP's outputs meet it."""
    checks.toolchain_or_skip("qualcomm", "onnxruntime-qnn")
    result = _with_toolchain("qualcomm-sm8650", fixture("vit"), "mixed")
    entry = _judged(result)
    tensors = len(result.report["precision"]["float_layer_tensors"])
    assert tensors > 0 and "tensor(s) of the sensitive layers at uint16" in entry["quantization"]
    assert "model.batch1.qnn_ctx_qnn.bin" in result.artifacts


def test_qnn_int8_calibrates_on_our_samples_and_fp32_runs_htp_fp16():
    checks.toolchain_or_skip("qualcomm", "onnxruntime-qnn")
    result = _with_toolchain("qualcomm-sm8650", fixture("resnet"), "int8", _npz(pixel_values=_clear_images(8)))
    entry = _judged(result, samples=2)  # 8 samples: 4-fold, the first fold's 2 held out judge the emulated HTP
    assert entry["quantization"].startswith("QDQ: uint")
    fp32 = _with_toolchain("qualcomm-sm8650", fixture("resnet"), "fp32")
    [entry] = fp32.report["toolchain"]["buckets"].values()
    assert "HTP FP16" in entry["quantization"] and any("computes no float32" in n for n in entry["notes"])
    assert "model.batch1.qdq.onnx" not in fp32.artifacts


def test_rknn_mixed_keeps_the_sensitive_layers_float16_by_hybrid_quantisation():
    """The hybrid keeping the stand-in's float layers float16 is the one int8 build rknn's simulator finds
    accurate on the held-out samples (plain w8a8 misses, the vendor alone's too); on this tiny MLP it costs the
    same cycles as float16 by rknn's estimate, so the plainer float16 ships and the report says why."""
    checks.toolchain_or_skip("rockchip", "rknn-toolkit2")
    result = _with_toolchain("rockchip-rk3588", _sensitive_mlp(), "mixed", _mlp_calibration(), **MLP_ACCURACY)
    plan = json.loads(result.artifacts["fusion_plan.json"])["batch1"]["vendor_exploration"]
    tried = {c["candidate"]: c for c in plan["candidates"]}
    hybrid, plain = tried["w8a8 + float16 hybrid"], tried["w8a8"]
    assert hybrid["accuracy"]["ok"] and not plain["accuracy"]["ok"]
    assert not tried["vendor alone: w8a8"]["accuracy"]["ok"]
    assert hybrid["accuracy"]["samples"] > 0 and hybrid["vendor"]["cycles"] >= tried["ours"]["vendor"]["cycles"]
    vendor = result.report["vendor"]["buckets"]["batch1"]
    assert vendor["precision"] == "float16" and "no quantised candidate met the accuracy target more cheaply" in vendor["decision"]
    assert "model.batch1.rknn" in result.artifacts


def test_rknn_int8_that_misses_the_target_fails_naming_the_layers():
    checks.toolchain_or_skip("rockchip", "rknn-toolkit2")
    with pytest.raises(ValidationFailedError, match=r"misses the accuracy target.*sensitive \(loss") as err:
        _with_toolchain("rockchip-rk3588", _sensitive_mlp(), "int8", _mlp_calibration(), **MLP_ACCURACY)
    assert "precision 'mixed'" in err.value.message
    # With precision_fallback fp32, the bundle ships float, without the failing .rknn, and says so.
    result = _with_toolchain(
        "rockchip-rk3588", _sensitive_mlp(), "int8", _mlp_calibration(), precision_fallback="fp32", **MLP_ACCURACY
    )
    assert "model.batch1.rknn" not in result.artifacts and "model.batch1.onnx" in result.artifacts
    assert any("quantised artifacts were left out" in w for w in result.report["warnings"])


def test_quark_mixed_on_the_dpu_excludes_the_sensitive_layers():
    checks.toolchain_or_skip("amd", "amd-quark")
    result = _with_toolchain("xilinx-kv260", _sensitive_mlp(), "mixed", _mlp_calibration(), **MLP_ACCURACY)
    entry = _judged(result)
    quantization = entry["quantization"]
    assert quantization["preset"] == "XINT8" and quantization["precision"] == "mixed"
    assert "sensitive" in quantization["kept_float_by_sensitivity"]
    assert quantization["calibration_samples"] == 16  # the half of the 32 our stage calibrated on


def test_quark_bf16_is_what_an_fp32_request_gets_on_the_npu():
    checks.toolchain_or_skip("amd", "amd-quark")
    result = _with_toolchain("amd-xdna2", fixture("resnet"), "fp32")
    [entry] = result.report["toolchain"]["buckets"].values()
    assert entry["quantization"]["preset"] == "BF16" and entry["quantization"]["reached"]
    assert min(o["cosine"] for o in entry["numerics"]) >= 0.999  # against the original, in ONNX Runtime
    quantized = onnx.load_from_string(result.artifact_bytes("model.batch1.qdq.onnx"))
    assert {n.domain for n in quantized.graph.node} >= {"com.amd.quark"}  # BF16 Q/DQ, Quark's own ops
