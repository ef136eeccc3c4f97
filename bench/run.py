"""``python -m bench``: Flex-DSA against onnxsim, onnxslim, onnxoptimizer and ONNX Runtime's own
optimisers on six real architectures at realistic widths, in one run (see bench/README.md).

Per model: every tool optimises the same cached ONNX file (each in a subprocess, timed); then every
output, the original and an A/A copy of the original are loaded at ORT_DISABLE_ALL and ORT_ENABLE_ALL
and timed round-robin (``bench/measure.py``). Tables go to stdout, everything to
``bench/results/latest.json`` (rewritten after each model, so a crash keeps what was measured).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from bench import RESULTS_DIR
from bench.measure import (
    LEVELS,
    Timed,
    count_flops,
    make_inputs,
    paired_ratio,
    round_robin,
    session,
    sgemm_peak,
    sgemm_session,
    spread,
)
from bench.models import BENCH_MODELS, QUICK_MODELS, bench_model
from bench.tools import TOOLS, applies, run_tool
from flexdsa_core.compilation import KERNEL_TIMING

OURS = "flexdsa"
ORIGINAL = "original"
CONTROL = "original (A/A)"  # a second session of the unchanged original: the noise floor
NOISE = 0.03  # ratio differences under 3 % are noise
MISMATCH_REL = 1e-3  # relative output difference above which a variant is flagged as wrong
TARGET_GEOMEAN = 0.97
SIMPLIFIERS = ("onnxsim", "onnxslim", "onnxoptimizer")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description="Flex-DSA vs peer ONNX optimisers.")
    parser.add_argument(
        "--quick", action="store_true", help=f"models {','.join(QUICK_MODELS)}, 10 rounds, 2 warm-up runs"
    )
    parser.add_argument("--models", help=f"comma-separated subset of {','.join(BENCH_MODELS)}")
    parser.add_argument("--tools", help=f"comma-separated subset of {','.join(TOOLS)}")
    parser.add_argument("--rounds", type=int, help="timed rounds per model (default 20; --quick 10)")
    parser.add_argument("--warmup", type=int, help="untimed runs per session first (default 3; --quick 2)")
    parser.add_argument(
        "--tool-timeout", type=float, default=1800, help="seconds one tool may take on one model"
    )
    parser.add_argument(
        "--rebuild", action="store_true", help="rebuild the cached bench models (needs torch)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "latest.json")
    parser.add_argument(
        "--no-scaling",
        action="store_true",
        help="skip the compile-time series over graph sizes 256 to 10k+ nodes (bench/scaling.py)",
    )
    parser.add_argument(
        "--precision",
        action="store_true",
        help="then the int8 and mixed columns beside ONNX Runtime's quantize_dynamic/quantize_static on the same "
        "models (bench/precision.py; minutes per model)",
    )
    parser.add_argument(
        "--exports",
        action="store_true",
        help="then every real export on every target: success, time, peak RSS against the model's size "
        "(bench/exports.py)",
    )
    args = parser.parse_args(argv)
    args.models = _subset(parser, args.models, BENCH_MODELS, QUICK_MODELS if args.quick else BENCH_MODELS)
    args.tools = _subset(parser, args.tools, TOOLS, tuple(TOOLS))
    args.rounds = args.rounds or (10 if args.quick else 20)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 3)
    return args


def _subset(parser, text: str | None, known, default) -> list[str]:
    if not text:
        return list(default)
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in known]
    if unknown:
        parser.error(f"unknown {', '.join(unknown)}; known: {', '.join(known)}")
    return names


# ---------------------------------------------------------------------------------------------------
# One model
# ---------------------------------------------------------------------------------------------------


def optimise_all(model, tools: list[str], timeout_s: float) -> dict[str, dict]:
    """Run every applicable tool on the model; returns tool -> {ok, seconds, nodes, path | error}."""
    out_dir = RESULTS_DIR / "outputs" / model.name
    out_dir.mkdir(parents=True, exist_ok=True)
    info = {"name": model.name, "heads": model.heads, "hidden": model.hidden}
    results = {}
    for tool in tools:
        if not applies(tool, model.name):
            continue
        dst = out_dir / f"{tool}.onnx"
        if tool == OURS:
            result = compile_times(model, dst, info, timeout_s)
        else:
            result = run_tool(tool, model.path, dst, info, timeout_s)
        if result.get("ok"):
            result["path"] = str(dst)
            result["nodes"] = _node_count(dst)
            stages = (result.get("notes") or {}).get("compile_seconds") or {}
            slowest = ", ".join(f"{k} {v:.1f}" for k, v in sorted(stages.items(), key=lambda kv: -kv[1])[:4])
            print(
                f"  {tool:17s} {result['nodes']:5d} nodes  {result['seconds']:8.2f} s"
                + (f"  (slowest stages, s: {slowest})" if slowest else ""),
                flush=True,
            )
        elif result.get("unavailable"):
            print(
                f"  {tool:17s} unavailable here ({result.get('error')}); going on with the others", flush=True
            )
        else:
            print(f"  {tool:17s} FAILED: {result.get('error')}", flush=True)
        results[tool] = result
    return results


# Flex-DSA's compile time, four ways: a cold and then a warm kernel cache (the same folder again), with the
# user's defaults (the output the bench times) and without the never-slower latency check (a user option).
COMPILE_VARIANTS = {
    "cold": {},
    "warm": {},
    "cold_without_latency_check": {"measure_latency": False},
    "warm_without_latency_check": {"measure_latency": False},
}


def compile_times(model, dst: Path, info: dict, timeout_s: float) -> dict:
    """Run Flex-DSA cold (an empty kernel cache) with the defaults, writing ``dst``, then the other
    ``COMPILE_VARIANTS``; the cold default run's result, with ``compile`` holding every variant's seconds
    and output hash (a warm run that decides differently from the cold one shows as a different hash)."""
    result, compile_record = {}, {}
    with tempfile.TemporaryDirectory(prefix="flexdsa-bench-kernel-cache-") as caches:
        for variant, options in COMPILE_VARIANTS.items():
            cache = Path(caches) / variant.removeprefix("cold").removeprefix("warm").strip("_")  # warm: cold's
            target = dst if variant == "cold" else dst.with_suffix(f".{variant}.onnx")
            run_info = {**info, "kernel_cache": str(cache), "flexdsa_options": options}
            run = run_tool(OURS, model.path, target, run_info, timeout_s)
            if variant == "cold":
                result = run
            compile_record[variant] = {
                "ok": bool(run.get("ok")),
                "seconds": run.get("seconds"),
                "stages": (run.get("notes") or {}).get("compile_seconds"),
                "sha256": hashlib.sha256(target.read_bytes()).hexdigest()[:16] if run.get("ok") else None,
            }
    result["compile"] = compile_record
    return result


def _node_count(path: Path) -> int:
    return len(onnx.load(str(path), load_external_data=False).graph.node)


def _relative_difference(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape:
            return math.inf
        scale = float(np.abs(w).max()) or 1.0
        worst = max(worst, float(np.abs(g.astype(np.float64) - w).max()) / scale)
    return worst


def time_variants(model, variant_paths: dict[str, str], rounds: int, warmup: int) -> dict:
    """Create a session per (variant, level), check outputs against the original, time them
    round-robin. Returns variant -> level -> stats, plus session errors."""
    timed: list[Timed] = []
    errors: dict[str, str] = {}
    reference = None
    mismatch: dict[str, float] = {}
    for variant, path in variant_paths.items():
        for level in LEVELS:
            key = f"{variant}@{level}"
            try:
                sess = session(path, level)
                feeds = make_inputs(sess, model.dims)
                outputs = sess.run(None, feeds)
            except Exception as error:  # noqa: BLE001 - a tool's output that ORT refuses is a result
                errors[key] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
                print(f"  {key}: session failed: {errors[key]}", flush=True)
                continue
            if reference is None:
                reference = outputs  # original at ORT_DISABLE_ALL: the graph as exported
            mismatch[key] = _relative_difference(outputs, reference)
            timed.append(Timed(key, sess, feeds))
    # The SGEMM peak runs in the same rounds, so it sees the same machine load as the model.
    sgemm, sgemm_feeds, sgemm_flops = sgemm_session()
    timed.append(Timed("sgemm", sgemm, sgemm_feeds))
    print(f"  timing {len(timed)} sessions x {rounds} rounds ...", flush=True)
    round_robin(timed, rounds, warmup, progress=_progress)
    by_key = {t.key: t for t in timed}
    sgemm_gflops = sgemm_flops / min(by_key["sgemm"].times) / 1e9  # a peak: the fastest round
    stats: dict[str, dict] = {}
    for variant in variant_paths:
        for level in LEVELS:
            key = f"{variant}@{level}"
            if key not in by_key:
                continue
            times = by_key[key].times
            reference_times = by_key.get(f"{ORIGINAL}@{level}")
            entry = {
                "median_ms": statistics.median(times) * 1e3,
                "iqr_rel": spread(times),
                "max_rel_diff": mismatch[key],
                "ratio": paired_ratio(times, reference_times.times) if reference_times else None,
                # Contention only ever adds time, so fastest-vs-fastest is a second, load-robust view.
                "ratio_of_min": min(times) / min(reference_times.times) if reference_times else None,
                "min_ms": min(times) * 1e3,
            }
            if level == "disable_all" and f"{ORIGINAL}@enable_all" in by_key:
                entry["ratio_vs_original_enable_all"] = paired_ratio(
                    times, by_key[f"{ORIGINAL}@enable_all"].times
                )
            stats.setdefault(variant, {})[level] = entry
    del timed, by_key
    gc.collect()
    return {"latency": stats, "session_errors": errors, "sgemm_gflops": sgemm_gflops}


def _progress(done: int, total: int) -> None:
    if done == total or done % 5 == 0:
        print(f"    round {done}/{total}", flush=True)


def bench_one(name: str, args) -> dict:
    model = bench_model(name, rebuild=args.rebuild)
    print(f"\n== {name}: {model.path.name}, dims {model.dims}", flush=True)
    flops, unknown = count_flops(str(model.path), model.dims)
    record = {
        "path": str(model.path),
        "config": model.config,
        "dims": model.dims,
        "size_mb": model.path.stat().st_size / 2**20,
        "nodes": _node_count(model.path),
        "gflop": flops / 1e9,
        "flop_nodes_without_shape": unknown,
    }
    record["tools"] = optimise_all(model, args.tools, args.tool_timeout)
    variant_paths = {ORIGINAL: str(model.path), CONTROL: str(model.path)}
    variant_paths.update({tool: r["path"] for tool, r in record["tools"].items() if r.get("ok")})
    record.update(time_variants(model, variant_paths, args.rounds, args.warmup))
    for levels in record["latency"].values():
        for entry in levels.values():
            entry["gflops"] = flops / 1e9 / (entry["median_ms"] / 1e3) if flops else None
    return record


# ---------------------------------------------------------------------------------------------------
# Summary: tables, geometric means, targets
# ---------------------------------------------------------------------------------------------------


def _geomean(values: list[float]) -> float | None:
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def summarise(models: dict[str, dict], tools: list[str]) -> dict:
    variants = [CONTROL, *tools]
    geomean = {}
    for level in LEVELS:
        geomean[level] = {
            variant: _geomean(
                [m["latency"].get(variant, {}).get(level, {}).get("ratio") for m in models.values()]
            )
            for variant in variants
        }
    geomean["disable_all_vs_original_enable_all"] = {
        variant: _geomean(
            [
                m["latency"].get(variant, {}).get("disable_all", {}).get("ratio_vs_original_enable_all")
                for m in models.values()
            ]
        )
        for variant in variants
    }
    return {"geomean": geomean, "targets": check_targets(models, geomean)}


def check_targets(models: dict[str, dict], geomean: dict) -> dict[str, dict]:
    """The README's five targets for our output; differences under NOISE count as met."""
    checks: dict[str, dict] = {}

    def add(target: str, ok: bool | None, detail: str) -> None:
        entry = checks.setdefault(target, {"met": True, "details": []})
        if ok is None:
            entry["details"].append(f"n/a {detail}")
            return
        entry["met"] = entry["met"] and ok
        entry["details"].append(("ok  " if ok else "MISS ") + detail)

    for name, m in models.items():
        ours = m["latency"].get(OURS)
        tool = m["tools"].get(OURS, {})
        if not ours:
            add("never slower than original (same ORT level)", None, f"{name}: no Flex-DSA output")
            continue
        for level in LEVELS:
            ratio = ours.get(level, {}).get("ratio")
            add(
                "never slower than original (same ORT level)",
                ratio is not None and ratio <= 1 + NOISE,
                f"{name} @{level}: {_fmt(ratio)}x",
            )
        cross = ours.get("disable_all", {}).get("ratio_vs_original_enable_all")
        add(
            "ours @DISABLE_ALL <= original @ENABLE_ALL",
            cross is not None and cross <= 1 + NOISE,
            f"{name}: {_fmt(cross)}x",
        )
        peers = [m["tools"][t]["nodes"] for t in SIMPLIFIERS if m["tools"].get(t, {}).get("ok")]
        if peers:
            add(
                "nodes <= fewest of onnxsim/onnxslim/onnxoptimizer",
                tool["nodes"] <= min(peers),
                f"{name}: {tool['nodes']} vs {min(peers)}",
            )
        sim = m["tools"].get("onnxsim", {})
        compiled = tool.get("compile", {})
        if sim.get("ok") and compiled.get("cold", {}).get("ok"):
            cold = compiled["cold"]["seconds"]
            add("compile time, cold kernel cache < onnxsim's", cold < sim["seconds"],
                f"{name}: {cold:.2f} s vs onnxsim {sim['seconds']:.2f} s")  # fmt: skip
        if sim.get("ok") and compiled.get("warm", {}).get("ok"):
            warm = compiled["warm"]["seconds"]
            add("compile time, warm kernel cache <= 1/3 of onnxsim's", warm <= sim["seconds"] / 3,
                f"{name}: {warm:.2f} s vs onnxsim {sim['seconds']:.2f} s")  # fmt: skip
    ours_geomean = geomean["enable_all"].get(OURS)
    add(
        f"geomean @ENABLE_ALL <= {TARGET_GEOMEAN}x",
        ours_geomean is not None and ours_geomean <= TARGET_GEOMEAN,
        f"{_fmt(ours_geomean)}x",
    )
    return checks


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return "inf"
    return f"{value:.{digits}f}"


