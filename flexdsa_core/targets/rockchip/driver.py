"""rknn-toolkit2 driver: compile each bucket for the RK3588 NPU, run it in the simulator, read its placement.

Runs inside the rockchip toolchain's own environment (never imported by the core)::

    python driver.py request.json result.json

Per bucket: ``RKNN(verbose=True)``, ``config(target_platform='rk3588', ...)``, ``load_onnx`` with the
bucket's inputs and their static shapes, ``build`` (float16 unless the options ask for int8 with a
dataset), ``export_rknn`` to ``out_dir/model.<bucket>.rknn``, ``init_runtime()`` (no target: the x86
simulator), ``inference`` on the given .npy inputs (4-D inputs passed as NCHW so that the outputs compare
with ONNX Runtime's), outputs saved as .npy.

A bucket may give ``input_shapes`` (input name -> static shape) instead of ``inputs``: the build and its
layer table without a simulator run (an exploration candidate scored by the toolkit's estimate alone).

``options`` (all optional): ``simulate`` and ``export`` (default true: run the simulator on the inputs,
write the .rknn); ``target_platform`` (default rk3588); rknn.config() switches
``optimization_level``, ``op_target``, ``remove_reshape``, ``enable_flash_attention``, ``single_core_mode``,
``disable_rules``, ``float_dtype``, ``quantized_dtype``, ``quantized_algorithm``, ``quantized_method``,
``mean_values``, ``std_values``; ``dtype: "int8"`` with a dataset (the bucket's own ``dataset``, the core's
calibration samples, else ``options.dataset``: a list of samples, each a list of .npy paths in input order or
a dict input name -> path) builds with the toolkit's w8a8 quantisation; ``custom_hybrid`` (``{bucket:
[[input tensor, output tensor], ...]}``) then keeps those subgraphs in float16 through the toolkit's hybrid
quantisation (``hybrid_quantization_step1(custom_hybrid=...)``, then ``step2``); ``auto_hybrid`` asks the
toolkit's own automatic hybrid quantisation instead (``build(auto_hybrid=True)``, layers whose quantised output
falls below ``auto_hybrid_cos_thresh`` kept float16); ``hybrid_layers`` (``{"tensors": [...], "nodes": [...],
"ops": [...]}``) keeps float16 exactly the layers of the toolkit's own graph it names (``rknn_hybrid.layer_pairs``:
layer output tensors as the toolkit names them, ONNX node names, toolkit op types). The bucket's ``samples``
are run in the simulator too (``sample_outputs``), for the core to judge the quantised model on;
``accuracy_analysis`` then runs the toolkit's ``accuracy_analysis`` on the first of them: per layer, the cosine of
the simulator's tensor to the float one, accumulated (``cosine``) and with the layer fed the float inputs
(``cosine_single``), in ``layer_accuracy``.

``serve_passthrough``: outputs the runtime can serve from the inputs (``rknn_outputs``: inputs passed through,
their shapes and casts) are left out of the toolkit's model (``load_onnx(outputs=...)``; rknn-toolkit2 2.5.0
dies with SIGFPE building a model that passes an input it consumes through to an output), listed in
``served_by_runtime``, and computed from the inputs beside the simulator's outputs, as the runtime will.

Beside each exported .rknn, ``model.<bucket>.rknn.build.json`` (``build_record``) says how it was built: the
config switches, precision, hybrid pairs in the toolkit's names, and the sha256 of each calibration sample's .npy
files. The toolkit simulates only a model it built itself, so whoever checks the .rknn here (flexdsa_runtime's
``rknn-simulator``, the bundle's ``convert_rknn.py``) rebuilds it from this record: the same precision, on the
same samples (found among the bundle's calibration files by those digests), not a float16 stand-in.

Each bucket's toolkit steps run in a forked child process: a toolkit that dies of a signal fails that bucket
with the signal's name, and the other buckets of the request still run.

Placement comes from the verbose build's "Network Layer Information Table": one row per compiled layer
with its op type, Target (CPU/NPU), cycles (DDR/NPU/Total) and FullName ``OpType:layer name``. A layer
keeps the ONNX name of the node it came from, sometimes with a suffix the toolkit adds when it rewrites
(``node_Conv_2_ConvAddRelu``, ``/fc/Gemm#2``, ``/GlobalAveragePool_2conv0``), or a new name that its
Python front end logs as ``<rule>: remove node = [...], add node = [...]``; both are traced back to the
ONNX node. ONNX nodes with no layer of their own were fused into a neighbour (a Relu into ConvRelu) or
removed: they count as on the NPU when a neighbour is (the toolkit fuses into NPU layers: a residual Add
into ConvAdd, a Relu into ConvRelu), else on the CPU.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

# Run as a script in the vendor environment, where flexdsa_core is not installed: what every driver shares is
# imported by plain name from the toolchains' common folder (a folder of its own, so nothing else is shadowed).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "toolchains" / "drivers"))
import _driver_common as common  # noqa: E402

# This folder's rknn_hybrid.py, which the bundle's convert_rknn.py ships and imports too (on sys.path already
# when run as a script; added when the driver is loaded by file path).
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(1, str(Path(__file__).resolve().parent))
from rknn_hybrid import layer_pairs, map_hybrid, quantized_tensors  # noqa: E402
from rknn_outputs import kept_outputs, runtime_served, serve  # noqa: E402

TABLE_TITLE = "Network Layer Information Table"
ROW = re.compile(
    r"^(?P<id>\d+)\s+(?P<op>\S+)\s+(?P<dtype>\S+)\s+(?P<target>CPU|NPU|GPU)\s+(?P<inputs>\S+)\s+"
    r"(?P<outputs>\S+)\s+(?P<ddr>\d+)/(?P<npu>\d+)/(?P<total>\d+)\s+(?P<rw_kb>\d+)\s+(?P<full>\S+)"
)
LINEAGE = re.compile(
    r"^\s*D?\s*(?P<rule>\w+): remove node = (?P<removed>\[.*?\]), add node = (?P<added>\[.*?\])"
)
LOG_PREFIX = re.compile(r"^[DIWE] RKNN: \[[\d:.]+\] ")
# A row of accuracy_analysis's error_analysis.txt: [OpType] tensor  cos | euc   cos | euc (entire, single).
ANALYSIS_ROW = re.compile(
    r"^\[(?P<op>[^\]]+)\]\s+(?P<tensor>\S+)\s+(?P<cos>\S+)\s*\|\s*(?P<euc>\S+)\s+(?P<cos1>\S+)\s*\|\s*(?P<euc1>\S+)"
)
BOUNDARY_OPS = {"InputOperator", "OutputOperator"}
PACKAGES = ("rknn-toolkit2", "onnx", "onnxruntime", "numpy", "torch")  # versions in result.json
BUILD_RECORD_FORMAT = "flexdsa-rknn-build/1"


def main(request_path: str, result_path: str) -> int:
    return common.run_request(request_path, result_path, compile_bucket, PACKAGES)


def compile_bucket(bucket: dict, out_dir: Path, options: dict) -> dict:
    import numpy as np
    import onnx

    name = bucket["name"]
    entry: dict = {"name": bucket["name"], "artifacts": [], "placement": {}, "outputs": {}, "layers": []}
    graph = onnx.load(bucket["onnx"], load_external_data=False).graph
    initializers = {init.name for init in graph.initializer}
    input_names = [value.name for value in graph.input if value.name not in initializers]
    feeds = {key: np.load(path) for key, path in bucket.get("inputs", {}).items()}
    given = bucket.get("input_shapes") or {}  # an estimate-only candidate: shapes without inputs
    shapes = [
        list(feeds[n].shape) if n in feeds else list(given[n]) if n in given else _static_shape(graph, n)
        for n in input_names
    ]
    rknn_name = f"model.{name}.rknn"
    started = time.perf_counter()
    crash = ""
    served = runtime_served(graph) if options.get("serve_passthrough") else []
    output_names = kept_outputs(graph, served)
    if served:
        entry["served_by_runtime"] = served
    with common.captured("rknn-") as log_path, _scratch_cwd():
        try:
            options = {**options, "dataset": bucket.get("dataset") or options.get("dataset"),
                       "custom_hybrid": (options.get("custom_hybrid") or {}).get(name),
                       "samples": common.load_samples(bucket.get("samples"), input_names),
                       "outputs": output_names if served else None,
                       "analysis_inputs": [bucket["inputs"][n] for n in input_names] if bucket.get("inputs") else None}  # fmt: skip
            error, outputs, found = _contained(
                _build, bucket["onnx"], input_names, shapes, out_dir / rknn_name, feeds, options, out_dir, name
            )
            options.update(found)
        except Exception as err:  # the toolkit raises on some parser failures instead of returning -1
            error, outputs = f"rknn-toolkit2 raised {type(err).__name__}: {err}", None
            crash = traceback.format_exc()
    entry["seconds"] = round(time.perf_counter() - started, 3)
    log = Path(log_path).read_text(errors="replace") + crash
    entry["log"] = log[-200_000:]
    if error:
        entry["error"] = error
        return entry
    if options.get("export", True):
        entry["artifacts"].append(rknn_name)
        record = build_record(rknn_name, input_names, shapes, options, bucket.get("samples"))
        (out_dir / record_name(rknn_name)).write_text(json.dumps(record, indent=1))
        entry["artifacts"].append(record_name(rknn_name))
    outputs = outputs or []
    sample_outputs = outputs[1:] if options.get("samples") else []
    outputs = outputs[0] if options.get("samples") and outputs else outputs
    common.save_outputs(entry, out_dir, name, _with_served(output_names, outputs, served, feeds))
    entry["sample_outputs"] = []
    for index, found_outputs in enumerate(sample_outputs):
        saved = {"outputs": {}}
        sample = options["samples"][index]
        common.save_outputs(saved, out_dir, f"{name}.sample{index:03d}",
                            _with_served(output_names, found_outputs, served, sample))  # fmt: skip
        entry["sample_outputs"].append(saved["outputs"])
    if options.get("layer_accuracy"):
        entry["layer_accuracy"] = _named_layers(options["layer_accuracy"], graph, parse_lineage(log))
    if options.get("dtype") == "int8":
        hybrid = options.get("hybrid_mapped") or []
        entry["quantization"] = (
            f"rknn w8a8 ({options.get('quantized_algorithm', 'normal')}, {options.get('quantized_method', 'channel')} "
            f"weights) on {len(options.get('dataset') or [])} calibration sample(s)"
            + (f", {len(hybrid)} subgraph(s) kept float16 by hybrid quantisation: {hybrid}" if hybrid else "")
        )
        if options.get("hybrid_unmapped"):
            entry.setdefault("notes", []).append(
                f"float layer(s) the toolkit's graph no longer has tensors for (fused away), left int8: "
                f"{options['hybrid_unmapped']}"
            )
    layers = parse_layer_table(log)
    lineage = parse_lineage(log)
    entry["layers"], entry["placement"] = place_nodes(graph, layers, lineage)
    entry.setdefault("notes", []).append(
        f"{len(layers)} layer(s) in the toolkit's table, "
        f"{sum(1 for row in layers if row['target'] == 'NPU')} on the NPU; cycles are the toolkit's estimate"
    )
    return entry


def record_name(rknn_name: str) -> str:
    """The build record's file name beside the .rknn: ``model.<bucket>.rknn.build.json``."""
    return rknn_name + ".build.json"


