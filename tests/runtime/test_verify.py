"""``python -m flexdsa_runtime verify`` and ``flexdsa verify-bundle`` on a bundle the real pipeline made (cpu-ort,
examples/tiny_bert.onnx): it passes against the original, says why nothing is comparable without it, refuses a
changed file by its checksum, and fails a consistently re-listed bundle whose weights were changed; a missing or
unusable bundle is refused with exit status 2."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from flexdsa_runtime.verify import EXIT_FAIL, EXIT_NOTHING_CHECKED, EXIT_PASS, EXIT_UNUSABLE, main

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "examples" / "tiny_bert.onnx"


@pytest.fixture(scope="module")
def bundle(make_bundle):
    return make_bundle(MODEL, "cpu-ort")


def _verify(capsys, *args) -> tuple[int, str]:
    status = main([str(a) for a in args])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def test_a_bundle_holds_its_claim_against_the_original(bundle, capsys):
    status, out = _verify(capsys, bundle, "--original", MODEL)
    assert status == EXIT_PASS, out
    assert out.startswith("PASS  dynamic  model.onnx  [onnxruntime]")
    assert "claimed: within the validation's tolerances of the original" in out
    assert (
        "inputs: 1 synthetic input, seeded" in out and "1 PASS: every checked artifact holds its claim" in out
    )
    status, out = _verify(capsys, bundle, "--original", MODEL, "--json")
    [check] = json.loads(out)["checks"]
    assert check["status"] == "PASS" and check["backend"] == "onnxruntime"
    assert check["measured"]["last_hidden_state"]["cosine"] > 0.99999


def test_without_the_original_nothing_is_comparable(bundle, capsys):
    status, out = _verify(capsys, bundle)
    assert status == EXIT_NOTHING_CHECKED, out
    assert out.startswith("RAN ") and "give --original MODEL.onnx" in out
    assert "nothing could be checked against a claim here" in out


def test_a_zipped_bundle_is_checked_too(bundle, tmp_path, capsys):
    archive = tmp_path / "bundle.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        for path in bundle.rglob("*"):
            handle.write(path, path.relative_to(bundle).as_posix())
    status, out = _verify(capsys, archive, "--original", MODEL)
    assert status == EXIT_PASS, out


def _changed_weights(bundle: Path, folder: Path, relist: bool) -> Path:
    """A copy of ``bundle`` whose largest weight is scaled by 1.05; with ``relist`` its manifest names the new
    file's checksum (a bundle rebuilt wrong, consistently), else the manifest is the original's."""
    shutil.copytree(bundle, folder)
    path = folder / "model.onnx"
    model = onnx.load(path)
    weight = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * np.float32(1.05), weight.name))
    onnx.save(model, path)
    if relist:
        manifest = json.loads((folder / "manifest.json").read_text())
        data = path.read_bytes()
        manifest["files"]["model.onnx"].update(sha256=hashlib.sha256(data).hexdigest(), size=len(data))
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return folder


def test_changed_weights_are_refused_by_checksum_or_fail_the_check(bundle, tmp_path, capsys):
    status, out = _verify(
        capsys, _changed_weights(bundle, tmp_path / "changed", relist=False), "--original", MODEL
    )
    assert status == EXIT_UNUSABLE and "model.onnx does not match its checksum" in out, out
    status, out = _verify(
        capsys, _changed_weights(bundle, tmp_path / "relisted", relist=True), "--original", MODEL
    )
    assert status == EXIT_FAIL, out
    assert out.startswith("FAIL  dynamic  model.onnx") and "beyond atol 0.0001 + rtol 0.001" in out


def test_a_missing_or_unusable_bundle_is_refused(tmp_path, capsys):
    status, out = _verify(capsys, tmp_path / "nowhere")
    assert status == EXIT_UNUSABLE and "does not exist" in out
    status, out = _verify(capsys, tmp_path)
    assert status == EXIT_UNUSABLE and "has no manifest.json" in out
    (tmp_path / "bundle.zip").write_text("not a zip")
    status, out = _verify(capsys, tmp_path / "bundle.zip")
    assert status == EXIT_UNUSABLE and "is not a readable zip" in out


def test_the_cli_runs_the_runtimes_check(bundle):
    """``flexdsa verify-bundle`` is ``python -m flexdsa_runtime verify``, its exit status included."""
    for command in (
        [sys.executable, "-m", "flexdsa_core.cli", "verify-bundle", str(bundle), "--original", str(MODEL)],
        [sys.executable, "-m", "flexdsa_runtime", "verify", str(bundle), "--original", str(MODEL)],
    ):
        done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
        assert done.returncode == EXIT_PASS, done.stdout + done.stderr
        assert "PASS  dynamic  model.onnx  [onnxruntime]" in done.stdout
    done = subprocess.run([sys.executable, "-m", "flexdsa_core.cli", "verify-bundle", str(bundle)],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)  # fmt: skip
    assert done.returncode == EXIT_NOTHING_CHECKED, done.stdout + done.stderr
