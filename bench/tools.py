"""The optimisers under comparison, one function each: ``(src, dst, model_info) -> notes``.

Every tool runs in its own subprocess (``python -m bench.tools TOOL SRC DST INFO_JSON``), so a crash, a
hang or a missing package in one tool costs that tool's column only, and the optimisation time measured
is that of the call itself (model load + optimise + save, in a warm interpreter: imports excluded).
The child prints one JSON line: ``{"ok", "seconds", "notes"}`` or ``{"ok": false, "error"}``.
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

from bench import REPO_ROOT

# ONNX Runtime's transformers optimizer knows these model types; llama has none of its own, and its
# "gpt2" type (pre-LN decoder, causal attention, SimplifiedLayerNorm) is the nearest fit.
ORT_TRANSFORMERS_MODEL_TYPE = {"bert": "bert", "gpt2": "gpt2", "llama": "gpt2", "vit": "vit"}
ORT_TRANSFORMERS_OPT_LEVEL = 1  # ONNX Runtime basic graph optimisations first, then its Python fusions

# Flex-DSA runs with a user's defaults (validation and the never-slower latency check on); the bench
# passes other options (``info["flexdsa_options"]``) only for the extra compile-time columns it labels.
FLEXDSA_OPTIONS: dict = {}


def _save(model, dst: Path) -> None:
    import onnx

    # Models over protobuf's 2 GB limit would need external data; the bench models are far below it.
    onnx.save(model, str(dst))


def run_flexdsa(src: Path, dst: Path, info: dict) -> dict:
    from flexdsa_core import FlexDSAOptimizer, OptimizeOptions, load_target
    from flexdsa_core.cache import DiskCache

    options = OptimizeOptions(**{**FLEXDSA_OPTIONS, **info.get("flexdsa_options", {})})
    # A kernel cache on disk as the CLI keeps one: the bench hands an empty folder for a cold run and the
    # same folder again for a warm one; without one, nothing outlives the call (cold).
    cache = DiskCache(info["kernel_cache"]) if info.get("kernel_cache") else None
    result = FlexDSAOptimizer(load_target("cpu-ort")).optimize(str(src), options, cache=cache)
    dst.write_bytes(result.model_bytes())
    report = getattr(result, "report", None) or {}
    return {
        "options": options.model_dump(exclude_defaults=True),
        "compile_seconds": report.get("compile_seconds"),
        "total_seconds": report.get("total_seconds"),
        "cache": report.get("cache"),
    }


def run_onnxsim(src: Path, dst: Path, info: dict) -> dict:
    import onnx
    import onnxsim

    model, check = onnxsim.simplify(onnx.load(str(src)))
    _save(model, dst)
    return {"check": bool(check)}


def run_onnxslim(src: Path, dst: Path, info: dict) -> dict:
    import onnx
    import onnxslim

    _save(onnxslim.slim(onnx.load(str(src))), dst)
    return {}


def run_onnxoptimizer(src: Path, dst: Path, info: dict) -> dict:
    import onnx
    import onnxoptimizer

    # Its default pass list is the fuse-and-eliminate set; run it to a fixed point.
    passes = onnxoptimizer.get_fuse_and_elimination_passes()
    _save(onnxoptimizer.optimize(onnx.load(str(src)), passes, fixed_point=True), dst)
    return {"passes": len(passes)}


def run_ort_offline(src: Path, dst: Path, info: dict) -> dict:
    import onnxruntime as ort

    # ONNX Runtime's own graph optimiser, saved to a file ("offline mode"). EXTENDED, not ALL: ALL adds
    # layout transforms specific to the machine that saved the model.
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(dst)
    options.intra_op_num_threads = 1
    ort.InferenceSession(str(src), options, providers=["CPUExecutionProvider"])
    return {"level": "ORT_ENABLE_EXTENDED"}


def run_ort_transformers(src: Path, dst: Path, info: dict) -> dict:
    from onnxruntime.transformers.optimizer import optimize_model

    model_type = ORT_TRANSFORMERS_MODEL_TYPE[info["name"]]
    optimized = optimize_model(
        str(src),
        model_type=model_type,
        num_heads=info["heads"],
        hidden_size=info["hidden"],
        opt_level=ORT_TRANSFORMERS_OPT_LEVEL,
        use_gpu=False,
    )
    optimized.save_model_to_file(str(dst))
    return {
        "model_type": model_type,
        "opt_level": ORT_TRANSFORMERS_OPT_LEVEL,
        "fused": optimized.get_fused_operator_statistics(),
    }


TOOLS: dict[str, Callable[[Path, Path, dict], dict]] = {
    "flexdsa": run_flexdsa,
    "onnxsim": run_onnxsim,
    "onnxslim": run_onnxslim,
    "onnxoptimizer": run_onnxoptimizer,
    "ort-offline": run_ort_offline,
    "ort-transformers": run_ort_transformers,
}
# Tool -> the packages its subprocess imports before the clock starts.
_IMPORTS = {
    "flexdsa": ["flexdsa_core", "flexdsa_core.optimizer"],
    "onnxsim": ["onnx", "onnxsim"],
    "onnxslim": ["onnx", "onnxslim"],
    "onnxoptimizer": ["onnx", "onnxoptimizer"],
    "ort-offline": ["onnxruntime"],
    "ort-transformers": ["onnxruntime.transformers.optimizer"],
}


def applies(tool: str, model_name: str) -> bool:
    return tool != "ort-transformers" or model_name in ORT_TRANSFORMERS_MODEL_TYPE


def run_tool(tool: str, src: Path, dst: Path, info: dict, timeout_s: float) -> dict:
    """Run ``tool`` on ``src`` in a subprocess; returns the child's JSON (``ok`` False on any failure)."""
    dst.unlink(missing_ok=True)
    command = [sys.executable, "-m", "bench.tools", tool, str(src), str(dst), json.dumps(info)]
    try:
        proc = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"ok": False, "error": f"timed out after {timeout_s:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        stderr = proc.stderr.strip().splitlines()
        return {"ok": False, "error": f"exit {proc.returncode}: " + (stderr[-1] if stderr else "no output")}
    if report.get("ok") and not dst.is_file():
        return {"ok": False, "error": "reported success but wrote no model"}
    return report


def _child(tool: str, src: str, dst: str, info_json: str) -> None:
    import importlib

    try:
        for module in _IMPORTS[tool]:
            importlib.import_module(module)
    except Exception as error:  # noqa: BLE001 - any import failure means the tool is unavailable here
        print(
            json.dumps(
                {"ok": False, "unavailable": True, "error": f"import failed: {type(error).__name__}: {error}"}
            )
        )
        return
    if tool == "flexdsa":  # as its entry points do: what a job would import on its way, imported first
        from flexdsa_core.optimizer import preload

        preload()
    # As Flex-DSA's entry points do (the CLI, the worker's pipeline process: ``heap.freeze_imports``), and for
    # every tool alike: the imports are left out of the cyclic collector's full passes during the timed run.
    gc.freeze()
    start = time.perf_counter()
    try:
        notes = TOOLS[tool](Path(src), Path(dst), json.loads(info_json))
    except Exception as error:  # noqa: BLE001 - reported, the bench goes on with the other tools
        traceback.print_exc()
        print(json.dumps({"ok": False, "error": f"{type(error).__name__}: {str(error)[:500]}"}))
        return
    seconds = time.perf_counter() - start
    print(json.dumps({"ok": True, "seconds": seconds, "notes": notes}, default=str))


if __name__ == "__main__":
    _child(*sys.argv[1:5])
