"""Outputs a bucket's compiled artifact leaves to the runtime (``served_by_runtime``): a model that passes its
inputs through to outputs (as a published sentence encoder does with ``input_ids`` and ``attention_mask``) has
them left out of its ``.rknn`` (rknn-toolkit2 2.5.0 dies building such a model); the manifest lists them and
the runtime makes them from the request's own inputs, at the request's shape and the model's dtype."""

from __future__ import annotations

import json

import numpy as np
import pytest

import flexdsa_runtime.runtime as runtime_module
from flexdsa_runtime import Runtime
from flexdsa_runtime.backends.onnxruntime_cpu import OnnxRuntimeBackend
from flexdsa_runtime.errors import BundleError
from flexdsa_runtime.served import checked, serve
from tests.core.targets._bundle_checks import toolchain_or_skip
from tests.runtime.conftest import cosine, original_outputs
from tests.runtime.tiny_models import model_bytes

# Mean of the embedded tokens the mask keeps, and both inputs passed through (Identity).
PASSTHROUGH = """
<ir_version: 9, opset_import: ["" : 17]>
passthrough (int64[batch, seq] input_ids, int64[batch, seq] attention_mask)
    => (float[batch, 4] z, int64[batch, seq] ids, int64[batch, seq] mask)
{ table = Constant <value = float[6, 4] {0.1, 0.2, 0.3, 0.4, 1.0, -1.0, 0.5, 0.0, 2.0, 1.5, -0.5, 0.25,
                                         -1.0, 0.75, 0.5, 1.0, 0.3, -0.2, 0.9, -0.7, 1.2, 0.4, -0.3, 0.6}> ()
  e = Gather (table, input_ids)
  m = Cast <to = 1> (attention_mask)
  axes = Constant <value = int64[1] {2}> ()
  m3 = Unsqueeze (m, axes)
  kept = Mul (e, m3)
  one = Constant <value = int64[1] {1}> ()
  total = ReduceSum <keepdims = 0> (kept, one)
  count = ReduceSum <keepdims = 1> (m, one)
  z = Div (total, count)
  ids = Identity (input_ids)
  mask = Identity (attention_mask) }
"""
BUCKETS = {"batch": [1], "seq": [8]}
SERVED = [
    {"output": "ids", "input": "input_ids", "dtype": "int64", "steps": [{"op": "Identity"}]},
    {"output": "mask", "input": "attention_mask", "dtype": "int64", "steps": [{"op": "Identity"}]},
]


def _request(seq: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    mask = (np.arange(seq) < max(1, seq - 2)).astype(np.int64)[None]
    return {"input_ids": rng.integers(0, 6, (1, seq)).astype(np.int64), "attention_mask": mask}


class _WithoutServed(OnnxRuntimeBackend):
    """The bucket's ONNX in ONNX Runtime, returning only what its compiled artifact would (as the .rknn does)."""

    def run(self, feeds):
        outputs = super().run(feeds)
        return {name: value for name, value in outputs.items() if name not in {s["output"] for s in SERVED}}


def test_the_manifest_lists_the_passthrough_outputs(make_bundle):
    bundle = make_bundle(model_bytes(PASSTHROUGH), "rockchip-rk3588", shape_buckets=BUCKETS)
    manifest = json.loads((bundle / "manifest.json").read_text())
    (bucket,) = manifest["buckets"]
    assert bucket["served_by_runtime"] == SERVED
    # The bundle's conversion script leaves them out of the .rknn the same way.
    script = (bundle / "convert_rknn.py").read_text()
    assert "'served_by_runtime'" in script and (bundle / "rknn_outputs.py").is_file()


def test_the_runtime_makes_what_the_artifact_leaves_out(make_bundle, monkeypatch):
    bundle = make_bundle(model_bytes(PASSTHROUGH), "rockchip-rk3588", shape_buckets=BUCKETS)

    def load(bundle_, bucket, backend, **_):
        return _WithoutServed(bundle_.path(bucket.artifact("onnx")["file"]))

    monkeypatch.setattr(runtime_module, "load_backend", load)
    with Runtime.open(bundle) as runtime:
        for seq in (5, 8):  # padded up to the bucket, and at its size
            request = _request(seq)
            got = runtime.run(request)
            want = original_outputs(model_bytes(PASSTHROUGH), request)
            assert set(got) == set(want)
            for name in ("ids", "mask"):  # the request's own arrays, at its shape, in the model's dtype
                assert got[name].dtype == np.int64 and got[name].shape == (1, seq)
                np.testing.assert_array_equal(got[name], want[name])
            np.testing.assert_allclose(got["z"], want["z"], rtol=1e-5, atol=1e-6)


def test_served_steps_cast_and_shape():
    inputs = {"x": np.arange(6, dtype=np.int32).reshape(2, 3)}
    served = checked(
        [{"output": "as_float", "input": "x", "dtype": "float32", "steps": [{"op": "Cast", "to": "float32"}]},
         {"output": "size", "input": "x", "dtype": "int64", "steps": [{"op": "Shape", "start": 1, "end": None}]}],
        "b",
    )  # fmt: skip
    found = serve(served, inputs)
    assert found["as_float"].dtype == np.float32 and found["as_float"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert found["size"].tolist() == [3] and found["size"].dtype == np.int64
    with pytest.raises(BundleError, match="unknown step"):
        checked([{"output": "y", "input": "x", "steps": [{"op": "Exec", "code": "..."}]}], "b")


def test_the_simulator_compiles_it_and_the_runtime_serves_the_rest(make_bundle):
    """With rknn-toolkit2: the .rknn is built without the passthrough outputs, and the runtime's bridge to the
    toolkit's simulator builds it the same way; the runtime adds the outputs it left out."""
    toolchain_or_skip("rockchip", "rknn-toolkit2")
    bundle = make_bundle(model_bytes(PASSTHROUGH), "rockchip-rk3588", toolchain=True, shape_buckets=BUCKETS)
    report = json.loads((bundle / "report.json").read_text())
    entry = report["toolchain"]["buckets"]["batch1_seq8"]
    assert entry["served_by_runtime"] == SERVED
    assert entry["artifacts"] == ["model.batch1_seq8.rknn", "model.batch1_seq8.rknn.build.json"]
    record = json.loads((bundle / "model.batch1_seq8.rknn.build.json").read_text())
    assert record["outputs"] == ["z"] and record["precision"] == "float16"  # what the simulator repeats
    with Runtime.open(bundle, backend="rknn-simulator") as runtime:
        request = _request(8)
        got, want = runtime.run(request), original_outputs(model_bytes(PASSTHROUGH), request)
        np.testing.assert_array_equal(got["ids"], want["ids"])
        np.testing.assert_array_equal(got["mask"], want["mask"])
        assert cosine(want["z"], got["z"]) >= 0.999