def build_record(
    rknn_name: str, input_names: list[str], shapes: list[list[int]], options: dict, judged=None
) -> dict:
    """How the toolkit built ``rknn_name``, for rebuilding the same model (flexdsa_runtime's ``rknn-simulator``:
    the toolkit simulates only a model it built itself; the bundle's ``convert_rknn.py``): the ``rknn.config``
    switches, the outputs kept, the precision, the hybrid pairs as the toolkit names them (mapped already: no
    first step 1 is needed to repeat it) and, per calibration sample (``calibration``) and per sample its simulator
    run was judged on (``judged``: the job's accuracy claim), the sha256 of each input's .npy file, which the
    bundle's calibration files carry too (manifest.json), so the very samples can be found among them."""
    import hashlib

    def digests(samples) -> list[dict[str, str]]:
        rows = [s if isinstance(s, dict) else dict(zip(input_names, s, strict=True)) for s in samples or []]
        return [{name: hashlib.sha256(Path(row[name]).read_bytes()).hexdigest() for name in input_names}
                for row in rows]  # fmt: skip

    quantized = options.get("dtype") == "int8"
    return {
        "format": BUILD_RECORD_FORMAT,
        "rknn": rknn_name,
        "toolkit": common.versions(["rknn-toolkit2"]).get("rknn-toolkit2"),
        "config": options.get("config") or {},
        "inputs": input_names,
        "input_size_list": shapes,
        "outputs": options.get("outputs"),
        "precision": "int8" if quantized else "float16",
        "auto_hybrid": bool(quantized and options.get("auto_hybrid")),
        # Built through hybrid_quantization_step1/step2 (with these pairs, or none), not build().
        "hybrid_steps": bool(quantized and options.get("hybrid_steps")),
        "hybrid": list(options.get("hybrid_mapped") or []) if quantized else [],
        "calibration": digests(options.get("dataset")) if quantized else [],
        "judged": digests(judged),
    }


