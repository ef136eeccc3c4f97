"""``python -m bench.scaling``: how Flex-DSA's compile time grows with the size of the graph, 256 to 10k+ nodes.

The models are stacks of one transformer-style block at width 64 (LayerNorm, GELU and the residual Add
written out as the exporters write them: 20 nodes a block, each block with its own weights), sequence
length symbolic, so every block is a candidate for the same fusions. Each is compiled by
``python -m bench.tools flexdsa`` (the user's defaults: validation and the never-slower check on) with an
empty kernel cache, so the figures include measuring every distinct kernel once; identical layers are
measured once in any model, which is what keeps the kernel work flat while the graph grows.

Prints seconds, seconds per 1,000 nodes and the slowest stages per size, and the least-squares slope;
linear growth shows as a flat seconds-per-node column. Writes ``bench/results/scaling.json``.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper, save

from bench import RESULTS_DIR
from bench.tools import run_tool

WIDTH = 64
NODES_PER_BLOCK = 20
SIZES = (256, 1024, 2560, 5120, 10240)


def build_stack(path: Path, nodes: int, seed: int = 0) -> int:
    """Write a stack of ``ceil(nodes / 20)`` blocks to ``path``; returns its node count."""
    rng = np.random.default_rng(seed)
    blocks = -(-nodes // NODES_PER_BLOCK)
    graph_nodes, initializers = [], []

    def constant(name: str, array: np.ndarray) -> str:
        initializers.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    for name, value in (("eps", 1e-5), ("two", 2.0), ("half", 0.5), ("one", 1.0), ("sqrt2", 2**0.5)):
        constant(name, np.array(value))
    x = "x"
    for b in range(blocks):
        p = f"b{b}_"
        gamma = constant(p + "gamma", rng.uniform(0.5, 1.5, WIDTH))
        beta = constant(p + "beta", rng.standard_normal(WIDTH) * 0.1)
        w1 = constant(p + "w1", rng.standard_normal((WIDTH, WIDTH)) / WIDTH**0.5)
        b1 = constant(p + "b1", rng.standard_normal(WIDTH) * 0.1)
        w2 = constant(p + "w2", rng.standard_normal((WIDTH, WIDTH)) / WIDTH**0.5)
        b2 = constant(p + "b2", rng.standard_normal(WIDTH) * 0.1)
        step = [
            # LayerNorm as exported (9 nodes)
            ("ReduceMean", [x], "mean"), ("Sub", [x, p + "mean"], "centred"),
            ("Pow", [p + "centred", "two"], "square"), ("ReduceMean", [p + "square"], "var"),
            ("Add", [p + "var", "eps"], "var_eps"), ("Sqrt", [p + "var_eps"], "std"),
            ("Div", [p + "centred", p + "std"], "normed"), ("Mul", [p + "normed", gamma], "scaled"),
            ("Add", [p + "scaled", beta], "ln"),
            # Linear + erf GELU + Linear + residual (11 nodes)
            ("MatMul", [p + "ln", w1], "mm1"), ("Add", [p + "mm1", b1], "h"),
            ("Div", [p + "h", "sqrt2"], "hs"), ("Erf", [p + "hs"], "erf"), ("Add", [p + "erf", "one"], "erf1"),
            ("Mul", [p + "h", p + "erf1"], "he"), ("Mul", [p + "he", "half"], "gelu"),
            ("MatMul", [p + "gelu", w2], "mm2"), ("Add", [p + "mm2", b2], "o"),
            ("Add", [x, p + "o"], "res"), ("Identity", [p + "res"], "out"),
        ]  # fmt: skip
        for op, inputs, output in step:
            attrs = {"axes": [-1], "keepdims": 1} if op == "ReduceMean" else {}  # opset 17: axes attribute
            graph_nodes.append(helper.make_node(op, inputs, [p + output], name=p + output, **attrs))
        x = p + "out"
    graph = helper.make_graph(
        graph_nodes,
        "stack",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", WIDTH])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", "seq", WIDTH])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    save(model, str(path))
    return len(graph_nodes)


def series(sizes: tuple[int, ...] = SIZES, timeout_s: float = 1800) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="flexdsa-scaling-") as folder:
        for size in sizes:
            src, dst = Path(folder) / f"stack{size}.onnx", Path(folder) / f"stack{size}.out.onnx"
            nodes = build_stack(src, size)
            cache = tempfile.mkdtemp(prefix="kernel-cache-", dir=folder)  # cold: measured afresh
            result = run_tool("flexdsa", src, dst, {"name": f"stack{size}", "kernel_cache": cache}, timeout_s)
            row = {"nodes": nodes, "ok": bool(result.get("ok")), "seconds": result.get("seconds")}
            if result.get("ok"):
                stages = (result.get("notes") or {}).get("compile_seconds") or {}
                row["stages"] = stages
                row["ms_per_node"] = 1e3 * row["seconds"] / nodes
                ranked = sorted(stages.items(), key=lambda kv: -kv[1])[:3]
                slowest = ", ".join(f"{k} {v:.1f}" for k, v in ranked)
                print(
                    f"  {nodes:6d} nodes  {row['seconds']:7.2f} s  {row['ms_per_node']:6.2f} ms/node  ({slowest})",
                    flush=True,
                )
            else:
                row["error"] = result.get("error")
                print(f"  {nodes:6d} nodes  FAILED: {row['error']}", flush=True)
            rows.append(row)
    done = [r for r in rows if r["ok"]]
    if len(done) >= 2:
        xs, ys = np.array([r["nodes"] for r in done], float), np.array([r["seconds"] for r in done], float)
        slope, intercept = np.polyfit(xs, ys, 1)
        fitted = slope * xs + intercept
        r2 = 1 - ((ys - fitted) ** 2).sum() / max(((ys - ys.mean()) ** 2).sum(), 1e-12)
        print(
            f"  least squares: {slope * 1e3:.2f} ms per node + {intercept:.2f} s (R^2 {r2:.3f}); "
            f"seconds per node, largest / smallest: {done[-1]['ms_per_node'] / done[0]['ms_per_node']:.2f}",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="node counts, comma-separated")
    args = parser.parse_args(argv)
    sizes = tuple(int(s) for s in args.sizes.split(","))
    print(f"Compile time vs graph size (Flex-DSA, cpu-ort defaults, cold kernel cache): {sizes}", flush=True)
    rows = series(sizes)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "scaling.json").write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
