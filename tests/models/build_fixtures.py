"""Regenerate the committed model fixtures: ``python tests/models/build_fixtures.py [names...]``.

Exports each tiny architecture of ``architectures.py`` to ``tests/models/<name>.onnx`` (and the BERT one
to ``examples/tiny_bert.onnx`` for the README quick start), then checks every file: the ONNX checker
passes, ONNX Runtime runs it at the export shape and at a different batch/sequence length (so the
dynamic axes really are dynamic), and its outputs match PyTorch's.

Needs torch (``pip install torch``); the tests that use the fixtures do not.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import numpy as np

MODELS_DIR = Path(__file__).resolve().parent
REPO_ROOT = MODELS_DIR.parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO_ROOT))

import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402

from tests.models.architectures import ARCHITECTURES, export_onnx, export_spec  # noqa: E402

EXAMPLE_COPIES = {"bert": REPO_ROOT / "examples" / "tiny_bert.onnx"}
# Shapes to re-check each fixture at, besides the export shape: the dynamic axes must follow.
OTHER_SHAPES = {"text": {"batch": 2, "seq": 9}, "vision": {"batch": 3}}
ATOL = 1e-4


def _max_abs_diff(path: Path, spec) -> float:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {name: tensor.numpy() for name, tensor in zip(spec.input_names, spec.inputs, strict=True)}
    got = session.run(None, feeds)
    with torch.no_grad():
        want = spec.module(*spec.inputs)
    want = want if isinstance(want, tuple) else (want,)
    return max(float(np.abs(g - w.numpy()).max()) for g, w in zip(got, want, strict=True))


def build(name: str) -> Path:
    arch = ARCHITECTURES[name]
    spec = export_spec(name, "tiny")
    path = MODELS_DIR / f"{name}.onnx"
    export_onnx(spec, path)
    onnx.checker.check_model(str(path), full_check=True)

    diffs = [_max_abs_diff(path, spec)]
    # Same weights (same seed), other shapes: the exported graph must not have baked the export shape in.
    diffs.append(_max_abs_diff(path, export_spec(name, "tiny", **OTHER_SHAPES[arch.kind])))
    if max(diffs) > ATOL:
        raise SystemExit(
            f"{name}: ONNX Runtime differs from PyTorch by {max(diffs):.2e} (> {ATOL}); fixture not usable"
        )

    model = onnx.load(str(path))
    print(
        f"{name:12s} {path.stat().st_size / 1024:7.0f} KB  {len(model.graph.node):4d} nodes  "
        f"opset {model.opset_import[0].version}  max |ort - torch| {max(diffs):.1e}"
    )
    if name in EXAMPLE_COPIES:
        EXAMPLE_COPIES[name].parent.mkdir(exist_ok=True)
        shutil.copyfile(path, EXAMPLE_COPIES[name])
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "names", nargs="*", help=f"fixtures to rebuild, of {', '.join(ARCHITECTURES)} (default: all)"
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(ARCHITECTURES))
    if unknown:
        parser.error(f"unknown fixture(s) {', '.join(unknown)}; known: {', '.join(ARCHITECTURES)}")
    for name in args.names or ARCHITECTURES:
        build(name)


if __name__ == "__main__":
    main()
