"""Per-target benchmark: every accelerator target on every model fixture, in one run.

    python -m bench.targets                          # all accelerator targets x the six fixtures
    python -m bench.targets --targets rockchip-rk3588,qualcomm-sm8650 --models resnet,bert
    python -m bench.targets --toolchains DIR         # where vendor toolchains are installed

Per target and model it prints: the pipeline time cold (empty kernel cache) and warm (the same cache
again), the Subgraph Mapper's kernels explored vs kernel-cache hits, the accelerator's share of FLOPs,
the CPU-fallback node count and transitions, the estimated latency beside its roofline bound (both
estimates from the sourced spec, labelled partial where the spec is silent), and where the vendor
toolchain is ready, the placement agreement with the vendor tool and the vendor simulator's cosine to
the original. Results: ``bench/results/targets.json``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.cache import LRUCache
from flexdsa_core.cli import DEFAULT_TOOLCHAINS_DIR
from flexdsa_core.targets import list_targets
from tests.models import FIXTURES, fixture

RESULTS = Path(__file__).parent / "results"
BUCKETS = {"batch": [1], "seq": [16]}


def _buckets(model: str) -> dict[str, list[int]]:
    return BUCKETS if model in ("bert", "gpt2", "llama") else {"batch": [1]}


def run_one(target, model: str, toolchains: Path | None) -> dict:
    options = OptimizeOptions(shape_buckets=_buckets(model), measure_latency=False)
    cache = LRUCache()
    optimizer = FlexDSAOptimizer(target, toolchain_root=toolchains)
    started = time.perf_counter()
    result = optimizer.optimize(fixture(model), options, cache=cache)
    cold = time.perf_counter() - started
    started = time.perf_counter()
    FlexDSAOptimizer(target).optimize(fixture(model), options, cache=cache)  # warm: same cache, no toolchain
    warm = time.perf_counter() - started
    report = result.report
    [(bucket, part)] = list(report["partition"].items())[:1]
    estimate = report["estimates"]["per_bucket"][bucket]["on_target"]
    toolchain = report.get("toolchain") or {}
    vendor = (toolchain.get("buckets") or {}).get(bucket, {})
    cosines = [o["cosine"] for o in vendor.get("numerics", []) if o.get("cosine") is not None]
    return {
        "target": target, "model": model, "bucket": bucket,
        "cold_s": cold, "warm_s": warm, "toolchain_s": report["compile_seconds"].get("toolchain"),
        "explored": part["kernels"]["explored"], "cache_hits": part["kernels"]["cache_hits"],
        "kernels": part["kernels"]["groups"], "flop_share": part["accelerator_flop_share"],
        "fallback_nodes": len(part["fallback"]), "transitions": part["transitions"],
        "estimate_s": estimate["latency_s"], "roofline_s": estimate["roofline_bound_s"],
        "partial": estimate["partial"], "validated": report["validation"]["ok"],
        "toolchain": toolchain.get("name"), "toolchain_ran": toolchain.get("ran", False),
        "placement_agreement": (vendor.get("placement_agreement") or {}).get("share"),
        "vendor_cosine": min(cosines) if cosines else None,
        "fusions_taken": report["fusions"]["applied"],
    }  # fmt: skip


def _fmt(value, spec: str = ".3g", scale: float = 1.0) -> str:
    return "-" if value is None else format(value * scale, spec)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--targets", default="", help="comma-separated (default: every accelerator target)")
    parser.add_argument("--models", default=",".join(FIXTURES), help="comma-separated fixtures")
    parser.add_argument("--toolchains", type=Path, default=DEFAULT_TOOLCHAINS_DIR)
    args = parser.parse_args(argv)
    targets = [t.name for t in list_targets() if not t.calibrated]
    if args.targets:
        targets = args.targets.split(",")
    rows = []
    header = (f"{'target':<18} {'model':<12} {'cold s':>7} {'warm s':>7} {'explored':>8} {'hits':>5} "
              f"{'acc FLOP':>8} {'cpu n':>5} {'trans':>5} {'est us':>8} {'roof us':>8} {'agree':>6} {'cosine':>8}")  # fmt: skip
    print(header)
    for target in targets:
        for model in args.models.split(","):
            row = run_one(target, model, args.toolchains)
            rows.append(row)
            print(
                f"{target:<18} {model:<12} {row['cold_s']:>7.2f} {row['warm_s']:>7.2f} {row['explored']:>8} "
                f"{row['cache_hits']:>5} {_fmt(row['flop_share'], '.1%'):>8} {row['fallback_nodes']:>5} "
                f"{row['transitions']:>5} {_fmt(row['estimate_s'], '.1f', 1e6):>8}{'*' if row['partial'] else ' '}"
                f"{_fmt(row['roofline_s'], '.1f', 1e6):>8} {_fmt(row['placement_agreement'], '.0%'):>6} "
                f"{_fmt(row['vendor_cosine'], '.5f'):>8}",
                flush=True,
            )
    print("* partial estimate: the spec leaves a figure unsourced or nodes run on the CPU (see report notes)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "targets.json").write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