def _table(title: str, header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]

    def line(row: list) -> str:  # first column left-aligned, numbers right-aligned
        cells = zip(row, widths, strict=True)
        return "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(cells))

    return "\n".join([f"\n{title}", line(header), line(["-" * w for w in widths]), *map(line, rows)])


def _compile_table(models: dict[str, dict]) -> str:
    rows = []
    for name, m in models.items():
        compiled = m["tools"].get(OURS, {}).get("compile", {})
        sim = m["tools"].get("onnxsim", {})
        sim_s = sim.get("seconds") if sim.get("ok") else None
        seconds = {v: (compiled.get(v) or {}).get("seconds") for v in COMPILE_VARIANTS}
        hashes = {(compiled.get(v) or {}).get("sha256") for v in ("cold", "warm")}
        # The output check every compile must make (original and output run in ONNX Runtime and compared),
        # alone, in the warm run: where it exceeds a third of onnxsim's time the warm target cannot be met
        # while outputs are validated.
        validate = ((compiled.get("warm") or {}).get("stages") or {}).get("validate")
        rows.append(
            [
                name,
                *[_fmt(seconds[v]) for v in COMPILE_VARIANTS],
                _fmt(sim_s),
                _fmt(seconds["cold"] / sim_s if seconds["cold"] and sim_s else None),
                _fmt(seconds["warm"] / sim_s if seconds["warm"] and sim_s else None),
                _fmt(validate, 3),
                _fmt(validate / sim_s if validate and sim_s else None),
                "same" if len(hashes) == 1 and None not in hashes else "differs",
            ]
        )
    return _table(
        "Flex-DSA compile time, seconds: cold / warm kernel cache, with the defaults (never-slower latency check "
        "on) and without that check; onnxsim; the output validation alone in the warm run (its share of "
        "onnxsim's time: above 0.33 the warm target is out of reach while outputs are validated); cold and "
        "warm output bytes",
        ["model", "cold", "warm", "cold, no check", "warm, no check", "onnxsim", "cold/sim", "warm/sim",
         "warm validate", "validate/sim", "output"],  # fmt: skip
        rows,
    )