def _with_served(names, outputs, served, inputs):
    """(output name, array) pairs: the toolkit's outputs, then those the runtime serves from ``inputs``."""
    pairs = list(zip(names, outputs, strict=False))
    return pairs + list(serve(served, inputs).items()) if served and pairs else pairs


def _contained(function, *args):
    """``function(*args)`` (-> (error, outputs, options found)) in a forked child process: a toolkit that dies
    of a signal fails this bucket with the signal's name instead of ending the whole request."""
    import pickle
    import signal

    import rknn.api  # noqa: F401  imported once here, inherited by every child

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            payload = pickle.dumps(function(*args))
        except BaseException as err:  # reported as in-process: one line, the traceback in the log
            traceback.print_exc()
            payload = pickle.dumps((f"rknn-toolkit2 raised {type(err).__name__}: {err}", None, {}))
        with os.fdopen(write, "wb") as handle:
            handle.write(payload)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as handle:
        payload = handle.read()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        return (f"rknn-toolkit2 died with {signal.Signals(number).name} (signal {number}) while building or "
                "running this model (see the log)"), None, {}  # fmt: skip
    if not payload:
        return f"rknn-toolkit2's process ended with status {os.WEXITSTATUS(status)} and no result", None, {}
    return pickle.loads(payload)


def _build(onnx_path, input_names, shapes, rknn_path, feeds, options, out_dir, name):
    """The toolkit's steps; returns (error in plain words or None, outputs or None, what the steps found for
    the entry: the hybrid pairs, the per-layer analysis)."""
    found: dict = {}
    error, outputs = _steps(onnx_path, input_names, shapes, rknn_path, feeds, options, out_dir, name, found)
    return error, outputs, found


