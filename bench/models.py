"""The benchmark models: the architectures of ``tests/models/architectures.py`` at realistic widths
(``ARCHITECTURES[name].bench``), exported the same way as the fixtures, random weights.

Built once in a subprocess (torch stays out of the timing process) and cached under
``bench/results/models/<name>-<key>.onnx`` with a ``.json`` sidecar (the dims the bench runs at, the head
count and width the ONNX Runtime transformers optimizer needs). The key hashes ``architectures.py``, so
editing a model rebuilds it and a rerun is otherwise instant.

``python -m bench.models NAME OUT.onnx`` is the builder the cache calls.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench import REPO_ROOT, RESULTS_DIR

ARCHITECTURES_FILE = REPO_ROOT / "tests" / "models" / "architectures.py"
MODELS_DIR = RESULTS_DIR / "models"
# Order of the tables; the names are those of tests/models/architectures.ARCHITECTURES.
BENCH_MODELS = ("bert", "gpt2", "llama", "vit", "resnet", "mobilenetv2")
QUICK_MODELS = ("bert", "resnet")


@dataclass(frozen=True)
class BenchModel:
    name: str
    path: Path
    kind: str  # "text" or "vision"
    dims: dict[str, int]  # symbolic dim -> value the bench runs at
    heads: int | None  # for the ONNX Runtime transformers optimizer
    hidden: int | None
    config: str  # repr of the architecture config, for the record


def _cache_key(name: str) -> str:
    digest = hashlib.sha256(ARCHITECTURES_FILE.read_bytes() + name.encode()).hexdigest()
    return digest[:12]


def bench_model(name: str, rebuild: bool = False) -> BenchModel:
    """The cached model ``name``, built first when missing (needs torch)."""
    if name not in BENCH_MODELS:
        raise SystemExit(f"unknown bench model {name!r}; known: {', '.join(BENCH_MODELS)}")
    path = MODELS_DIR / f"{name}-{_cache_key(name)}.onnx"
    meta_path = path.with_suffix(".json")
    if rebuild or not (path.is_file() and meta_path.is_file()):
        MODELS_DIR.mkdir(parents=True, exist_ok=True)
        print(f"building {name} (cached as {path.relative_to(REPO_ROOT)}) ...", flush=True)
        proc = subprocess.run(
            [sys.executable, "-m", "bench.models", name, str(path)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-5:])
            hint = (
                " (torch is needed to build the bench models: pip install torch)" if "torch" in tail else ""
            )
            raise SystemExit(f"could not build bench model {name}{hint}:\n{tail}")
        for stale in MODELS_DIR.glob(f"{name}-*"):  # builds from an older architectures.py
            if stale.stem.split(".")[0] != path.stem:
                stale.unlink()
    meta = json.loads(meta_path.read_text())
    return BenchModel(name=name, path=path, **meta)


def _build(name: str, out: Path) -> None:
    sys.path.insert(0, str(REPO_ROOT))
    from tests.models.architectures import ARCHITECTURES, export_onnx, export_spec

    arch = ARCHITECTURES[name]
    config = arch.bench
    dims = {"batch": config.batch}
    if arch.kind == "text":
        dims["seq"] = config.seq
    tmp = out.with_suffix(".tmp.onnx")
    export_onnx(export_spec(name, "bench"), tmp)
    tmp.replace(out)  # a half-written model is never mistaken for a cached one
    meta = {
        "kind": arch.kind,
        "dims": dims,
        "heads": getattr(config, "heads", None),
        "hidden": getattr(config, "hidden", None),
        "config": repr(config),
    }
    out.with_suffix(".json").write_text(json.dumps(meta, indent=1))


if __name__ == "__main__":
    _build(sys.argv[1], Path(sys.argv[2]))
