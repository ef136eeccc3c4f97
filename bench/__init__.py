"""Flex-DSA benchmarks against peer ONNX optimizers: ``python -m bench`` (see bench/README.md).

Results go to ``bench/results/`` (git-ignored): ``latest.json`` and the cached models under ``models/``.
"""

from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCH_DIR / "results"
REPO_ROOT = BENCH_DIR.parent
