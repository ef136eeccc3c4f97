"""NNCF's post-training int8 of an ONNX model, as a peer in ``bench.precision``, run in NNCF's own environment.

NNCF 3.4 (no torch: its ONNX backend needs onnx and onnxruntime) pulls scikit-learn, scipy, networkx, ninja
and OpenVINO's telemetry client, none of which the project needs, so it lives in a virtual environment of
its own under ``~/.cache/flexdsa/peers/nncf`` (made once by ``ensure_env``, with the project's onnx,
onnxruntime and numpy pins) and is run as a subprocess, the way ``flexdsa_core/toolchains`` runs a vendor:

    <env>/bin/python bench/nncf_peer.py MODEL SAMPLES.npz OUT.onnx [--preset performance|mixed]

``SAMPLES.npz`` holds the calibration feeds as ``save_feeds`` writes them, one array per sample and input (the
same feeds ours and ONNX Runtime's quantisers get). ``nncf.quantize`` with its defaults (``performance``:
symmetric int8 activations and weights, per-channel weights, fast bias correction) or the ``mixed`` preset
(asymmetric activations, which ONNX Runtime's u8 x s8 kernels take). It prints one JSON line: seconds, preset.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ENV = Path.home() / ".cache" / "flexdsa" / "peers" / "nncf"
REQUIREMENTS = ("nncf==3.4.0", "onnx==1.23.2", "onnxruntime==1.31.1", "numpy==2.4.6")


def save_feeds(feeds: list[dict], path: Path) -> Path:
    """``feeds`` (one dict of input arrays per sample) as an ``.npz`` of ``<sample>/<input>`` arrays."""
    import numpy as np

    np.savez(path, **{f"{index}/{name}": value for index, feed in enumerate(feeds) for name, value in feed.items()})
    return path


def load_feeds(path) -> list[dict]:
    import numpy as np

    feeds: dict[int, dict] = {}
    with np.load(path) as archive:
        for key in archive.files:
            index, name = key.split("/", 1)
            feeds.setdefault(int(index), {})[name] = archive[key]
    return [feeds[i] for i in sorted(feeds)]


def ensure_env(log=print) -> Path | None:
    """NNCF's environment, made once; None (and why, logged) where it cannot be installed."""
    python = ENV / "bin" / "python"
    marker = ENV / ".installed"
    if python.is_file() and marker.is_file() and marker.read_text() == " ".join(REQUIREMENTS):
        return python
    log(f"creating NNCF's environment {ENV} (once) ...")
    try:
        subprocess.run([sys.executable, "-m", "venv", str(ENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *REQUIREMENTS],
                       check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as error:
        log(f"NNCF could not be installed ({error}): the bench runs without it")
        return None
    marker.write_text(" ".join(REQUIREMENTS))
    return python


def quantise(model: Path, samples: Path, out: Path, preset: str = "performance", log=print) -> dict:
    """Run this file in NNCF's environment on ``model``; what it printed, or ``{"error": ...}``."""
    python = ensure_env(log)
    if python is None:
        return {"error": "NNCF's environment could not be made"}
    # OpenVINO's telemetry client would try the network on import; nothing is reachable from here anyway.
    env = {**os.environ, "OPENVINO_TELEMETRY_OPT_OUT": "1", "NNCF_TELEMETRY_OPT_OUT": "1"}
    proc = subprocess.run([str(python), __file__, str(model), str(samples), str(out), "--preset", preset],
                          capture_output=True, text=True, env=env, timeout=1800)  # fmt: skip
    if proc.returncode != 0:
        return {"error": "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _main(argv: list[str]) -> None:
    import argparse
    import logging

    import nncf
    import onnx

    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("samples")
    parser.add_argument("out")
    parser.add_argument("--preset", choices=("performance", "mixed"), default="performance")
    args = parser.parse_args(argv)
    logging.getLogger("nncf").setLevel(logging.ERROR)
    model = onnx.load(args.model)
    feeds = load_feeds(args.samples)
    started = time.perf_counter()
    preset = nncf.QuantizationPreset.MIXED if args.preset == "mixed" else nncf.QuantizationPreset.PERFORMANCE
    quantised = nncf.quantize(model, nncf.Dataset(feeds), preset=preset, subset_size=len(feeds))
    onnx.save(quantised, args.out)
    print(json.dumps({"seconds": round(time.perf_counter() - started, 1), "preset": args.preset,
                      "samples": len(feeds), "nncf": nncf.__version__}))  # fmt: skip


if __name__ == "__main__":
    _main(sys.argv[1:])