# Stages that are not graph work: checking the output (validation, padding, the never-slower timing), the
# kernels the cost model timed inside the stages (``KERNEL_TIMING``: the Fusion Switcher's paired timings), the
# precision search and the vendor's own compiler. What is left is what onnxsim's total compares with.
CHECK_STAGES = frozenset({"validate", "padding_check", "measure", KERNEL_TIMING, "precision", "toolchain"})


def graph_work(stages: dict[str, float]) -> float:
    """The seconds of ``stages`` (a job's ``compile_seconds``) that are graph work: all but ``CHECK_STAGES``."""
    return sum(seconds for stage, seconds in stages.items() if stage not in CHECK_STAGES)


def _stage_table(models: dict[str, dict]) -> str:
    """Per model, the cold run's seconds per stage (the report's ``compile_seconds``), their graph-work sum
    and onnxsim's total beside it."""
    stages: list[str] = []
    for m in models.values():
        for stage in ((m["tools"].get(OURS, {}).get("compile", {}).get("cold") or {}).get("stages") or {}):
            if stage not in stages:
                stages.append(stage)
    rows = []
    for name, m in models.items():
        found = (m["tools"].get(OURS, {}).get("compile", {}).get("cold") or {}).get("stages") or {}
        sim = m["tools"].get("onnxsim", {})
        sim_s = sim.get("seconds") if sim.get("ok") else None
        work = graph_work(found) if found else None
        rows.append([name, *[_fmt(found.get(stage), 3) for stage in stages], _fmt(work, 3), _fmt(sim_s),
                     _fmt(work / sim_s if work is not None and sim_s else None)])  # fmt: skip
    return _table(
        "Flex-DSA seconds per stage, cold kernel cache (defaults); graph work = every stage but "
        f"{', '.join(sorted(CHECK_STAGES))}; beside onnxsim's total",
        ["model", *stages, "graph work", "onnxsim", "graph/sim"],
        rows,
    )


