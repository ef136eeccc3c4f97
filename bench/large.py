"""``python -m bench.large``: peak memory of ``flexdsa optimize`` on a model larger than protobuf's 2 GB.

The model is an MLP stack (MatMul + Add + Relu and Gemm + Relu layers, alternating) of width 4096 with
about 2.2 GB of fp32 weights in one external-data file. The weights are generated and written one row
block at a time, so building the model never holds more than a few MB of them.

The optimiser runs as ``python -m flexdsa_core.cli optimize MODEL --target cpu-ort -o OUT`` in a
subprocess; its peak resident memory is the larger of (a) the process tree's summed RSS sampled every
20 ms with psutil and (b) the kernel's ``ru_maxrss`` for the child. The figure of merit is
peak RSS / model size: an optimiser that streams weights stays well under 1; one that loads the model
the naive way (``onnx.load``, measured as a reference) is above 1.

Writes ``bench/results/large.json``. Arguments after ``--`` are passed to ``flexdsa optimize``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
from onnx import TensorProto, helper

from bench import REPO_ROOT, RESULTS_DIR

LARGE_DIR = RESULTS_DIR / "large"
ROW_BLOCK = 256  # weight rows generated and written at a time: 256 x 4096 x 4 B = 4 MiB
ALIGN = 1 << 16  # external-data offsets aligned so ONNX Runtime can memory-map them


# ---------------------------------------------------------------------------------------------------
# The model
# ---------------------------------------------------------------------------------------------------


def _external(name: str, shape: list[int], location: str, offset: int, length: int) -> TensorProto:
    tensor = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=shape)
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    return tensor


def build_large_model(path: Path, size_gb: float, width: int, seed: int = 0) -> dict:
    """Write ``path`` and ``path.data``: ceil(size_gb / layer size) layers of ``width`` x ``width``."""
    layers = math.ceil(size_gb * 1e9 / (width * width * 4))
    data_path = path.with_name(path.name + ".data")
    rng = np.random.default_rng(seed)
    scale = np.float32(1.0 / math.sqrt(width))
    initializers, nodes = [], []
    current = "x"
    with open(data_path, "wb") as data:
        for index in range(layers):
            weight_name, bias_name = f"layer{index}.weight", f"layer{index}.bias"
            for name, rows in ((weight_name, width), (bias_name, 1)):
                offset = data.tell()
                padding = -offset % ALIGN
                data.write(b"\0" * padding)
                offset += padding
                for start in range(0, rows, ROW_BLOCK):
                    block = (
                        rng.standard_normal((min(ROW_BLOCK, rows - start), width), dtype=np.float32) * scale
                    )
                    data.write(block.tobytes())
                shape = [width, width] if rows == width else [width]
                initializers.append(_external(name, shape, data_path.name, offset, rows * width * 4))
            hidden = f"hidden{index}"
            if index % 2 == 0:  # MatMul + Add: what a MatMul+Add -> Gemm fusion rewrites
                nodes.append(helper.make_node("MatMul", [current, weight_name], [f"matmul{index}"]))
                nodes.append(helper.make_node("Add", [f"matmul{index}", bias_name], [f"pre{index}"]))
            else:
                nodes.append(helper.make_node("Gemm", [current, weight_name, bias_name], [f"pre{index}"]))
            nodes.append(helper.make_node("Relu", [f"pre{index}"], [hidden]))
            current = hidden
    nodes.append(helper.make_node("Identity", [current], ["y"]))
    graph = helper.make_graph(
        nodes,
        "large_mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", width])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path.write_bytes(model.SerializeToString())
    return {"layers": layers, "width": width, "bytes": path.stat().st_size + data_path.stat().st_size}


# ---------------------------------------------------------------------------------------------------
# Peak memory of a subprocess
# ---------------------------------------------------------------------------------------------------


def run_measured(
    command: list[str], log_path: Path, timeout_s: float, max_rss_bytes: float = math.inf
) -> dict:
    """Run ``command``; returns exit code, wall seconds and peak RSS (bytes) of its process tree. The tree
    is killed past ``timeout_s`` or once it holds more than ``max_rss_bytes`` (this machine is shared)."""
    start = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    root = psutil.Process(proc.pid)
    peak_tree = 0
    timed_out = over_memory = False
    while True:
        try:
            if root.status() == psutil.STATUS_ZOMBIE:
                break
            tree = [root, *root.children(recursive=True)]
            rss = 0
            for member in tree:
                try:
                    rss += member.memory_info().rss
                except psutil.Error:
                    pass
            peak_tree = max(peak_tree, rss)
        except psutil.NoSuchProcess:
            break
        timed_out = time.perf_counter() - start > timeout_s
        over_memory = peak_tree > max_rss_bytes
        if timed_out or over_memory:
            for member in reversed(tree):
                try:
                    member.kill()
                except psutil.Error:
                    pass
            break
        time.sleep(0.02)
    # wait4 reaps this child and gives its own rusage (ru_maxrss in KiB on Linux). Linux starts a child's
    # ru_maxrss at this process's own high-water mark (exec folds the mm it replaces, which a vfork'd child
    # shares with us, into the child's figure): a parent that ever held 2 GiB gives every later child a
    # ru_maxrss of at least 2 GiB. The kernel's figure counts only where it exceeds ours.
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    kernel = usage.ru_maxrss * 1024
    ours = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    trusted = kernel if kernel > ours else 0
    return {
        "exit_code": proc.returncode,
        "timed_out": timed_out,
        "killed_over_memory": over_memory,
        "seconds": time.perf_counter() - start,
        "peak_rss_bytes": max(peak_tree, trusted),
        "peak_rss_sampled_bytes": peak_tree,
        "ru_maxrss_bytes": kernel,
        "ru_maxrss_counted": bool(trusted),
    }


def _tail(path: Path, lines: int = 8) -> str:
    text = path.read_text(errors="replace").strip().splitlines()
    return "\n".join(text[-lines:])


# ---------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m bench.large", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size-gb", type=float, default=2.2, help="weight bytes to generate, in GB (default 2.2)"
    )
    parser.add_argument("--width", type=int, default=4096)
    parser.add_argument("--target", default="cpu-ort")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds flexdsa optimize may take")
    parser.add_argument(
        "--max-rss-gb",
        type=float,
        default=round(psutil.virtual_memory().total * 0.6 / 1e9, 1),
        help="kill flexdsa optimize once it holds more than this (default 60%% of this machine's memory)",
    )
    parser.add_argument(
        "--no-reference", action="store_true", help="skip the onnx.load reference measurement"
    )
    parser.add_argument(
        "--keep-output", action="store_true", help="keep the optimised package (it is as large as the model)"
    )
    args = parser.parse_args(argv)

    LARGE_DIR.mkdir(parents=True, exist_ok=True)
    model_path = LARGE_DIR / f"mlp-{args.size_gb:g}gb-w{args.width}.onnx"
    meta_path = model_path.with_suffix(".json")
    if not meta_path.is_file():
        print(f"writing {model_path.relative_to(REPO_ROOT)} (+ .data) ...", flush=True)
        started = time.perf_counter()
        meta = build_large_model(model_path, args.size_gb, args.width)
        meta_path.write_text(json.dumps(meta))
        print(
            f"  {meta['layers']} layers, {meta['bytes'] / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s",
            flush=True,
        )
    meta = json.loads(meta_path.read_text())
    model_bytes = meta["bytes"]
    result: dict = {"model": str(model_path), "model_bytes": model_bytes, **meta}

    if not args.no_reference:
        # What loading it the naive way costs: the whole model in memory, protobuf and all.
        reference = run_measured(
            [sys.executable, "-c", "import onnx, sys; onnx.load(sys.argv[1])", str(model_path)],
            LARGE_DIR / "reference.log",
            args.timeout,
        )
        result["reference_onnx_load"] = reference
        print(
            f"reference onnx.load: peak RSS {reference['peak_rss_bytes'] / 1e9:.2f} GB "
            f"= {reference['peak_rss_bytes'] / model_bytes:.2f}x the model",
            flush=True,
        )

    out_dir = LARGE_DIR / "out"
    shutil.rmtree(out_dir, ignore_errors=True)
    command = [
        sys.executable,
        "-m",
        "flexdsa_core.cli",
        "optimize",
        str(model_path),
        "--target",
        args.target,
        "-o",
        str(out_dir),
        *extra,
    ]
    print("running: flexdsa optimize " + " ".join(command[4:]), flush=True)
    log_path = LARGE_DIR / "optimize.log"
    run = run_measured(command, log_path, args.timeout, args.max_rss_gb * 1e9)
    result["flexdsa_optimize"] = {**run, "command": command[3:], "log_tail": _tail(log_path)}
    status = 0
    log = log_path.read_text(errors="replace")
    if run["exit_code"] != 0 and ("No such command" in log or "No module named" in log):
        result["flexdsa_optimize"]["status"] = "unavailable"
        print(f"flexdsa optimize is not available yet:\n{_tail(log_path)}")
    else:
        ok = run["exit_code"] == 0 and not run["timed_out"]
        result["flexdsa_optimize"]["status"] = "ok" if ok else "failed"
        result["peak_rss_over_model_size"] = run["peak_rss_bytes"] / model_bytes
        killed = " (timed out)" if run["timed_out"] else ""
        if run["killed_over_memory"]:
            killed += f" (killed past --max-rss-gb {args.max_rss_gb:g}: the peak is a lower bound)"
        print(
            f"flexdsa optimize: exit {run['exit_code']}{killed}, "
            f"{run['seconds']:.1f} s, peak RSS {run['peak_rss_bytes'] / 1e9:.2f} GB; "
            f"model {model_bytes / 1e9:.2f} GB; ratio {result['peak_rss_over_model_size']:.2f}x"
        )
        if not ok:
            print(_tail(log_path))
            status = 1
    if out_dir.exists():
        result["output_bytes"] = sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file())
        if not args.keep_output:
            shutil.rmtree(out_dir)
    (RESULTS_DIR / "large.json").write_text(json.dumps(result, indent=1))
    print(f"results: {(RESULTS_DIR / 'large.json').relative_to(REPO_ROOT)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
