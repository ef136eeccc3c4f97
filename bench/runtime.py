"""``python -m bench.runtime``: a length trace replayed through flexdsa_runtime, before and after one
re-specialisation from the traffic it produced.

1. **The trace**: token lengths of real sentences, the docstrings of this Python's standard library split into
   sentences and tokenised simply (words and punctuation marks, plus [CLS] and [SEP]; truncated at 128, as a
   tokenizer with ``max_length=128`` would). Shuffled with a fixed seed, then cut in two: a *window* the
   deployed bundle serves (its traffic is what the service re-specialises from) and a held-out *replay*.
2. **The model**: a BERT-base-size encoder with random weights (``bench.runtime_model``), 12 layers.
3. **Before**: the bundle with the static targets' default single bucket (batch 1, seq 128), compiled for
   ``cpu-ort``; the runtime serves the window with it, on one ONNX Runtime thread.
4. **The proposal** from that traffic (``flexdsa_core.respecialise.propose``, what ``POST /jobs/{id}/
   respecialise`` computes): expected cost per request and padding waste of the single bucket, the target's
   default and at most ``--max-buckets`` chosen buckets, by the cost model of ``cpu-ort`` (FLOPs at this host's
   SGEMM peak) and of ``rockchip-rk3588`` (roofline). With ``--rknn`` and the rockchip toolchain installed,
   rknn-toolkit2's own cycle estimate for each bucket is read from compiling the bundles with it.
5. **After**: the proposed buckets compiled for ``cpu-ort``; ``Runtime.update`` switches to them (timed); the
   replay runs on the old and the new version, interleaved request by request, so both see the same machine.
6. **Overhead**: the runtime's own time per request (bucket choice, padding, cropping, counting: its
   ``timing``, the run minus the backend's run) against the backend's ONNX Runtime run.

Results: printed, and ``bench/results/runtime.json``. Run it under the machine's benchmark lock when the
machine is shared.
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import statistics
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import RESULTS_DIR

MAX_LENGTH = 128
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(`\"'])")
TOKEN = re.compile(r"\w+|[^\w\s]")


def length_trace() -> list[int]:
    """Token lengths of the sentences in the standard library's docstrings (tests and site-packages left out)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    lengths = []
    for path in sorted(stdlib.rglob("*.py")):
        parts = set(path.relative_to(stdlib).parts)
        if parts & {"site-packages", "test", "tests", "idle_test", "lib2to3"}:
            continue
        try:
            tree = ast.parse(path.read_text(errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            for sentence in SENTENCE_END.split(" ".join(doc.split())):
                tokens = len(TOKEN.findall(sentence))
                if tokens >= 3:
                    lengths.append(min(tokens + 2, MAX_LENGTH))
    return lengths


def _feeds(seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "input_ids": rng.integers(1000, 30000, (1, seq)).astype(np.int64),
        "attention_mask": np.ones((1, seq), np.int64),
    }


def _compile(
    model: Path, target: str, buckets: dict, out: Path, *, toolchain: bool = False
) -> tuple[Path, float]:
    from flexdsa_core import FlexDSAOptimizer, RequestSpec

    request = RequestSpec.model_validate(
        {
            "target": target,
            "shape_buckets": buckets,
            "measure_latency": False,
            "calibrate": False,
            "never_slower": False,
        }
    )
    root = Path.home() / ".cache" / "flexdsa" / "toolchains" if toolchain else None
    started = time.perf_counter()
    result = FlexDSAOptimizer(request.target_spec(), toolchain_root=root).optimize(model, request.options())
    seconds = time.perf_counter() - started
    result.write(out)
    return out, seconds


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "mean_ms": statistics.fmean(values) * 1e3,
        "p50_ms": ordered[len(ordered) // 2] * 1e3,
        "p90_ms": ordered[int(len(ordered) * 0.9)] * 1e3,
    }


def _observed(snapshot: dict) -> list[tuple[dict[str, int], int]]:
    return [(dict(e["dims"]), e["count"]) for e in snapshot["entries"]]


def _rknn_estimate(model: Path, buckets_before: dict, buckets_after: dict, observed, work: Path) -> dict:
    """rknn-toolkit2's own cycle estimate per bucket (its layer table's total cycles, summed), from compiling
    each bundle with the rockchip toolchain; the expected cycles per request of the traffic before and after."""
    per_bucket: dict[int, float] = {}
    for label, buckets in (("before", buckets_before), ("after", buckets_after)):
        folder, _ = _compile(model, "rockchip-rk3588", buckets, work / f"rknn-{label}", toolchain=True)
        report = json.loads((folder / "report.json").read_text())
        toolchain = report.get("toolchain") or {}
        if not toolchain.get("ran"):
            return {"ran": False, "detail": toolchain.get("detail") or toolchain.get("failed")}
        manifest = json.loads((folder / "manifest.json").read_text())
        dims = {b["name"]: b["dims"] for b in manifest["buckets"]}
        for name, entry in toolchain["buckets"].items():
            cycles = sum(float(layer.get("cycles") or 0) for layer in entry.get("layers", []))
            per_bucket[dims[name]["seq"]] = cycles

    def expected(values: list[int]) -> float:
        total = sum(count for _, count in observed)
        return (
            sum(count * per_bucket[min(v for v in values if v >= dims["seq"])] for dims, count in observed)
            / total
        )

    before, after = sorted(buckets_before["seq"]), sorted(buckets_after["seq"])
    return {
        "ran": True,
        "cycles_per_bucket": per_bucket,
        "before_cycles_per_request": expected(before),
        "after_cycles_per_request": expected(after),
        "ratio": expected(after) / expected(before),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--window", type=int, default=600, help="requests the first version serves (its traffic)"
    )
    parser.add_argument("--replay", type=int, default=200, help="held-out requests replayed on both versions")
    parser.add_argument("--max-buckets", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    parser.add_argument("--rknn", action="store_true", help="also rknn-toolkit2's cycle estimate (slow)")
    parser.add_argument(
        "--sweep",
        action="store_true",
        help="only the expected cost and waste for 1..16 buckets (no compile, no run)",
    )
    args = parser.parse_args(argv)
    if args.sweep:
        return sweep(args.window)

    import onnx
    import onnx_ir as ir

    from bench.runtime_model import bert_base
    from flexdsa_core.respecialise import propose
    from flexdsa_core.targets import load_target
    from flexdsa_core.traffic_buckets import expected_cost
    from flexdsa_runtime import Runtime

    lengths = length_trace()
    random.Random(0).shuffle(lengths)
    window, replay = lengths[: args.window], lengths[args.window : args.window + args.replay]
    print(
        f"trace: {len(lengths)} docstring sentences of the standard library; tokens mean {statistics.fmean(lengths):.1f}, "
        f"median {statistics.median(lengths)}, p90 {sorted(lengths)[int(len(lengths) * 0.9)]}, "
        f"at the 128 cap {sum(v == MAX_LENGTH for v in lengths) / len(lengths):.1%}"
    )
    model_path = bert_base()
    work = Path(tempfile.mkdtemp(prefix="bench-runtime-"))
    single = {"batch": [1], "seq": [MAX_LENGTH]}
    before_folder, before_s = _compile(model_path, "cpu-ort", single, work / "before")
    print(f"compiled the single-bucket bundle (seq 128) for cpu-ort in {before_s:.1f} s")

    rng = np.random.default_rng(0)
    window_latency = []
    with Runtime.open(before_folder, store=work / "device", threads=args.threads) as runtime:
        for seq in window:
            feeds = _feeds(seq, rng)
            started = time.perf_counter()
            runtime.run(feeds)
            window_latency.append(time.perf_counter() - started)
        snapshot = runtime.traffic.snapshot()
        window_waste = runtime.traffic.padding_waste()
        observed = _observed(snapshot)

        model = ir.from_proto(onnx.load(model_path, load_external_data=False))
        current = [{"dims": {"batch": 1, "seq": MAX_LENGTH}}]
        proposals = {}
        for target in ("cpu-ort", "rockchip-rk3588"):
            started = time.perf_counter()
            proposals[target] = propose(model, load_target(target), observed, current, args.max_buckets)
            proposals[target]["seconds"] = time.perf_counter() - started
        chosen = proposals["cpu-ort"]["proposed"]["buckets"]
        after_folder, after_s = _compile(model_path, "cpu-ort", chosen, work / "after")
        print(f"re-specialised to {chosen} and compiled in {after_s:.1f} s")
        started = time.perf_counter()
        update = runtime.update(after_folder)
        update_s = time.perf_counter() - started
        timing_window = update.pop("previous_timing")  # the first version's, over the window

        # The replay, interleaved: each request on the new version (this runtime) and on the old (a second one).
        with Runtime.open(before_folder, threads=args.threads) as old:
            paired = []
            for index, seq in enumerate(replay):
                feeds = _feeds(seq, rng)
                order = (runtime, old) if index % 2 == 0 else (old, runtime)
                times = {}
                for served in order:
                    started = time.perf_counter()
                    served.run(feeds)
                    times[served is runtime] = time.perf_counter() - started
                paired.append((times[False], times[True]))
            timing_old = old.timing
        timing_new = runtime.timing
        replay_waste = runtime.traffic.padding_waste()

    replay_observed = [({"batch": 1, "seq": v}, 1) for v in replay]
    cpu_cost = None
    if proposals["cpu-ort"]:
        from flexdsa_core.shape_tracker import ShapeTracker

        cost, _ = ShapeTracker(model).traffic_cost(load_target("cpu-ort"))
        cpu_cost = {
            "single": expected_cost(replay_observed, single, cost),
            "proposed": expected_cost(replay_observed, chosen, cost),
        }
    timings = {"window (single bucket)": timing_window, "replay, old": timing_old, "replay, new": timing_new}
    rknn = (
        _rknn_estimate(model_path, single, chosen, observed, work)
        if args.rknn
        else {"ran": False, "detail": "not asked (--rknn)"}
    )

    before_ms = [p[0] for p in paired]
    after_ms = [p[1] for p in paired]
    ratios = [a / b for b, a in paired]
    results = {
        "trace": {
            "sentences": len(lengths),
            "window": len(window),
            "replay": len(replay),
            "mean_tokens": statistics.fmean(lengths),
            "median_tokens": statistics.median(lengths),
        },
        "proposals": proposals,
        "chosen": chosen,
        "compile_s": {"before": before_s, "after": after_s},
        "update_s": update_s,
        "update": {k: v for k, v in update.items() if k != "previous_traffic"},
        "latency": {
            "window_single_bucket": _summary(window_latency),
            "replay_old": _summary(before_ms),
            "replay_new": _summary(after_ms),
            "paired_ratio_median": statistics.median(ratios),
            "paired_ratio_p10_p90": [
                sorted(ratios)[len(ratios) // 10],
                sorted(ratios)[len(ratios) * 9 // 10],
            ],
        },
        "padding_waste_elements": {"window_single": window_waste, "replay_new": replay_waste},
        "held_out_expected_cost_cpu_ort": cpu_cost,
        "overhead": {
            name: {
                "requests": t.requests,
                "overhead_us_per_request": t.overhead_s / t.requests * 1e6,
                "backend_ms_per_request": t.backend_s / t.requests * 1e3,
                "share_of_backend": t.overhead_s / t.backend_s,
            }
            for name, t in timings.items()
        },
        "rknn": rknn,
    }
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "runtime.json").write_text(json.dumps(results, indent=2, default=str))
    _print(results)
    print(f"\nwritten to {RESULTS_DIR / 'runtime.json'}")
    return 0


def sweep(window_size: int) -> int:
    """Expected cost per request and padding waste of the window's lengths against the number of buckets the
    planner may use, per target's cost model: how many buckets a waste goal needs (no compile, no run)."""
    import onnx
    import onnx_ir as ir

    from bench.runtime_model import bert_base
    from flexdsa_core.shape_tracker import ShapeTracker
    from flexdsa_core.targets import load_target
    from flexdsa_core.traffic_buckets import choose_traffic_buckets, expected_cost

    lengths = length_trace()
    random.Random(0).shuffle(lengths)
    counts: dict[int, int] = {}
    for value in lengths[:window_size]:
        counts[value] = counts.get(value, 0) + 1
    observed = [({"batch": 1, "seq": v}, n) for v, n in sorted(counts.items())]
    model = ir.from_proto(onnx.load(bert_base(), load_external_data=False))
    rows = {}
    for target in ("cpu-ort", "rockchip-rk3588"):
        cost, basis = ShapeTracker(model).traffic_cost(load_target(target))
        memo: dict = {}

        def cached(dims, cost=cost, memo=memo):
            key = tuple(sorted(dims.items()))
            if key not in memo:
                memo[key] = cost(dims)
            return memo[key]

        single = expected_cost(observed, {"batch": [1], "seq": [MAX_LENGTH]}, cached)["expected_cost_s"]
        print(f"\n{target} ({basis}); {window_size} requests, {len(counts)} distinct lengths")
        print(f"{'buckets':>8} {'vs single 128':>14} {'padding waste':>14}  chosen seq")
        rows[target] = []
        for k in range(1, 17):
            choice = choose_traffic_buckets(observed, k, cached, basis)
            found = expected_cost(observed, choice.chosen, cached)
            rows[target].append({"k": k, "ratio": found["expected_cost_s"] / single, **found})
            print(
                f"{k:>8} {found['expected_cost_s'] / single:13.2f}x {found['padding_waste']:13.1%}  {choice.chosen['seq']}"
            )
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "runtime-sweep.json").write_text(json.dumps(rows, indent=2, default=str))
    return 0


def _print(results: dict) -> None:
    print("\nExpected cost per request of the window's traffic (estimates from each target's cost model)")
    print(f"{'target':<17} {'buckets':<34} {'cost/request':>13} {'vs single 128':>14} {'padding waste':>14}")
    for target, found in results["proposals"].items():
        base = found["current"]["expected_cost_s"]
        for label in ("current", "default", "proposed"):
            row = found[label]
            if row.get("buckets") is None:
                continue
            name = {"current": "single bucket", "default": "target default", "proposed": "proposed"}[label]
            seq = json.dumps(row["buckets"]["seq"]) if "seq" in row["buckets"] else "(dynamic: no padding)"
            print(
                f"{target:<17} {name + ' ' + seq:<34} "
                f"{row['expected_cost_s'] * 1e3:10.3f} ms {row['expected_cost_s'] / base:13.2f}x "
                f"{row['padding_waste']:13.1%}"
            )
        print(f"{'':<17} cost basis: {found['cost_basis']} ({found['seconds']:.1f} s to propose)")
    latency = results["latency"]
    print("\nMeasured on cpu-ort (this CPU, one ONNX Runtime thread), per request through the runtime")
    print(f"  window on the single bucket: {_ms(latency['window_single_bucket'])}")
    print(f"  replay on the old version:   {_ms(latency['replay_old'])}")
    print(f"  replay on the new version:   {_ms(latency['replay_new'])}")
    low, high = latency["paired_ratio_p10_p90"]
    print(
        f"  new / old, paired per request: median {latency['paired_ratio_median']:.2f}x (p10 {low:.2f}x, p90 {high:.2f}x)"
    )
    waste = results["padding_waste_elements"]
    print(
        f"  padded input elements per real one: {waste['window_single']:.1%} on the single bucket, "
        f"{waste['replay_new']:.1%} on the new version (held-out replay)"
    )
    held = results["held_out_expected_cost_cpu_ort"]
    if held:
        print(
            f"  held-out replay, cpu-ort cost model: {held['proposed']['expected_cost_s'] / held['single']['expected_cost_s']:.2f}x "
            f"the single bucket's expected cost, padding waste {held['proposed']['padding_waste']:.1%}"
        )
    print(f"  update() to the new version (verify + load + switch): {results['update_s']:.2f} s")
    print("\nThe runtime's own overhead (bucket choice, padding, cropping, counting) per request")
    for name, row in results["overhead"].items():
        print(
            f"  {name:<24} {row['overhead_us_per_request']:8.1f} µs on {row['backend_ms_per_request']:8.2f} ms of "
            f"ONNX Runtime: {row['share_of_backend']:.3%}"
        )
    rknn = results["rknn"]
    if rknn.get("ran"):
        print(
            f"\nrknn-toolkit2's cycle estimate: {rknn['before_cycles_per_request']:.3g} -> "
            f"{rknn['after_cycles_per_request']:.3g} cycles per request ({rknn['ratio']:.2f}x)"
        )
    else:
        print(f"\nrknn-toolkit2's estimate: not run ({rknn.get('detail')})")


def _ms(row: dict) -> str:
    return f"mean {row['mean_ms']:.1f} ms, p50 {row['p50_ms']:.1f} ms, p90 {row['p90_ms']:.1f} ms"


if __name__ == "__main__":
    raise SystemExit(main())