def print_report(report: dict) -> None:
    models, tools = report["models"], report["meta"]["tools"]
    variants = [CONTROL, *tools]
    out = []
    out.append(
        _table(
            "Node count (original -> each tool's output)",
            ["model", ORIGINAL, *tools],
            [
                [
                    name,
                    m["nodes"],
                    *[m["tools"].get(t, {}).get("nodes", "x" if t in m["tools"] else "-") for t in tools],
                ]
                for name, m in models.items()
            ],
        )
    )
    out.append(
        _table(
            "Optimisation time, seconds (load + optimise + save)",
            ["model", *tools],
            [
                [
                    name,
                    *[
                        _fmt(m["tools"][t]["seconds"])
                        if m["tools"].get(t, {}).get("ok")
                        else ("x" if t in m["tools"] else "-")
                        for t in tools
                    ],
                ]
                for name, m in models.items()
            ],
        )
    )
    out.append(_compile_table(models))
    out.append(_stage_table(models))
    for level in LEVELS:
        rows = []
        for name, m in models.items():
            original = m["latency"].get(ORIGINAL, {}).get(level, {})
            row = [name, _fmt(original.get("median_ms"), 1)]
            for variant in variants:
                entry = m["latency"].get(variant, {}).get(level)
                flag = "!" if entry and entry["max_rel_diff"] > MISMATCH_REL else ""
                row.append(_fmt(entry["ratio"]) + flag if entry else "-")
            rows.append(row)
        rows.append(["geomean", "", *[_fmt(report["geomean"][level].get(v)) for v in variants]])
        out.append(
            _table(
                f"Latency at ORT_{level.upper()}: original median ms, then ratio to original at the same level",
                ["model", "orig ms", *variants],
                rows,
            )
        )
    rows = [
        [
            name,
            *[
                _fmt(m["latency"].get(v, {}).get("disable_all", {}).get("ratio_vs_original_enable_all"))
                for v in variants
            ],
        ]
        for name, m in models.items()
    ]
    rows.append(
        ["geomean", *[_fmt(report["geomean"]["disable_all_vs_original_enable_all"].get(v)) for v in variants]]
    )
    out.append(
        _table(
            "Each output at ORT_DISABLE_ALL, as a ratio to the original at ORT_ENABLE_ALL",
            ["model", *variants],
            rows,
        )
    )
    rows = []
    for name, m in models.items():
        original = m["latency"].get(ORIGINAL, {}).get("enable_all", {})
        ours = m["latency"].get(OURS, {}).get("enable_all", {})
        best = max(original.get("gflops") or 0, ours.get("gflops") or 0)
        rows.append(
            [
                name,
                _fmt(m["gflop"]),
                _fmt(original.get("gflops"), 1),
                _fmt(ours.get("gflops"), 1),
                _fmt(m["sgemm_gflops"], 1),
                _fmt(100 * best / m["sgemm_gflops"], 0) + " %",
            ]
        )
    out.append(
        _table(
            "Achieved GFLOP/s at ORT_ENABLE_ALL (MatMul/Gemm/Conv FLOPs / median latency) vs the "
            "single-thread SGEMM peak timed in the same rounds",
            ["model", "GFLOP", "original", OURS, "SGEMM peak", "best/peak"],
            rows,
        )
    )
    noisy = [
        f"{name} {v}@{lvl}"
        for name, m in models.items()
        for v, lv in m["latency"].items()
        for lvl, e in lv.items()
        if e["max_rel_diff"] > MISMATCH_REL
    ]
    out.append(
        f"\nRatios: < 1 is faster. Differences under {NOISE:.0%} are noise; the A/A column shows this run's noise."
        f"\n'!' = outputs differ from the original by more than {MISMATCH_REL:g} (relative): "
        + (", ".join(noisy) or "none")
    )
    out.append("\nTargets (Flex-DSA):")
    for target, check in report["targets"].items():
        out.append(f"  [{'met ' if check['met'] else 'MISS'}] {target}")
        out.extend(f"         {detail}" for detail in check["details"])
    print("\n".join(out), flush=True)