def _steps(onnx_path, input_names, shapes, rknn_path, feeds, options, out_dir, name, found):
    from rknn.api import RKNN

    rknn = RKNN(verbose=True)
    load = {"model": onnx_path, "inputs": input_names, "input_size_list": shapes,
            **({"outputs": options["outputs"]} if options.get("outputs") else {})}  # fmt: skip
    try:
        config = {"target_platform": options.get("target_platform", "rk3588")}
        for key in ("optimization_level", "op_target", "remove_reshape", "enable_flash_attention",
                    "single_core_mode", "disable_rules", "float_dtype", "quantized_dtype", "quantized_algorithm",
                    "quantized_method", "mean_values", "std_values", "auto_hybrid_cos_thresh"):  # fmt: skip
            if options.get(key) is not None:
                config[key] = options[key]
        found["config"] = config
        if rknn.config(**config) != 0:
            return f"rknn.config({config}) failed", None
        if rknn.load_onnx(**load) != 0:
            return "rknn.load_onnx could not parse the model (see the log)", None
        quantize = options.get("dtype") == "int8"
        dataset = _dataset_file(options.get("dataset"), input_names, out_dir, name) if quantize else None
        if quantize and dataset is None:
            return "int8 needs a calibration dataset (options.dataset: lists of .npy paths per sample)", None
        if quantize and (options.get("custom_hybrid") or any((options.get("hybrid_layers") or {}).values())):
            # Hybrid: step 1 writes <stem>.model/.data/.quantization.cfg into the working directory; step 2, in
            # a fresh instance, builds from them. The toolkit renames tensors as it rewrites (a MatMul's output
            # 'wide' becomes 'wide_mm', a fused Relu's output is gone), so a first step 1 lists its names (and
            # leaves its own graph, check3_fuse_ops.onnx) and ours are mapped onto them before the step 1 that
            # keeps the subgraphs float.
            found["hybrid_steps"] = True
            if rknn.hybrid_quantization_step1(dataset=dataset) != 0:
                return "rknn.hybrid_quantization_step1 failed (see the log)", None
            known = quantized_tensors(_hybrid_files()[2])
            pairs, unmapped = map_hybrid(options.get("custom_hybrid") or [], known, _onnx_graph(onnx_path))
            if any((options.get("hybrid_layers") or {}).values()):
                chosen = layer_pairs(_onnx_graph("check3_fuse_ops.onnx"), known, **options["hybrid_layers"])
                pairs += [pair for pair in chosen if pair not in pairs]
            found["hybrid_mapped"], found["hybrid_unmapped"] = pairs, unmapped
            rknn.release()
            rknn = RKNN(verbose=True)
            if rknn.config(**config) != 0 or rknn.load_onnx(**load) != 0:
                return "rknn could not reload the model for hybrid quantisation", None
            if pairs and rknn.hybrid_quantization_step1(dataset=dataset, custom_hybrid=pairs) != 0:
                return "rknn.hybrid_quantization_step1 with the float layers failed (see the log)", None
            if not pairs and rknn.hybrid_quantization_step1(dataset=dataset) != 0:
                return "rknn.hybrid_quantization_step1 failed (see the log)", None
            model_file, data_file, cfg_file = _hybrid_files()
            rknn.release()
            rknn = RKNN(verbose=True)
            if rknn.hybrid_quantization_step2(model_input=model_file, data_input=data_file,
                                              model_quantization_cfg=cfg_file) != 0:  # fmt: skip
                return "rknn.hybrid_quantization_step2 failed (see the log)", None
        elif rknn.build(do_quantization=quantize, dataset=dataset, auto_hybrid=bool(quantize and options.get("auto_hybrid"))) != 0:
            return "rknn.build failed (see the log for the toolkit's reason)", None
        if options.get("export", True) and rknn.export_rknn(str(rknn_path)) != 0:
            return f"rknn.export_rknn could not write {rknn_path.name}", None
        if not feeds or not options.get("simulate", True):
            return None, []
        if rknn.init_runtime() != 0:
            return "rknn.init_runtime (simulator) failed", None
        runs = [feeds, *(options.get("samples") or [])]
        results = []
        for sample in runs:
            arrays = [sample[n] for n in input_names]
            formats = ["nchw"] * len(arrays)  # ignored for inputs that are not 4-D
            outputs = rknn.inference(inputs=arrays, data_format=formats)
            if outputs is None:
                return "rknn.inference (simulator) returned no outputs", None
            results.append(outputs)
        if options.get("accuracy_analysis") and options.get("analysis_inputs"):
            found["layer_accuracy"] = _accuracy_analysis(rknn, options["analysis_inputs"])
        return None, results if options.get("samples") else results[0]
    finally:
        rknn.release()


