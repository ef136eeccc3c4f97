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

Then, where a vendor toolchain gives its own cost (rknn-toolkit2 for ``rockchip-rk3588``), the comparison with
the vendor alone on the bench models at realistic widths (``bench.models``), by the vendor's own estimate at
the same input shapes: per model, without samples (the default spec, float16) and with calibration samples
(``precision: mixed``, calibrated on the first two thirds, judged in the vendor's simulator on the rest): the
vendor alone's cycles (float16, and its own w8a8 with its accuracy), ours, the ratio to the vendor alone's best
build that keeps the accuracy target, CPU-fallback layers and transitions of both, the precision shipped and
its accuracy on the held-out samples. Results: ``bench/results/vendor.json``.

    python -m bench.targets --vendor-only --vendor-models vit,resnet
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import time
from pathlib import Path

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.cache import LRUCache
from flexdsa_core.cli import DEFAULT_TOOLCHAINS_DIR
from flexdsa_core.targets import list_targets
from tests.models import FIXTURES, fixture

RESULTS = Path(__file__).parent / "results"
BUCKETS = {"batch": [1], "seq": [16]}
VENDOR_TARGET = "rockchip-rk3588"
VENDOR_MODELS = ("bert", "gpt2", "llama", "vit", "resnet", "mobilenetv2")
# Trained models with real inputs (bench.trained), whose held-out accuracy means something; their buckets.
TRAINED_BUCKETS = {
    "efficientnet-lite0": {"batch": [1]},
    "minilm-l6": {"batch": [1], "seq": [32]},
    "mtcnn-pnet": {},
    "silero-vad": {},
}
# The transformer encoders' goal holds every held-out sample, not only the pooled cosine: each embedding at 0.99.
TRAINED_ACCURACY = {"minilm-l6": {"min_sample_cosine": 0.99}}


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
    parser.add_argument("--vendor-models", default=",".join((*VENDOR_MODELS, *TRAINED_BUCKETS)),
                        help="bench models (random weights) and trained fixtures (bench.trained: real samples) "
                             "for the comparison with the vendor alone")  # fmt: skip
    parser.add_argument("--samples", type=int, default=12, help="calibration samples for the 'with samples' rows")
    parser.add_argument("--vendor-only", action="store_true", help="only the comparison with the vendor alone")
    parser.add_argument("--no-vendor", action="store_true", help="skip the comparison with the vendor alone")
    args = parser.parse_args(argv)
    # onnxruntime.quantization logs a pre-processing hint on the root logger for every stand-in model
    logging.getLogger().setLevel(logging.ERROR)
    if not args.vendor_only:
        fixtures_table(args)
    if args.no_vendor:
        return
    from flexdsa_core.toolchains import get_toolchain

    if not get_toolchain("rockchip").status(args.toolchains).ready:
        print(f"\n{VENDOR_TARGET}: rknn-toolkit2 is not installed (flexdsa toolchains install rockchip): no comparison")
        return
    rows = []
    for samples in (0, args.samples):
        for model in args.vendor_models.split(","):
            rows.append(vendor_row(model, args.toolchains, samples))
    print_vendor(rows)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "vendor.json").write_text(json.dumps(rows, indent=2, default=str))


def fixtures_table(args) -> None:
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


def vendor_row(model: str, toolchains: Path, samples: int) -> dict:
    """One model on rockchip-rk3588 with the vendor in the loop: without samples (``samples`` 0), or under
    ``precision: mixed`` with calibration samples: a bench model's ``samples`` seeded inputs, a trained
    fixture's own real samples (judged by its task's metric)."""
    import numpy as np
    import onnx

    from bench.models import bench_model
    from flexdsa_core.ort_runs import make_inputs

    calibration = None
    if model in TRAINED_BUCKETS:  # a trained model: its own real samples, judged by its task's metric
        from bench.trained import fixture as trained_fixture

        trained = trained_fixture(model)
        path = trained.model
        options = {"shape_buckets": TRAINED_BUCKETS[model], "measure_latency": False}
        if samples:
            calibration = trained.arrays()
            options.update(precision="mixed", accuracy={**trained.accuracy, **TRAINED_ACCURACY.get(model, {})})
    else:
        bench = bench_model(model)
        path = bench.path
        options = {"shape_buckets": {k: [v] for k, v in bench.dims.items()}, "measure_latency": False}
        if samples:
            proto = onnx.load(str(bench.path), load_external_data=False)
            rows = [make_inputs(proto, seed=1000 + i, dims=bench.dims) for i in range(samples)]
            calibration = {name: np.concatenate([r[name] for r in rows]) for name in rows[0]}
            options["precision"] = "mixed"
    count = 0 if calibration is None else trained.meta["samples"] if model in TRAINED_BUCKETS else samples
    started = time.perf_counter()
    result = FlexDSAOptimizer(VENDOR_TARGET, toolchain_root=toolchains).optimize(
        path, OptimizeOptions(**options), calibration=calibration
    )
    [(bucket, row)] = list(result.report["vendor"]["buckets"].items())[:1]
    accuracy = ((result.report["toolchain"].get("buckets") or {}).get(bucket) or {}).get("accuracy") or {}
    return {
        "model": model, "samples": count, "bucket": bucket, "seconds": time.perf_counter() - started,
        "alone_fp16": row["vendor_alone"], "alone_int8": row.get("vendor_alone_int8"),
        "alone_best": row.get("vendor_alone_best"), "ours": row["ours"], "ratio": row["ratio"],
        "shipped": row["shipped"], "precision": row.get("precision") or "float16", "forms": row["forms"],
        "accuracy": accuracy, "decision": row["decision"], "measure": result.report["vendor"]["measure"],
        "energy": result.report["vendor"]["energy"]["detail"], "exact_rewrites": row.get("exact_rewrites"),
    }  # fmt: skip


