"""flexdsa_runtime on bundles the real pipeline made (cpu-ort, tiny models): the bucket policy, padding and
cropping against the original model, refusals with their reasons, checksums, zips, and the traffic count."""

from __future__ import annotations

import json
import shutil
import zipfile

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from flexdsa_core.shape_tracker import ShapeTracker
from flexdsa_core.targets import load_target
from flexdsa_runtime import BundleError, Runtime, ShapeRefused
from tests.runtime.conftest import assert_close, original_outputs
from tests.runtime.tiny_models import IGNORE_MASK, MASKED, UNMASKED, model_bytes

BUCKETS = {"batch": [2], "seq": [8, 16]}


def masked_feeds(batch: int, seq: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed + 100 * batch + seq)
    return {
        "x": rng.standard_normal((batch, seq, 4)).astype(np.float32),
        "attention_mask": np.ones((batch, seq), np.int64),
    }


@pytest.fixture(scope="module")
def masked(make_bundle):
    return make_bundle(model_bytes(MASKED), "cpu-ort", shape_buckets=BUCKETS)


@pytest.mark.parametrize("batch, seq", [(1, 1), (1, 5), (2, 8), (2, 9), (1, 15), (2, 16)])
def test_shapes_between_and_below_the_buckets_give_the_original_outputs(masked, batch, seq):
    feeds = masked_feeds(batch, seq)
    with Runtime.open(masked) as runtime:
        got = runtime.run(feeds)
        assert runtime.backend_names() == {"batch2_seq8": "onnxruntime", "batch2_seq16": "onnxruntime"}
    assert_close(original_outputs(model_bytes(MASKED), feeds), got)


def test_the_choice_is_the_shape_trackers(masked, make_bundle):
    """The runtime applies the policy of ShapeTracker.update (exact dims included), from the manifest alone."""
    for text, buckets, folder, exact in [
        (MASKED, BUCKETS, masked, ()),
        (UNMASKED, {"batch": [1], "seq": [4, 8, 16]}, None, ("seq",)),
    ]:
        folder = folder or make_bundle(model_bytes(text), "cpu-ort", shape_buckets=buckets)
        tracker = ShapeTracker(ir.from_proto(onnx.load_from_string(model_bytes(text))))
        tracker.buckets(buckets, load_target("cpu-ort"))
        with Runtime.open(folder, preload=False) as runtime:
            for batch, seq in [(1, 1), (1, 4), (1, 8), (2, 9), (1, 16), (2, 3)]:
                feeds = masked_feeds(batch, seq)
                if text == UNMASKED:
                    feeds = {"x": feeds["x"]}
                shapes = {name: list(value.shape) for name, value in feeds.items()}
                want = tracker.update(shapes, exact_dims=exact)
                if want.new_bucket:  # the tracker would compile a new one; the static bundle refuses
                    with pytest.raises(ShapeRefused):
                        runtime.bucket_for(feeds)
                else:
                    assert runtime.bucket_for(feeds) == want.bucket.name, (batch, seq)


def test_a_shape_larger_than_every_bucket_is_refused_and_counted(masked):
    with Runtime.open(masked) as runtime:
        with pytest.raises(ShapeRefused, match=r"seq = 17 \(largest bucket 16\): larger than every bucket"):
            runtime.run(masked_feeds(1, 17))
        with pytest.raises(ShapeRefused, match="batch = 3"):
            runtime.run(masked_feeds(3, 4))
        refused = [e for e in runtime.traffic.snapshot()["entries"] if e["bucket"] is None]
    assert {tuple(sorted(e["dims"].items())) for e in refused} == {
        (("batch", 1), ("seq", 17)),
        (("batch", 3), ("seq", 4)),
    }


def test_missing_inputs_and_disagreeing_dims_are_refused(masked):
    with Runtime.open(masked) as runtime:
        with pytest.raises(ShapeRefused, match="missing"):
            runtime.run({"x": np.zeros((1, 4, 4), np.float32)})
        with pytest.raises(ShapeRefused, match="must agree"):
            runtime.run({"x": np.zeros((1, 4, 4), np.float32), "attention_mask": np.ones((1, 5), np.int64)})


def test_a_model_that_cannot_tolerate_padding_is_served_only_at_bucket_sizes(make_bundle):
    bundle = make_bundle(model_bytes(UNMASKED), "cpu-ort", shape_buckets={"batch": [1], "seq": [8, 16]})
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["runtime"]["padding"]["seq"]["tolerated"] is False
    x = np.random.default_rng(0).standard_normal((1, 8, 4)).astype(np.float32)
    with Runtime.open(bundle) as runtime:
        assert_close(original_outputs(model_bytes(UNMASKED), {"x": x}), runtime.run({"x": x}))
        with pytest.raises(
            ShapeRefused, match=r"seq = 5 \(buckets \[8, 16\]: padding seq from 4 to 8 changes"
        ):
            runtime.run({"x": x[:, :5]})