def _accuracy_analysis(rknn, inputs: list[str]) -> list[dict] | None:
    """The toolkit's per-layer error on one sample (its simulator against its float run), parsed."""
    import shutil

    folder = tempfile.mkdtemp(prefix="rknn-analysis-")
    try:
        if rknn.accuracy_analysis(inputs=inputs, output_dir=folder) != 0:
            return None
        return parse_analysis((Path(folder) / "error_analysis.txt").read_text(errors="replace"))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def parse_analysis(text: str) -> list[dict]:
    """Rows of ``error_analysis.txt``: per layer (its output tensor as the toolkit names it), the cosine and
    euclidean distance of the simulator's tensor to the float one, accumulated and single-layer."""

    def number(text: str) -> float | None:
        try:
            return float(text)
        except ValueError:  # 'f_zero': the float tensor is all zeros
            return None

    rows = []
    for line in text.splitlines():
        match = ANALYSIS_ROW.match(line.strip())
        if match and match["op"] != "Input":
            rows.append({"layer": match["tensor"], "op": match["op"], "cosine": number(match["cos"]),
                         "euclidean": number(match["euc"]), "cosine_single": number(match["cos1"]),
                         "euclidean_single": number(match["euc1"])})  # fmt: skip
    return rows


def _named_layers(rows: list[dict], graph, lineage: dict[str, list[str]]) -> list[dict]:
    """Each analysed layer with the ONNX node(s) it came from (read like the layer table's names)."""
    names = {node.name for node in graph.node if node.name}
    producer = {out: node.name for node in graph.node for out in node.output}
    for row in rows:
        tensor = row["layer"]
        row["onnx_nodes"] = [producer[tensor]] if tensor in producer else _onnx_names(tensor, names, lineage)
    return rows


