"""Which chip? Every bench model on every target, compared, in-process (no service).

    python -m bench.compare                              # the six fixtures x the seven targets
    python -m bench.compare --models bert,mobilenetv2 --targets cpu-ort,rockchip-rk3588
    python -m bench.compare --toolchains DIR             # where vendor toolchains are installed

Per model, the table ``flexdsa submit --targets`` prints (``flexdsa_core.compare``): per target the latency
(measured here for ``cpu-ort``, the roofline estimate elsewhere), the energy per inference where the part's
power is sourced, the accuracy (the vendor simulator where its toolchain is installed, else our ONNX
Runtime check), the accelerator's share of FLOPs, CPU-fallback nodes, the bundle's size and, where the vendor
compiled the original alone, ours / the vendor alone in the vendor's own cycles. Then the pipeline's time
per target. Each job runs with the default spec (``xilinx-kv260``, int8 only, calibrates on synthetic inputs:
numerics only). Results: ``bench/results/compare.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

from flexdsa_core import FlexDSAError, FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.cli import DEFAULT_TOOLCHAINS_DIR
from flexdsa_core.compare import comparison_row, render_comparison, resolve_targets
from flexdsa_core.targets import list_targets
from tests.models import FIXTURES, fixture

RESULTS = Path(__file__).parent / "results"


def bundle_bytes(artifacts: dict[str, bytes | Path]) -> int:
    return sum(os.path.getsize(c) if isinstance(c, str | os.PathLike) else len(c) for c in artifacts.values())


def compare_one(model: str, target: str, toolchains: Path | None) -> dict:
    """One target's comparison row for ``model``, with the pipeline's time; a failed job's row says why."""
    options = OptimizeOptions(allow_synthetic_calibration=True)
    started = time.perf_counter()
    try:
        result = FlexDSAOptimizer(target, toolchain_root=toolchains).optimize(fixture(model), options)
    except FlexDSAError as err:
        return {"target": target, "status": "failed", "error": err.message, "seconds": time.perf_counter() - started}
    row = comparison_row(result.report, bundle_bytes(result.artifacts))
    return {**row, "status": "succeeded", "seconds": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(FIXTURES), help="comma-separated fixtures")
    parser.add_argument("--targets", default="all", help="comma-separated target names, or 'all'")
    parser.add_argument("--toolchains", type=Path, default=DEFAULT_TOOLCHAINS_DIR)
    args = parser.parse_args(argv)
    logging.getLogger().setLevel(logging.ERROR)  # onnxruntime.quantization's hints on the root logger
    targets = resolve_targets(args.targets, [t.name for t in list_targets()])
    results = {}
    for model in args.models.split(","):
        rows = [compare_one(model, target, args.toolchains) for target in targets]
        results[model] = rows
        print(f"\n== {model} ({fixture(model).name}) on {len(targets)} targets")
        print(render_comparison(rows))
        print("pipeline time: " + ", ".join(f"{row['target']} {row['seconds']:.1f} s" for row in rows))
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "compare.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"\nResults: {RESULTS / 'compare.json'}")


if __name__ == "__main__":
    main()
