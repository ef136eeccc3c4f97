"""The ``rknn-simulator`` bridge rebuilds what shipped: the request it sends the toolkit repeats the shipped
``.rknn``'s build record (precision, switches, float16 subgraphs) and calibrates on the very samples the record
names, found among the bundle's calibration files by their sha256; the split of those samples is the job's. With
rknn-toolkit2 installed, a real int8 bundle's rebuild gives the accuracy its report claims, and a record that lies
about the build (float16 for an int8 file) is caught by the rebuild's size."""

from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest

from flexdsa_core import FlexDSAOptimizer, RequestSpec
from flexdsa_runtime import BackendUnavailable, open_bundle
from flexdsa_runtime.backends import bridge, load_backend
from flexdsa_runtime.backends.rknn_build import simulator_request
from flexdsa_runtime.samples import bucket_samples
from flexdsa_runtime.verify import verify_bundle
from tests.core.targets import _bundle_checks as checks
from tests.runtime import rknn_bundles

# Shuffled, so that the request's order is the record's, not the listing's.
CALIBRATED = [5, 0, 17, 3, 9, 22, 1, 30, 12, 7, 26, 14, 2, 19, 8, 28, 11, 4, 24, 16, 6, 21, 10, 13]
JUDGED = [15, 18, 20, 23, 25, 27, 29, 31]