def _hybrid_files() -> tuple[str, str, str]:
    """The .model, .data and .quantization.cfg that hybrid step 1 wrote into the working directory."""
    found = []
    for suffix in (".model", ".data", ".quantization.cfg"):
        matches = sorted(Path(".").glob(f"*{suffix}"))
        if not matches:
            raise RuntimeError(f"hybrid_quantization_step1 wrote no *{suffix} file")
        found.append(str(matches[0]))
    return found[0], found[1], found[2]


def _onnx_graph(path: str):
    import onnx

    return onnx.load(path, load_external_data=False).graph


def _dataset_file(samples, input_names: list[str], out_dir: Path, name: str) -> str | None:
    """rknn's dataset is a text file, one calibration sample a line, one .npy per input (in the model's input
    order), space-separated."""
    if not samples:
        return None
    rows = [[s[n] for n in input_names] if isinstance(s, dict) else list(s) for s in samples]
    path = out_dir / f"{name}.dataset.txt"
    path.write_text("".join(" ".join(row) + "\n" for row in rows))
    return str(path)


# ---- the layer table -------------------------------------------------------------------------------


def parse_layer_table(log: str) -> list[dict]:
    """Rows of the last "Network Layer Information Table" in ``log``."""
    lines = [LOG_PREFIX.sub("", line) for line in log.splitlines()]
    starts = [i for i, line in enumerate(lines) if TABLE_TITLE in line]
    if not starts:
        return []
    rows = []
    for line in lines[starts[-1] + 1 :]:
        if rows and line.startswith("-"):
            break
        match = ROW.match(line.strip())
        if not match:
            continue
        op_type, _, layer_name = match["full"].partition(":")
        rows.append({
            "id": int(match["id"]), "op": match["op"], "dtype": match["dtype"], "target": match["target"],
            "input_shapes": match["inputs"], "output_shape": match["outputs"],
            "cycles_ddr": int(match["ddr"]), "cycles_npu": int(match["npu"]), "cycles": int(match["total"]),
            "rw_kb": int(match["rw_kb"]), "origin_op": op_type, "layer_name": layer_name or op_type,
        })  # fmt: skip
    return rows


