"""What a job keeps after ONNX Runtime is done must not keep ONNX Runtime's memory (issue 22's memory goal).

ONNX Runtime's outputs are numpy views of its allocator's memory: an output the pipeline keeps (the reference
outputs of validation, a sample's result) would keep every chunk the session's arena grew to alive after the
session is gone. Measured in a subprocess (a fresh interpreter, its resident memory read from /proc), with a
margin of half the chunk: no timing is involved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from flexdsa_core.ort_runs import DEFAULT_OTHER_DIM, run, second_shape_dims

REPO = Path(__file__).resolve().parents[2]

# One 64 MiB intermediate (x tiled 16384 times) reduced to one float per row: the session's arena grows a
# chunk of at least 64 MiB for a 4-byte output.
BIG_INTERMEDIATE = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[batch, 1024] x) => (float[batch] y) {
    reps = Constant <value = int64[2] {1, 16384}> ()
    big = Tile(x, reps)
    axes = Constant <value = int64[1] {1}> ()
    y = ReduceSum <keepdims = 0> (big, axes)
}
"""

PROBE = """
import json, os, sys
import numpy as np, onnx
from flexdsa_core.ort_runs import run

def rss():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

model = onnx.parser.parse_model(sys.argv[1]).SerializeToString()
feeds = {"x": np.ones((1, 1024), np.float32)}
run(model, feeds)  # once, so that what the first session loads for good (kernels, thread pools) is counted
before = rss()
kept = [run(model, feeds) for _ in range(3)]  # three sessions, each output kept as validation keeps them
print(json.dumps({"grown": rss() - before, "value": float(kept[0]["y"][0])}))
"""


@pytest.mark.skipif(not Path("/proc/self/statm").is_file(), reason="reads resident memory from /proc")
def test_kept_outputs_do_not_keep_the_sessions_arena():
    probe = subprocess.run(
        [sys.executable, "-c", PROBE, BIG_INTERMEDIATE], capture_output=True, text=True, cwd=REPO, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr[-2000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found["value"] == 16384 * 1024
    # Three kept outputs of 4 bytes each; with the arenas they held, three chunks of at least 64 MiB.
    assert found["grown"] < 32 * 2**20, f"{found['grown'] / 2**20:.0f} MiB still resident after the sessions"


def test_run_returns_arrays_that_own_their_memory():
    model = onnx.parser.parse_model(BIG_INTERMEDIATE.replace("16384", "4"))
    outputs = run(model.SerializeToString(), {"x": np.ones((2, 1024), np.float32)})
    assert outputs["y"].base is None and outputs["y"].flags.owndata
    np.testing.assert_array_equal(outputs["y"], np.full(2, 4096, np.float32))


def test_the_second_validation_shape_never_takes_a_dim_held_at_1_past_2():
    """An unnamed batch (tf2onnx's ``unk__``) at 1 in its bucket went to 8 at the second shape: 8x the
    bucket's activations. Other dims keep the small defaults, and the shape still differs from the bucket's."""
    at = {"unk__214": 1, "batch_size": 1, "sequence_length": 128, "height": 4, "width": 1}
    dims = second_shape_dims(at)
    assert dims == {"unk__214": 2, "batch_size": 2, "sequence_length": DEFAULT_OTHER_DIM, "height": 8, "width": 2}
    assert dims != at


def test_the_never_slower_check_times_in_memory_models_without_serialising_them(monkeypatch):
    """The check hashes and loads each model it times from memory (``InMemoryModel``): a serialisation of the
    candidate made only to hash it was held beside both sessions (PP-OCRv4 rec: 10.5 MB at the job's peak).
    The bundle's own serialisation, at packaging (written to its file piece by piece), is the only one."""
    import traceback

    import onnx_ir as ir

    from flexdsa_core import serialized
    from flexdsa_core.optimizer import FlexDSAOptimizer
    from flexdsa_core.options import OptimizeOptions

    made = []
    real = serialized._pieces  # what ``serialize`` and ``write`` both serialise with

    def recording(model: ir.Model) -> list:
        made.append([frame.filename for frame in traceback.extract_stack()])
        return real(model)

    monkeypatch.setattr(serialized, "_pieces", recording)
    rng = np.random.default_rng(0)
    proto = onnx.parser.parse_model(
        '<ir_version: 9, opset_import: ["" : 17]> g (float[batch, 256] x) => (float[batch, 256] y) '
        "{ h = MatMul(x, w1)\n r = Relu(h)\n y = MatMul(r, w2) }"
    )
    for name in ("w1", "w2"):
        proto.graph.initializer.append(onnx.numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32), name))
    result = FlexDSAOptimizer("cpu-ort").optimize(proto.SerializeToString(), OptimizeOptions(latency_repeats=5))
    assert result.report["latency"]["measured"] is True
    assert made, "the bundle's model was not serialised at all"
    timing = [stack for stack in made if any(name.endswith(os.path.join("verify", "latency.py")) for name in stack)]
    assert timing == []


def test_buckets_share_the_weights_the_passes_make_and_sessions_read_them_in_place(monkeypatch):
    """A weight the passes make (here ``Transpose(w)`` folded into a new constant) is made again in every
    bucket: the later buckets take the first one's tensor, and it is aligned once, so the load check and the
    sessions read it in place instead of copying it per bucket and per session (BERT-base with three seq
    buckets: 81 MiB made per bucket, 264 MiB of session copies; peak RSS 2246 -> 1717 MiB)."""
    import traceback

    import onnx_ir as ir

    from flexdsa_core import in_memory
    from flexdsa_core.optimizer import FlexDSAOptimizer
    from flexdsa_core.options import OptimizeOptions

    rng = np.random.default_rng(0)
    proto = onnx.parser.parse_model(
        '<ir_version: 9, opset_import: ["" : 17]> g (float[batch, seq, 256] x) => (float[batch, seq, 256] y) '
        "{ wt = Transpose <perm = [1, 0]> (w)\n h = MatMul(x, wt)\n y = Relu(h) }"
    )
    proto.graph.initializer.append(
        onnx.numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32), "w")
    )
    copies = []  # (bytes, the function that asked) for every aligned copy, but the preflight's dry loads
    real_aligned = in_memory.aligned

    def counted(array):
        stack = traceback.extract_stack()
        if not any(frame.filename.endswith("preflight.py") for frame in stack):  # transient, before buckets
            copies.append((array.nbytes, stack[-2].name))
        return real_aligned(array)

    monkeypatch.setattr(in_memory, "aligned", counted)
    options = OptimizeOptions(shape_buckets={"batch": [1], "seq": [4, 8, 16]}, measure_latency=False)
    result = FlexDSAOptimizer("cpu-ort").optimize(proto.SerializeToString(), options)
    assert result.report["validation"]["ok"]
    weights = [
        {name: value.const_value for name, value in bucket.model.graph.initializers.items()}
        for bucket in result.buckets
    ]
    assert len(weights) == 3 and all(w.keys() == weights[0].keys() for w in weights), [sorted(w) for w in weights]
    made = [name for name, tensor in weights[0].items() if tensor.nbytes == 256 * 256 * 4]
    assert made, sorted(weights[0])
    for name in made:
        first = weights[0][name]
        assert all(w[name] is first for w in weights[1:]), name
        assert isinstance(first, ir.Tensor) and first.raw.ctypes.data % in_memory.ALIGNMENT == 0
    # The upload's weight made aligned once at ingest, and the folded one once at the first bucket: nothing of
    # that size copied for a session (the load check and validation ran every bucket).
    assert [asked for size, asked in copies if size == 256 * 256 * 4] == ["_detached", "align_weights"], copies
