"""``python -m bench.graph_work``: Flex-DSA's graph work against onnxsim's whole run, on every model the goal
names: the six bench models and every real export of ``tests/models/real_exports.py``.

Graph work is what ``python -m bench`` prints per stage: every stage of a cold ``cpu-ort`` job with the
user's defaults but the checks (validation, the padding check, the never-slower timing), the kernels the
cost model timed inside the stages, precision and the vendor's toolchain (``bench.run.CHECK_STAGES``).
onnxsim's figure is its whole call (load, simplify, save). Each tool runs in its own subprocess
(``bench.tools``), in interleaved rounds (ours, then onnxsim, per model per round), so that both see the
same machine; the medians decide, and the spread over the rounds says how noisy a figure is.

    python -m bench.graph_work                      # all 18 models, 3 rounds (about 15 min on 2 cores)
    python -m bench.graph_work --models ppocr_det,mobilenetv2 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from bench import RESULTS_DIR
from bench.models import BENCH_MODELS, bench_model
from bench.run import CHECK_STAGES, graph_work
from bench.tools import run_tool
from flexdsa_core.precision.formats import cpu_int8_features


def _model_paths(names: list[str] | None) -> dict[str, Path]:
    from tests.models.real_exports import REAL_EXPORTS

    known = [*BENCH_MODELS, *REAL_EXPORTS]
    chosen = names or known
    unknown = [name for name in chosen if name not in known]
    if unknown:
        raise SystemExit(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(known)}")
    return {
        name: bench_model(name).path if name in BENCH_MODELS else Path(REAL_EXPORTS[name].fetch()) for name in chosen
    }


def measure(path: Path, name: str, rounds: int, timeout_s: float) -> dict:
    """``rounds`` interleaved runs of ours (cold kernel cache, defaults) and onnxsim on ``path``."""
    ours: list[dict] = []
    sim: list[float] = []
    errors: list[str] = []
    info = {"name": name, "heads": None, "hidden": None}
    with tempfile.TemporaryDirectory(prefix="flexdsa-graph-work-") as scratch:
        for index in range(rounds):
            cache = Path(scratch) / f"kernels{index}"  # cold: a new folder each round
            run = run_tool("flexdsa", path, Path(scratch) / "ours.onnx", {**info, "kernel_cache": str(cache)}, timeout_s)
            stages = (run.get("notes") or {}).get("compile_seconds") if run.get("ok") else None
            if stages:
                ours.append(stages)
            else:
                errors.append(f"flexdsa: {str(run.get('error')).splitlines()[0]}")
            run = run_tool("onnxsim", path, Path(scratch) / "sim.onnx", info, timeout_s)
            if run.get("ok"):
                sim.append(float(run["seconds"]))
            else:
                errors.append(f"onnxsim: {str(run.get('error')).splitlines()[0]}")
    work = [graph_work(stages) for stages in ours]
    names = sorted({stage for stages in ours for stage in stages} - CHECK_STAGES)
    return {
        "graph_work_s": work,
        "onnxsim_s": sim,
        "stages_median_s": {s: statistics.median(st.get(s, 0.0) for st in ours) for s in names} if ours else {},
        "ratio": statistics.median(work) / statistics.median(sim) if work and sim else None,
        "errors": errors,
    }


def _spread(values: list[float]) -> str:
    if len(values) < 2:
        return ""
    middle = statistics.median(values)
    return f"±{(max(values) - min(values)) / 2 / middle * 100:.0f}%" if middle else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.graph_work", description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated subset (default: the bench models and every real export)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved runs of each tool per model (default 3)")
    parser.add_argument("--tool-timeout", type=float, default=900, help="seconds one run may take")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "graph_work.json")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.models.split(",") if n.strip()] if args.models else None
    paths = _model_paths(names)
    cpu = cpu_int8_features()
    print(f"CPU vector flags: {', '.join(cpu['flags'])}; {args.rounds} interleaved rounds per model", flush=True)
    results: dict = {"cpu": cpu, "rounds": args.rounds, "models": {}}
    header = f"{'model':24s} {'graph work s':>16s} {'onnxsim s':>14s} {'ratio':>6s}  slowest graph stages (median s)"
    print(header, flush=True)
    for name, path in paths.items():
        found = results["models"][name] = measure(path, name, args.rounds, args.tool_timeout)
        work, sim = found["graph_work_s"], found["onnxsim_s"]
        slowest = sorted(found["stages_median_s"].items(), key=lambda kv: -kv[1])[:3]
        print(
            f"{name:24s} "
            + (f"{statistics.median(work):10.3f} {_spread(work):>5s} " if work else f"{'x':>16s} ")
            + (f"{statistics.median(sim):8.3f} {_spread(sim):>5s} " if sim else f"{'x':>14s} ")
            + (f"{found['ratio']:6.2f}  " if found["ratio"] is not None else f"{'x':>6s}  ")
            + ", ".join(f"{stage} {seconds:.3f}" for stage, seconds in slowest)
            + (f"  ({'; '.join(found['errors'])[:200]})" if found["errors"] else ""),
            flush=True,
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
    within = [n for n, m in results["models"].items() if m["ratio"] is not None and m["ratio"] <= 1.0]
    print(f"\ngraph work <= onnxsim's time: {len(within)} of {len(results['models'])} ({', '.join(within) or 'none'})")
    print(f"Results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
