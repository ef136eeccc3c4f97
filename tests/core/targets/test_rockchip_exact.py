"""Rockchip RK3588 with rknn-toolkit2 in the loop, on the trained MiniLM-L6 sentence encoder and real sentences:
where the toolkit's own w8a8 loses the embedding, the exact rewrites (a bounded attention-mask constant, the
feed-forward outlier channels on a path of their own, the normalised inputs' outlier channels in pieces) and
the float16 layers chosen from its own per-layer
analysis make its int8 accurate on held-out sentences, at fewer of its cycles than its float16 build; and a
model that passes its inputs through to outputs (as a published encoder does), on which the toolkit dies, is
compiled with those outputs left to the runtime.

Each test compiles with the toolkit and runs its simulator: minutes, not seconds (skipped without the toolchain,
or with ``FLEXDSA_TEST_TOOLCHAINS=skip``).
"""

from __future__ import annotations

import io
import json

import numpy as np
import onnx
import pytest

from bench.trained import fixture
from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from tests.core.targets import _bundle_checks as checks

pytestmark = pytest.mark.models

BUCKETS = {"batch": [1], "seq": [32]}
BUCKET = "batch1_seq32"


def _optimizer():
    checks.toolchain_or_skip("rockchip", "rknn-toolkit2")
    return FlexDSAOptimizer("rockchip-rk3588", toolchain_root=checks.TOOLCHAIN_ROOT)


def _npz(arrays: dict) -> bytes:
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def test_exact_rewrites_make_the_toolkits_int8_accurate_on_minilm():
    optimizer = _optimizer()
    trained = fixture("minilm-l6")
    # Every held-out sentence's embedding must keep cosine 0.99, not only the pooled figure.
    accuracy = {**trained.accuracy, "min_sample_cosine": 0.99}
    options = OptimizeOptions(shape_buckets=BUCKETS, precision="int8", accuracy=accuracy, measure_latency=False)
    result = optimizer.optimize(trained.model, options, calibration=_npz(trained.arrays()))
    row = result.report["vendor"]["buckets"][BUCKET]
    # The toolkit alone: w8a8 at half its float16 cycles, but the embedding is lost on held-out sentences.
    alone_int8 = row["vendor_alone_int8"]
    assert not alone_int8["accuracy"]["ok"]
    assert alone_int8["accuracy"]["outputs"]["sentence_embedding"]["cosine"] < 0.6
    # Its own per-layer analysis says where: the fused attention, whose int8 "scores + mask" spans the mask.
    worst = row["exact_rewrites"]["layer_accuracy_vendor_alone"]["worst_single"]
    assert any(layer["op"] == "exSDPAttention" and layer["cosine_single"] < 0.9 for layer in worst), worst
    # Ours: the three exact rewrites taken (the normalised inputs' outlier channels split into pieces as well:
    # every feed-forward input's, and the one channel that stands out at each attention's input), checked exact
    # against the original, and int8 that keeps every held-out sentence's embedding.
    exact = row["exact_rewrites"]
    forms = exact["forms"]
    assert forms["bounded_attention_mask"]["sites"] and forms["outlier_channel_split"]["sites"]
    split = forms["input_outlier_split"]["sites"]
    assert len(split) == 24, split
    attention = [site for site in split if site.rsplit("/", 2)[-2] in ("query", "key", "value")]
    assert len(attention) == 18 and all(split[site].count(" in ") == 1 for site in attention), split
    assert "within the fp32 tolerances" in exact["validation"]
    assert row["precision"].startswith("w8a8 + exact rewrites"), row["decision"]
    assert row["shipped"] == "ours + forms"
    final = result.report["toolchain"]["buckets"][BUCKET]
    assert final["accuracy"]["ok"], final["accuracy"]
    assert final["accuracy"]["outputs"]["sentence_embedding"]["cosine"] >= 0.99
    # The search picked it on 8 held-out sentences; the claim rests on 32 (confirmed, then the final build judged
    # on the same), each of them at cosine 0.99 or more.
    assert "confirmed on 32" in row["decision"] and final["accuracy"]["samples"] == 32
    assert final["accuracy"]["outputs"]["sentence_embedding"]["worst_sample_cosine"] >= 0.99
    assert final["accuracy"]["measured_on"].startswith("32 held-out")
    # At fewer of the toolkit's cycles than its float16 build (the vendor alone's best accurate one).
    assert row["ours"]["cycles"] < 0.6 * row["vendor_alone"]["cycles"]
    assert row["ratio"] <= 0.55 and row["vendor_alone_best"]["cycles"] == row["vendor_alone"]["cycles"]
    assert row["ours"]["cpu_nodes"] <= alone_int8["cpu_nodes"]
    # The bundle's script repeats the hybrid the toolchain built.
    script = result.artifacts["convert_rknn.py"].decode()
    assert "'hybrid_layers'" in script