def parse_lineage(log: str) -> dict[str, list[str]]:
    """New layer name -> the node names it replaced, from the front end's fuse_ops log."""
    origin: dict[str, list[str]] = {}
    for line in log.splitlines():
        match = LINEAGE.match(line)
        if not match:
            continue
        try:
            removed, added = ast.literal_eval(match["removed"]), ast.literal_eval(match["added"])
        except (ValueError, SyntaxError):
            continue
        sources = [s for r in removed for s in origin.get(r, [r])]
        for new in added:
            origin[new] = sources or origin.get(new, [])
    return origin


def _onnx_names(layer_name: str, nodes: set[str], lineage: dict[str, list[str]]) -> list[str]:
    if layer_name in nodes:
        return [layer_name]
    seen, pending, found = set(), [layer_name], []
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        if current in nodes:
            found.append(current)
            continue
        if current in lineage:
            pending.extend(lineage[current])
            continue
        prefix = _longest_prefix(current, nodes)
        if prefix:
            found.append(prefix)
    return sorted(set(found))


def _longest_prefix(name: str, nodes: set[str]) -> str | None:
    """``node_Conv_2_ConvAddRelu`` -> ``node_Conv_2``; ``/fc/Gemm#2`` -> ``/fc/Gemm``."""
    for end in range(len(name) - 1, 0, -1):
        if name[end] in "_#:.-" and name[:end] in nodes:
            return name[:end]
    return None


def place_nodes(
    graph, layers: list[dict], lineage: dict[str, list[str]]
) -> tuple[list[dict], dict[str, str]]:
    """Each ONNX node -> 'accelerator' if one of its layers runs on the NPU, else 'cpu'; nodes without a
    layer (fused into a neighbour, or folded away) are on the NPU if a neighbour is."""
    nodes = [node for node in graph.node]
    names = {node.name for node in nodes if node.name}
    targets: dict[str, set[str]] = {}
    for row in layers:
        if row["op"] in BOUNDARY_OPS:
            row["onnx_nodes"] = []
            continue
        row["onnx_nodes"] = _onnx_names(row["layer_name"], names, lineage)
        for node_name in row["onnx_nodes"]:
            targets.setdefault(node_name, set()).add(row["target"])
    placement = {n: ("accelerator" if "NPU" in t else "cpu") for n, t in targets.items()}
    producer = {out: node.name for node in nodes for out in node.output}
    consumers: dict[str, list[str]] = {}
    for node in nodes:
        for value in node.input:
            consumers.setdefault(value, []).append(node.name)
    for _ in range(len(nodes)):
        changed = False
        for node in nodes:
            if not node.name or node.name in placement or node.op_type == "Constant":
                continue
            near = [producer[v] for v in node.input if v in producer]
            near += [c for v in node.output for c in consumers.get(v, [])]
            known = {placement[n] for n in near if n in placement}
            if known:  # fused into an NPU layer (ConvAddRelu, exSDPAttention) if any neighbour is on the NPU
                placement[node.name] = "accelerator" if "accelerator" in known else "cpu"
                changed = True
        if not changed:
            break
    return layers, placement


# ---- helpers ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def _scratch_cwd():
    """The toolkit writes check*.onnx snapshots into the working directory: keep them out of the caller's."""
    previous = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="rknn-work-") as folder:
        os.chdir(folder)
        try:
            yield folder
        finally:
            os.chdir(previous)


def _static_shape(graph, name: str) -> list[int]:
    value = next(v for v in graph.input if v.name == name)
    dims = value.type.tensor_type.shape.dim
    if any(not d.HasField("dim_value") for d in dims):
        raise ValueError(f"input {name!r} has a dynamic dim and no sample input to fix it")
    return [d.dim_value for d in dims]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