def _acc(figure: dict | None) -> str:
    """The held-out accuracy in one cell: worst cosine and top-1 over the outputs, with the sample count."""
    if not figure or not figure.get("outputs"):
        return "-"
    cosines = [o["cosine"] for o in figure["outputs"].values() if o.get("cosine") is not None]
    top1 = [o["top1_agreement"] for o in figure["outputs"].values() if o.get("top1_agreement") is not None]
    worst = [o["worst_sample_cosine"] for o in figure["outputs"].values() if o.get("worst_sample_cosine") is not None]
    text = f"cos {min(cosines):.4f}" if cosines else ""
    if worst:
        text += f" worst {min(worst):.4f}"
    if top1:
        text += f" top1 {min(top1):.3f}"
    return f"{text} ({figure.get('samples', '?')})" + ("" if figure.get("ok") else " MISS")


def print_vendor(rows: list[dict]) -> None:
    print(f"\n{VENDOR_TARGET}: ours against rknn-toolkit2 alone, by its own estimate (cycles) at the same shapes")
    print(f"{'model':<12} {'samples':>7} {'alone fp16':>11} {'alone w8a8':>11} {'w8a8 acc (held-out)':>26} "
          f"{'ours':>11} {'ratio':>6} {'cpu/tr best':>12} {'cpu/tr ours':>11} {'shipped':<22} {'ours acc (held-out)':>26}")  # fmt: skip
    for row in rows:
        int8 = row["alone_int8"] or {}
        best = row["alone_best"] or row["alone_fp16"]
        print(
            f"{row['model']:<12} {row['samples']:>7} {_fmt(row['alone_fp16'].get('cycles'), '.0f'):>11} "
            f"{_fmt(int8.get('cycles'), '.0f'):>11} {_acc(int8.get('confirmation') or int8.get('accuracy')):>26} "
            f"{_fmt(row['ours'].get('cycles'), '.0f'):>11} {_fmt(row['ratio'], '.3f'):>6} "
            f"{best.get('cpu_nodes', '-')}/{best.get('transitions', '-'):<10} "
            f"{row['ours'].get('cpu_nodes', '-')}/{row['ours'].get('transitions', '-'):<9} "
            f"{row['precision'] + (' + forms' if row['forms'] else ''):<22} {_acc(row['accuracy']):>26}",
            flush=True,
        )
    for row in rows:
        print_exact(row)
    ratios = [r["ratio"] for r in rows if r["ratio"]]
    for with_samples in (False, True):
        chosen = [r["ratio"] for r in rows if bool(r["samples"]) == with_samples and r["ratio"]]
        if chosen:
            geomean = math.exp(sum(math.log(x) for x in chosen) / len(chosen))
            print(f"geomean ratio {'with' if with_samples else 'without'} samples: {geomean:.3f} over {len(chosen)} "
                  f"models (worst {max(chosen):.3f})")  # fmt: skip
    if ratios:
        print("ratio: ours / the vendor alone's best build that keeps the accuracy target (float16, or its own w8a8 "
              "where accurate on the held-out samples)")  # fmt: skip
        print(f"measure: {rows[0]['measure']}; {rows[0]['energy']}")


def print_exact(row: dict) -> None:
    """The exact rewrites of a row (where the vendor alone's w8a8 lost accuracy): what they did, the cycles against
    the vendor alone's float16 and w8a8, and the vendor's per-layer analysis before and after (worst layers)."""
    exact = row.get("exact_rewrites")
    if not exact:
        return
    int8 = (row["alone_int8"] or {}).get("cycles")
    ours, fp16 = row["ours"].get("cycles"), row["alone_fp16"].get("cycles")
    print(f"\n{row['model']} ({row['samples']} samples), exact rewrites: shipped {row['precision']}; "
          f"{_fmt(ours, '.0f')} cycles = {_fmt(ours / fp16 if ours and fp16 else None, '.3f')}x the vendor alone's float16, "
          f"{_fmt(ours / int8 if ours and int8 else None, '.3f')}x its w8a8; {exact.get('validation', '')}")  # fmt: skip
    for name, form in exact.get("forms", {}).items():
        sites = form.get("sites") or {}
        print(f"  {name}: {len(sites)} site(s)" + (f", e.g. {next(iter(sites.items()))}" if sites else ""))
    for label, key in (("vendor alone w8a8", "layer_accuracy_vendor_alone"), ("w8a8 + exact rewrites", "layer_accuracy")):
        layers = exact.get(key) or {}
        worst = ", ".join(f"{w['op']} {w['layer']} {w['cosine_single']:.4f}" for w in (layers.get("worst_single") or [])[:4])
        if worst:
            print(f"  per-layer (rknn accuracy_analysis, single-layer cosine, {label}): {worst}")


if __name__ == "__main__":
    main()