# ---------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    peak = sgemm_peak()
    print(
        f"ONNX Runtime {ort.__version__}, {os.cpu_count()} CPUs, 1 intra-op thread; "
        f"SGEMM 1024^3 peak {peak['gflops']:.1f} GFLOP/s; {args.rounds} rounds, {args.warmup} warm-up",
        flush=True,
    )
    report = {
        "meta": {
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "onnxruntime": ort.__version__,
            "onnx": onnx.__version__,
            "tools": args.tools,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "noise_threshold": NOISE,
            "sgemm_peak": peak,
            "sgemm_peak_gflops": peak["gflops"],
        },
        "models": {},
    }
    for name in args.models:
        report["models"][name] = bench_one(name, args)
        report.update(summarise(report["models"], args.tools))
        args.out.write_text(json.dumps(report, indent=1, default=str))
    peak_after = sgemm_peak()
    report["meta"]["sgemm_peak_after"] = peak_after
    report["meta"]["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    args.out.write_text(json.dumps(report, indent=1, default=str))
    print_report(report)
    print(f"\nSGEMM peak at the end: {peak_after['gflops']:.1f} GFLOP/s.  Results: {args.out}")
    if not args.no_scaling and OURS in args.tools:
        from bench.scaling import SIZES, series

        print(f"\nFlex-DSA compile time vs graph size (defaults, cold kernel cache; bench/scaling.py): {SIZES}",
              flush=True)  # fmt: skip
        report["scaling"] = series()
        args.out.write_text(json.dumps(report, indent=1, default=str))
    if args.precision:
        from bench.precision import main as precision_main

        precision_args = ["--models", ",".join(args.models), "--rounds", str(args.rounds), "--warmup", str(args.warmup)]
        report["precision"] = precision_main(precision_args)
    if args.exports:
        from bench.exports import main as exports_main

        print("\nReal exports on every target (bench/exports.py):", flush=True)
        report["exports"] = exports_main([])
    return report


if __name__ == "__main__":
    main()