def test_a_detectors_packed_output_keeps_the_toolkits_int8_accurate_and_its_first_conv_goes_by_phases():
    """MTCNN's P-Net with its decode in the graph packs boxes in pixels (to ~170) and face scores (0..1) in one
    output: the toolkit's w8a8 gives the pack one int8 scale and loses the scores. Kept float16 (the pack and its
    Reshape), the rest int8 is accurate on held-out photos; its first convolution (3x3 over 3 channels, half the
    toolkit's cycles) is computed by output phases under its 2x2 pool; and its box head, which the toolkit splits
    into a Conv per picked channel, stays one Conv with the decode's steps hoisted above the picks (both cycle
    forms composed, each chosen at its site)."""
    optimizer = _optimizer()
    trained = fixture("mtcnn-pnet")
    options = OptimizeOptions(shape_buckets={}, precision="mixed", accuracy=trained.accuracy, measure_latency=False)
    result = optimizer.optimize(trained.model, options, calibration=_npz(trained.arrays()))
    [(bucket, row)] = list(result.report["vendor"]["buckets"].items())
    alone_int8 = row["vendor_alone_int8"]["accuracy"]["outputs"]["detections"]["slices"]
    assert alone_int8["boxes"]["ok"] and not alone_int8["scores"]["ok"], alone_int8
    packed = row["exact_rewrites"]["forms"]["packed_output_float16"]
    assert list(packed["sites"]) == ["/Concat"] and packed["float16_nodes"] == 2, packed
    assert row["precision"].startswith("w8a8 + exact rewrites"), row["decision"]
    assert set(row["forms"]) >= {"packed_output_float16", "pooled_conv_space_to_depth", "hoisted_channel_gathers"}
    final = result.report["toolchain"]["buckets"][bucket]["accuracy"]
    assert final["ok"] and final["outputs"]["detections"]["slices"]["scores"]["cosine"] >= 0.99, final
    # The vendor alone's best accurate build is its float16; ours costs at most half of it (0.473 measured).
    assert row["vendor_alone_best"]["cycles"] == row["vendor_alone"]["cycles"]
    assert row["ratio"] <= 0.5, row["decision"]


def test_an_stft_written_as_a_strided_conv1d_is_framed_and_costs_a_hundredth():
    """Silero VAD's STFT is a Conv1d (kernel 256, hop 128) that rknn-toolkit2 cuts into 64 partial convolutions,
    nearly all of its cycles; framed by its hop it is one Conv over 128 channels, and the float16 build keeps
    the speech probabilities and the LSTM state on held-out windows."""
    optimizer = _optimizer()
    trained = fixture("silero-vad")
    options = OptimizeOptions(shape_buckets={}, precision="mixed", accuracy=trained.accuracy, measure_latency=False)
    result = optimizer.optimize(trained.model, options, calibration=_npz(trained.arrays()))
    [(bucket, row)] = list(result.report["vendor"]["buckets"].items())
    assert row["forms"].get("strided_conv1d_frames") == {"/stft/Conv": "frames"}, row["decision"]
    final = result.report["toolchain"]["buckets"][bucket]["accuracy"]
    assert final["ok"] and all(o["worst_sample_cosine"] >= 0.999 for o in final["outputs"].values()), final
    # 45,513 cycles against the vendor alone's 4,681,241 (float16; its w8a8 loses the probabilities).
    assert not row["vendor_alone_int8"]["accuracy"]["ok"]
    assert row["ratio"] <= 0.02, row["decision"]


def _with_passthrough(path) -> bytes:
    """The encoder as a package ships it: ``input_ids`` and ``attention_mask`` passed through to outputs."""
    proto = onnx.load(str(path))
    for name in ("input_ids", "attention_mask"):
        proto.graph.node.append(
            onnx.helper.make_node("Identity", [name], [f"{name}_out"], name=f"{name}_passthrough")
        )
        proto.graph.output.append(
            onnx.helper.make_tensor_value_info(f"{name}_out", onnx.TensorProto.INT64, ["batch", "seq"])
        )
    return proto.SerializeToString()


def test_passthrough_outputs_are_left_to_the_runtime_and_the_toolkit_compiles_the_rest():
    optimizer = _optimizer()
    model = _with_passthrough(fixture("minilm-l6").model)
    result = optimizer.optimize(model, OptimizeOptions(shape_buckets=BUCKETS, measure_latency=False))
    toolchain = result.report["toolchain"]
    assert toolchain["ran"], toolchain.get("failed")
    entry = toolchain["buckets"][BUCKET]
    served = {s["output"]: s["input"] for s in entry["served_by_runtime"]}
    assert served == {"input_ids_out": "input_ids", "attention_mask_out": "attention_mask"}
    assert entry["artifacts"] == [f"model.{BUCKET}.rknn", f"model.{BUCKET}.rknn.build.json"]
    assert f"model.{BUCKET}.rknn" in result.artifacts
    # Every output, the served ones computed as the runtime will, matches the original.
    numerics = {o["name"]: o for o in entry["numerics"]}
    assert numerics["sentence_embedding"]["cosine"] >= 0.9999
    assert numerics["input_ids_out"]["max_abs"] == 0 and numerics["attention_mask_out"]["max_abs"] == 0
    manifest = json.loads(result.artifacts["manifest.json"])
    assert [s["output"] for s in manifest["buckets"][0]["served_by_runtime"]] == [
        "input_ids_out",
        "attention_mask_out",
    ]
    # The toolkit alone on the same file: rknn-toolkit2 2.5.0 dies with SIGFPE (seen on every run of this model).
    alone = result.report["vendor"]["buckets"][BUCKET]["vendor_alone"]
    if "error" in alone:
        assert "SIGFPE" in alone["error"], alone