def test_a_one_means_ignore_mask_is_padded_with_one(make_bundle):
    bundle = make_bundle(model_bytes(IGNORE_MASK), "cpu-ort", shape_buckets={"batch": [1], "seq": [8]})
    rng = np.random.default_rng(1)
    feeds = {
        "x": rng.standard_normal((1, 5, 4)).astype(np.float32),
        "ignore_mask": np.zeros((1, 5), np.int64),
    }
    with Runtime.open(bundle) as runtime:
        assert_close(original_outputs(model_bytes(IGNORE_MASK), feeds), runtime.run(feeds))


def test_a_dynamic_bundle_runs_every_shape_unpadded(make_bundle):
    bundle = make_bundle(model_bytes(MASKED), "cpu-ort")
    with Runtime.open(bundle) as runtime:
        for batch, seq in [(1, 3), (3, 40)]:
            feeds = masked_feeds(batch, seq)
            assert_close(original_outputs(model_bytes(MASKED), feeds), runtime.run(feeds))
        assert runtime.traffic.padding_waste() == 0.0


def test_a_changed_or_missing_file_is_refused_before_loading(masked, tmp_path):
    copy = tmp_path / "b"
    shutil.copytree(masked, copy)
    model = next(copy.glob("model.*.onnx"))
    data = bytearray(model.read_bytes())
    data[-1] ^= 1
    model.write_bytes(bytes(data))
    with pytest.raises(BundleError, match=f"{model.name} does not match its checksum"):
        Runtime.open(copy)
    model.unlink()
    with pytest.raises(BundleError, match=f"{model.name} is missing"):
        Runtime.open(copy)
    (copy / "manifest.json").unlink()
    with pytest.raises(BundleError, match="has no manifest.json"):
        Runtime.open(copy)


def test_a_zip_bundle_opens_and_a_path_outside_it_is_refused(masked, tmp_path):
    archive = tmp_path / "bundle.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for path in masked.rglob("*"):
            if path.is_file():
                handle.write(path, path.relative_to(masked).as_posix())
    feeds = masked_feeds(1, 5)
    with Runtime.open(archive) as runtime:
        assert_close(original_outputs(model_bytes(MASKED), feeds), runtime.run(feeds))
    manifest = json.loads((masked / "manifest.json").read_text())
    manifest["files"]["../escape.txt"] = {"sha256": "0" * 64, "size": 1, "role": "script"}
    hostile = tmp_path / "hostile.zip"
    with zipfile.ZipFile(hostile, "w") as handle:
        handle.writestr("manifest.json", json.dumps(manifest))
        handle.writestr("../escape.txt", "x")
    with pytest.raises(BundleError, match="outside the bundle"):
        Runtime.open(hostile)
    assert not (tmp_path.parent / "escape.txt").exists()


def test_an_old_bundle_without_the_deploy_contract_is_refused(masked, tmp_path):
    copy = tmp_path / "old"
    shutil.copytree(masked, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    for key in ("format", "files", "runtime"):
        manifest.pop(key)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="without the deploy contract"):
        Runtime.open(copy)


def test_traffic_counts_shapes_buckets_and_padding_waste(masked):
    with Runtime.open(masked) as runtime:
        for _ in range(3):
            runtime.run(masked_feeds(2, 4))
        runtime.run(masked_feeds(2, 16))
        snapshot = runtime.traffic.snapshot()
        waste = runtime.traffic.padding_waste()
    entries = {(e["dims"]["seq"], e["bucket"]): e for e in snapshot["entries"]}
    assert entries[(4, "batch2_seq8")]["count"] == 3
    # x [2, 4, 4] + mask [2, 4] = 40 elements, padded to [2, 8, 4] + [2, 8] = 80
    assert (
        entries[(4, "batch2_seq8")]["elements"] == 120
        and entries[(4, "batch2_seq8")]["padded_elements"] == 240
    )
    assert entries[(16, "batch2_seq16")]["padded_elements"] == entries[(16, "batch2_seq16")]["elements"]
    assert waste == pytest.approx(120 / (120 + 160))
    assert snapshot["bundle_version"] == runtime.version and snapshot["target"] == "cpu-ort"


def test_traffic_is_bounded():
    from flexdsa_runtime import Traffic

    traffic = Traffic("v", "cpu-ort", max_entries=3)
    for seq in range(1, 6):
        traffic.record({"seq": seq}, "b", seq, 8)
    assert len(traffic.snapshot()["entries"]) == 3 and traffic.snapshot()["dropped"] == 2
    assert traffic.requests == 5


def test_the_runtime_reports_its_own_overhead(masked):
    with Runtime.open(masked) as runtime:
        for _ in range(5):
            runtime.run(masked_feeds(1, 5))
        timing = runtime.timing
    assert timing.requests == 5 and 0 < timing.backend_s < timing.total_s and timing.overhead_s > 0
