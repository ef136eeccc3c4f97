"""The checks before queuing hold neither the model's weights nor the calibration samples in the API.

The attack: a tenant with a key submits a 256 MiB model to a group of targets with shape buckets (the bucket
pre-check parsed the whole model once per target: 1.1 GiB in the API), or a 1 MB compressed ``.npz`` that
unpacks to a GiB (the calibration check unpacked it). The checks run here in a child process, as the API
runs them (``service.jobs.service``), and the child's peak memory above its start is measured by the kernel (VmHWM).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import zipfile

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MODEL_MIB = 256
# What the checks may add to the API process (imports, ONNX Runtime's dry-load session of the graph alone).
ALLOWED_GROWTH_MIB = 96


def _big_encoder(path) -> None:
    """An encoder-like graph: a position table sliced to ``seq`` and a 256 MiB projection, ``seq`` symbolic."""
    rows = MODEL_MIB * 2**20 // 4 // 1024
    weight = numpy_helper.from_array(np.ones((1024, rows), np.float32), "proj")
    position = numpy_helper.from_array(np.zeros((64, 1024), np.float32), "position")
    constants = [
        numpy_helper.from_array(np.array([0], np.int64), "start"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
        helper.make_node("Unsqueeze", ["seq", "zero"], ["end"]),
        helper.make_node("Slice", ["position", "start", "end"], ["positions"]),
        helper.make_node("Add", ["x", "positions"], ["h"]),
        helper.make_node("MatMul", ["h", "proj"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", rows])],
        [weight, position, *constants],
    )  # fmt: skip
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)


def _bomb_npz() -> bytes:
    """One float32 input of 1020 MiB of zeros declared (under the 1 GiB cap), a few MB compressed."""
    buffer = io.BytesIO()
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (510, 1024, 512)})
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive, archive.open("x.npy", "w", force_zip64=True) as member:
        member.write(header.getvalue())
        zeros = bytes(1 << 22)
        for _ in range(255):
            member.write(zeros)
    return buffer.getvalue()


CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from service.groups import service as groups
    from service.jobs import service as jobs
    from service.jobs.upload import ReceivedFile, ReceivedUpload

    def peak_kib():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1])

    model, calibration, spec, targets = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(",")
    upload = ReceivedUpload(path=Path(model), spec=spec, calibration=ReceivedFile(path=Path(calibration)))
    jobs.check_model(upload)
    start = peak_kib()
    outcome = "accepted"
    for target in targets:
        parsed, target_spec = jobs.parse_spec(groups.spec_for(spec, target))
        try:
            jobs.check_options(upload, parsed, target_spec)
            jobs.check_calibration_upload(upload, parsed)
        except Exception as err:
            outcome = f"{type(err).__name__}: {getattr(err, 'message', err)}"
    print(json.dumps({"growth_mib": (peak_kib() - start) / 1024, "outcome": outcome}))
    """
)


def _run_checks(tmp_path, calibration: bytes, buckets: dict) -> dict:
    model = tmp_path / "big.onnx"
    if not model.exists():
        _big_encoder(model)
    npz = tmp_path / "samples.npz"
    npz.write_bytes(calibration)
    spec = json.dumps({"precision": "int8", "shape_buckets": buckets})
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(model), str(npz), spec, "cpu-ort,rockchip-rk3588,qualcomm-sm8650"],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_big_model_checked_for_a_group_is_never_loaded_in_the_api(tmp_path):
    samples = io.BytesIO()
    np.savez(samples, x=np.zeros((4, 16, 1024), np.float32))
    found = _run_checks(tmp_path, samples.getvalue(), {"batch": [1], "seq": [16, 32]})
    assert found["outcome"] == "accepted", found
    assert found["growth_mib"] < ALLOWED_GROWTH_MIB, found


def test_a_bucket_the_model_cannot_take_is_still_refused_without_its_weights(tmp_path):
    samples = io.BytesIO()
    np.savez(samples, x=np.zeros((4, 16, 1024), np.float32))
    found = _run_checks(tmp_path, samples.getvalue(), {"batch": [1], "seq": [128]})
    assert "this model takes at most 64 positions" in found["outcome"], found
    assert found["growth_mib"] < ALLOWED_GROWTH_MIB, found


def test_a_calibration_bomb_is_judged_from_its_headers(tmp_path):
    bomb = _bomb_npz()
    assert len(bomb) < 8 * 2**20
    found = _run_checks(tmp_path, bomb, {"batch": [1], "seq": [16]})
    # The declared 1020 MiB passes the size cap; its last dim (512, the model takes 1024) does not fit, which
    # the header alone shows.
    assert "calibration data does not fit the model" in found["outcome"], found
    assert found["growth_mib"] < ALLOWED_GROWTH_MIB, found