@pytest.fixture(scope="module")
def int8_bundle(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shipped-int8")
    rknn_bundles.shipped(folder, calibrated=CALIBRATED, judged=JUDGED)
    return folder


def _request(folder):
    bundle = open_bundle(folder)
    [bucket] = bundle.buckets
    return simulator_request(bundle, bucket, ["y"])


def test_the_request_rebuilds_the_shipped_int8_on_the_samples_it_was_calibrated_on(int8_bundle):
    request, notes = _request(int8_bundle)
    files = rknn_bundles.sample_files(int8_bundle)
    assert request["precision"] == "int8" and request["config"] == rknn_bundles.CONFIG
    assert request["dataset"] == [[str((int8_bundle / files[i]).resolve())] for i in CALIBRATED]
    assert request["shipped"] == str((int8_bundle / rknn_bundles.RKNN).resolve())
    assert request["hybrid_steps"] is False and request["hybrid"] == [] and request["auto_hybrid"] is False
    assert notes == [
        "rebuilt int8 (w8a8, mmse, channel) as model.batch1.rknn was: calibrated on the 24 sample(s) of "
        "dataset.txt it was calibrated on (8 held out)"
    ]
    found = bucket_samples(open_bundle(int8_bundle), open_bundle(int8_bundle).buckets[0],
                           json.loads((int8_bundle / "model.batch1.rknn.build.json").read_text()))  # fmt: skip
    assert found.calibrated == CALIBRATED and found.judged == JUDGED and found.held_out == JUDGED


def test_the_backend_sends_that_request(int8_bundle, monkeypatch):
    """``load_backend(..., "rknn-simulator")`` (what ``Runtime.open(backend=...)`` calls) hands the bridge the
    rebuild request, not a bare float16 one."""
    sent = {}

    class Captured:
        def __init__(self, backend, request, **kwargs):
            sent.update(backend=backend, request=request, notes=kwargs.get("notes"))

    monkeypatch.setattr(bridge, "BridgeBackend", Captured)
    bundle = open_bundle(int8_bundle)
    load_backend(bundle, bundle.buckets[0], "rknn-simulator")
    assert sent["backend"] == "rknn-simulator"
    assert sent["request"]["precision"] == "int8" and len(sent["request"]["dataset"]) == len(CALIBRATED)
    assert "calibrated on the 24 sample(s)" in sent["notes"][0]


def test_the_request_keeps_the_shipped_float16_subgraphs(tmp_path):
    pairs = [["wide_mm", "y"], ["h_mm", "wide_mm"]]
    rknn_bundles.shipped(tmp_path, hybrid_steps=True, hybrid_mapped=pairs)
    request, notes = _request(tmp_path)
    assert request["hybrid_steps"] is True and request["hybrid"] == pairs
    assert notes[-1] == "hybrid quantisation as shipped: 2 subgraph(s) kept float16"


def test_calibration_samples_the_bundle_lacks_are_said(tmp_path):
    record = rknn_bundles.shipped(tmp_path)
    record["calibration"][0] = {"x": "0" * 64}  # a sample the bundle does not hold
    rknn_bundles.write_record(tmp_path, record)
    request, notes = _request(tmp_path)
    assert len(request["dataset"]) == 32  # every sample of dataset.txt, said
    assert (
        "the 24 sample(s) it was calibrated on are not all in dataset.txt: calibrated on all 32" in notes[0]
    )


def test_a_float16_build_and_a_bundle_without_records(tmp_path):
    rknn_bundles.shipped(tmp_path, precision="float16")
    request, notes = _request(tmp_path)
    assert request["precision"] == "float16" and "dataset" not in request
    assert notes == ["rebuilt float16 as model.batch1.rknn was (model.batch1.rknn.build.json)"]
    (tmp_path / "model.batch1.rknn.build.json").unlink()
    rknn_bundles.recomplete(tmp_path)
    request, notes = _request(tmp_path)
    assert request["precision"] == "float16"
    assert "has no build record" in notes[0] and "may not be the precision that shipped" in notes[0]


def test_an_int8_build_without_its_samples_is_refused(tmp_path):
    rknn_bundles.shipped(tmp_path)
    shutil.rmtree(tmp_path / "calibration")
    for name in ("dataset.txt", "calibration.npz"):
        (tmp_path / name).unlink()
    rknn_bundles.recomplete(tmp_path)
    with pytest.raises(BackendUnavailable, match="built int8 on 24 calibration sample.* ships none"):
        _request(tmp_path)


# ---- with rknn-toolkit2 -----------------------------------------------------------------------------


def _int8_conv_bundle(folder):
    """A 3x3 Conv + Relu optimised int8 for the RK3588 with the toolchain, on 12 calibration images (9 calibrate
    the toolkit's quantiser, 3 are held out to judge it)."""
    rng = np.random.default_rng(1)
    buffer = io.BytesIO()
    np.savez(buffer, x=rng.standard_normal((12, 3, 16, 16)).astype(np.float32))
    request = RequestSpec.model_validate(
        {"target": "rockchip-rk3588", "measure_latency": False, "precision": "int8"}
    )
    result = FlexDSAOptimizer(request.target_spec(), toolchain_root=checks.TOOLCHAIN_ROOT).optimize(
        checks.conv_relu(np.random.default_rng(0)).SerializeToString(), request.options(),
        calibration=buffer.getvalue(),
    )  # fmt: skip
    result.write(folder)
    return result.report


def test_the_simulator_rebuild_gives_the_claimed_accuracy_and_a_lying_record_fails(tmp_path):
    checks.toolchain_or_skip("rockchip", "rknn-toolkit2")
    report = _int8_conv_bundle(tmp_path)
    entry = report["toolchain"]["buckets"]["static"]
    assert entry["artifacts"] == ["model.static.rknn", "model.static.rknn.build.json"]
    claimed = entry["accuracy"]["outputs"]["y"]["cosine"]
    [check] = [c for c in verify_bundle(tmp_path) if c.role == "rknn"]
    assert (check.status, check.backend) == ("PASS", "rknn-simulator"), check
    # On the samples the job judged, the rebuild gives the claimed figure (deterministic).
    assert check.inputs == "3 sample(s) of dataset.txt, those the job judged it on"
    assert abs(check.measured["y"]["cosine"] - claimed) < 2e-6, (check.measured, claimed)
    assert claimed < 0.99999  # int8: the float16 stand-in the bridge used to build gives ~1.0
    assert "rebuilt int8" in check.notes[0] and "the rebuild has the shipped file's size" in check.notes[-1]
    # A record that says float16 for the int8 file: the simulator builds float16, not what shipped.
    record = json.loads((tmp_path / "model.static.rknn.build.json").read_text())
    (tmp_path / "model.static.rknn.build.json").write_text(json.dumps({**record, "precision": "float16"}))
    rknn_bundles.recomplete(tmp_path, report)
    [check] = [c for c in verify_bundle(tmp_path) if c.role == "rknn"]
    assert check.status == "FAIL" and "not the shipped file" in check.reason, check
