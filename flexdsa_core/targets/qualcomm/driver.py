"""onnxruntime-qnn driver: quantise each bucket to QNN's QDQ, compile it for the Hexagon HTP (emulated on
x86), run it, read where QNN put each node, and keep the context binary.

Runs inside the qualcomm toolchain's own environment (never imported by the core)::

    python driver.py request.json result.json

Per bucket (each already a static-shape ONNX: HTP graphs do not finalise with a dynamic dim):

1. Quantise to QDQ with ``onnxruntime.quantization``'s QNN config (``get_qnn_qdq_config``: asymmetric
   uint8 weights, uint8 or uint16 activations, MinMax), calibrated on the bucket's ``dataset`` (the core's
   calibration samples), else ``options.dataset``, else the bucket's one sample input. ``mixed`` gives the
   tensors of the layers kept out of int8 uint16 activations through the config's per-tensor overrides
   (``init_overrides``; ``add_qtype_converts`` inserts the uint8<->uint16 converts). Skipped for
   ``precision: "fp16"``, which runs the float graph on HTP FP16.
2. Compile: a session on the plugin EP (``register_execution_provider_library``, the QNN device from
   ``get_ep_devices()``, ``backend_type=htp``, ``htp_arch``/``soc_model`` of the part) with CPU fallback
   allowed, ``ep.context_enable=1`` (writes ``model.<bucket>.qnn_ctx.onnx``, an EPContext model, and the
   QNN context binary beside it) and the verbose log on.
3. Run: a second session loads the EPContext model (the deployable artifact: the context binary, not a
   recompile) and runs the sample input and the bucket's ``samples`` (calibration samples to judge the
   quantised model on); outputs are saved as .npy (``outputs``, ``sample_outputs``).
4. Placement, from the compile session's verbose log: per node unit "Validation PASSED/FAILED for N
   nodes in OrtNodeUnit (Op)", its nodes and, when failed, QNN's REASON; the last GetCapability pass
   (after the layout transform) is the one that decides; "Node placements" names the nodes left on the
   CPU provider. The Q/DQ nodes the quantiser added are not in the core's graph and are not reported.

``options`` (all optional): ``precision`` "int8" (default), "mixed" or "fp16"; ``activation_type`` "uint8"
(default), "uint16", or "auto" (uint8 (or mixed), and uint16 everywhere when that model's cosine to the
float model on the samples is below ``min_cosine``, default 0.99); ``uint16_tensors``: ``{bucket: [tensor
names]}`` at uint16 under ``mixed``; ``weight_type`` "uint8"; ``per_channel`` (bool, the config's own switch);
``conv_per_channel`` (bool: Conv weights int8, symmetric, per output channel, through
per-tensor overrides; the other weights as ``weight_type``); ``matmul_per_channel`` (bool: the same for every 2-D
MatMul and Gemm weight); ``correct_biases``: ``{"python", "path"}``
of the core's interpreter, which corrects the QDQ model's Conv biases on the calibration samples after quantising
(``flexdsa_core.precision.bias_correction``, a subprocess: nothing of the core is imported here);
``learn_rounding``: the same ``{"python", "path"}``: under ``activation_type`` "auto", a uint8 (or mixed) build
below ``min_cosine`` by at most ``learn_rounding_within`` (default 0.02) is quantised again with its int8 weights'
rounding learned on the calibration samples (``flexdsa_core.precision.adaround``, before the bias correction) and
judged again, before uint16; ``provider``: QNN
provider options (default ``backend_type=htp``); ``dataset``: calibration samples, each a list of .npy
paths in graph-input order or a dict input name -> .npy path (a bucket's own ``dataset`` comes first);
``packed_uint16``: tensors of an output that packs quantities of unlike range, quantised uint16 whatever the
activations (``packed_sites``: why, per site); ``why``: a sentence the result repeats (why this precision ran); ``vendor_preprocess``: run QNN's own
``qnn_preprocess_model`` on the model first (the vendor alone's build of an original model).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path

# Run as a script in the vendor environment, where flexdsa_core is not installed: what every driver shares is
# imported by plain name from the toolchains' common folder (a folder of its own, so nothing else is shadowed).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "toolchains" / "drivers"))
import _driver_common as common  # noqa: E402

EP_NAME = "QNNExecutionProvider"
PASS_MARK = "GetCapability pass"
UNIT = re.compile(r"Validation (?P<verdict>PASSED|FAILED) for \d+ nodes in OrtNodeUnit \((?P<unit>[^)]*)\)")
MEMBER = re.compile(r"^\s*Operator type: (?P<op>\S+) Node name: (?P<name>.*?) Node index: \d+\s*$")
REASON = re.compile(r"^\s*REASON\s*:\s*(?P<reason>.*)$")
PLACED_ON = re.compile(r"Node\(s\) placed on \[(?P<provider>[^\]]+)\]")
PLACED_NODE = re.compile(r"\]\s{3}(?P<op>\S+) \((?P<name>.*)\)\s*$")
DEFAULT_PROVIDER = {"backend_type": "htp"}
# The layout transform re-creates layout-sensitive nodes (Conv, MaxPool, ...) as NHWC ones named <name>_token_<n>.
TOKEN_SUFFIX = re.compile(r"_token_\d+$")
PACKAGES = ("onnxruntime", "onnxruntime-qnn", "onnx", "numpy")  # versions in result.json
# Learned rounding is tried only on a build at most this far below ``min_cosine``: measured (HTP emulation),
# where uint8 missed by more it was the activations, and learned rounding lost a little more.
LEARN_ROUNDING_WITHIN = 0.02
LEARN_ROUNDING_GAINS = (
    "which gained 0.0005 on EfficientNet-Lite0 (0.9976 to 0.9981) and nothing where uint8 missed by more "
    "(MiniLM-L6 0.347 to 0.342, Silero VAD 0.867 to 0.829)"
)


def main(request_path: str, result_path: str) -> int:
    return common.run_request(request_path, result_path, compile_bucket, PACKAGES)


def compile_bucket(bucket: dict, out_dir: Path, options: dict) -> dict:
    import numpy as np
    import onnx

    name = bucket["name"]
    entry: dict = {"name": name, "artifacts": [], "placement": {}, "outputs": {}, "notes": []}
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    model_path = bucket["onnx"]
    if options.get("vendor_preprocess"):
        # The vendor alone: QNN's own documented preparation of a model (qnn_preprocess_model: its fusions and
        # shape inference), as a user without us would run it before the EP.
        from onnxruntime.quantization.execution_providers.qnn import qnn_preprocess_model

        prepared = out_dir / f"{name}.qnn_preprocessed.onnx"
        if qnn_preprocess_model(model_path, str(prepared)):
            model_path = str(prepared)
            entry["notes"].append("prepared with qnn_preprocess_model, as QNN's documentation asks")
    graph = onnx.load(model_path, load_external_data=False).graph
    feeds = {key: np.load(path) for key, path in bucket.get("inputs", {}).items()}
    missing = [
        v.name
        for v in graph.input
        if v.name not in feeds and v.name not in {i.name for i in graph.initializer}
    ]
    if missing:
        entry["error"] = f"no sample input for {', '.join(missing)} (QNN needs one to calibrate and to run)"
        return entry
    precision = options.get("precision", "int8")
    activation = options.get("activation_type", "uint8")
    samples = common.load_samples(bucket.get("samples"), list(feeds))
    checks = samples or [feeds]
    reference = [_run_cpu(model_path, sample) for sample in checks] if activation == "auto" else None
    first = "mixed" if precision == "mixed" else activation if activation != "auto" else "uint8"
    # The ladder under "auto": the first format; the same with learned rounding (still 8-bit activations, so
    # as fast on the HTP) where asked; uint16 activations everywhere (a16w8), slower, last.
    tries = [(first, False)]
    if activation == "auto" and precision != "fp16":
        tries += [(first, True)] * bool(options.get("learn_rounding")) + [("uint16", False)]
    overrides = (options.get("uint16_tensors") or {}).get(name) or []
    if options.get("why"):
        entry["notes"].append(options["why"])
    constants = {init.name for init in graph.initializer}
    # Weights quantised per output channel, by name, with their channel's axis: read once here, for every attempt.
    channel_weights = _per_channel_weights(graph, constants, options)
    attempt = 0
    while attempt < len(tries):
        activation_type, learned = tries[attempt]
        compiled = _compile(model_path, feeds, out_dir, name, {**options, "samples": samples,
                            "dataset": bucket.get("dataset") or options.get("dataset"), "channel_weights": channel_weights,
                            "learned": learned}, precision, activation_type, overrides)  # fmt: skip
        attempt += 1
        if compiled.get("error") and activation_type == "mixed" and attempt < len(tries):
            entry["notes"].append(f"mixed uint8/uint16 did not compile ({compiled['error'][:300]}): all uint16")
            attempt = len(tries) - 1
            continue
        if compiled.get("error") or reference is None or attempt == len(tries):
            break
        cosine = _min_cosine_samples(reference, compiled["sample_outputs"] or [compiled["outputs"]])
        floor = float(options.get("min_cosine", 0.99))
        if cosine >= floor:
            break
        built = f"{activation_type} activations{' with learned rounding' if learned else ''}"
        rounding = f"; {compiled['learned']}" if learned else ""
        within = float(options.get("learn_rounding_within", LEARN_ROUNDING_WITHIN))
        if tries[attempt][1] and cosine < floor - within:
            attempt += 1  # far below: the activations lose it, not the weights' rounding
            rounding = (f"; learned rounding not tried, more than {within} below: it recovers the weights' rounding, "
                        f"{LEARN_ROUNDING_GAINS}")  # fmt: skip
        again = ("its int8 weights' rounding learned on the calibration samples (AdaRound)" if tries[attempt][1]
                 else "uint16 activations everywhere (a16w8)")  # fmt: skip
        entry["notes"].append(
            f"{built} gave cosine {cosine:.6f} to the float model on the samples (below {floor}{rounding}): quantised "
            f"again with {again}"
        )
    entry["seconds"] = round(time.perf_counter() - started, 3)
    entry["log"] = compiled.get("log", "")[-200_000:]
    if compiled.get("error"):
        entry["error"] = compiled["error"]
        return entry
    entry["quantization"] = compiled["quantization"]
    if options.get("packed_uint16") and precision != "fp16":
        entry["packed_uint16"] = list(options["packed_uint16"])  # the bundle's build script raises them too
        entry["notes"] += [f"packed output at uint16, {site}: {why}" for site, why in
                           (options.get("packed_sites") or {}).items()]  # fmt: skip
    entry["notes"] += compiled["notes"]
    entry["artifacts"] = compiled["artifacts"]
    output_names = [value.name for value in graph.output]
    common.save_outputs(entry, out_dir, name, zip(output_names, compiled["outputs"], strict=False))
    entry["sample_outputs"] = []
    for index, outputs in enumerate(compiled.get("sample_outputs") or []):
        saved = {"outputs": {}}
        common.save_outputs(saved, out_dir, f"{name}.sample{index:03d}", zip(output_names, outputs, strict=False))
        entry["sample_outputs"].append(saved["outputs"])
    node_names = {node.name for node in graph.node if node.name}
    units = parse_units(compiled["log"])
    on_cpu = parse_cpu_nodes(compiled["log"])
    entry["placement"], entry["reasons"] = place_nodes(node_names, units, on_cpu)
    folded = place_folded(graph, compiled["kept"], entry["placement"])
    if folded:
        entry["notes"].append(
            f"{len(folded)} node(s) folded by the quantiser into the node before them (a Relu/Clip becomes its "
            f"output range), placed with it: {', '.join(folded[:5])}{' ...' if len(folded) > 5 else ''}"
        )
    entry["layers"] = [unit for unit in units if any(n in node_names for n in unit["nodes"])]
    accelerator = sum(1 for where in entry["placement"].values() if where == "accelerator")
    entry["notes"].append(
        f"{compiled['quantization']}; {accelerator} of {len(entry['placement'])} node(s) validated by QNN for "
        f"the HTP; context binary: {', '.join(a for a in compiled['artifacts'] if a.endswith('.bin')) or 'none'}"
    )
    return entry


def _compile(
    model_path, feeds, out_dir: Path, name: str, options: dict, precision: str, activation_type: str,
    uint16_tensors: list[str] = (),
):
    """Quantise (unless fp16), compile with the context cache on, run the EPContext model. A dict with
    ``outputs``, ``artifacts``, ``log``, ``quantization``, ``kept`` (node names of the compiled model), or
    ``error`` in plain words."""
    import onnx
    import onnxruntime as ort

    provider = {**DEFAULT_PROVIDER, **(options.get("provider") or {})}
    qdq_name = f"model.{name}.qdq.onnx"
    context_name = f"model.{name}.qnn_ctx.onnx"
    for stale in out_dir.glob(f"model.{name}.qnn_ctx*"):
        stale.unlink()  # a second attempt (uint16) must not find the first one's context
    artifacts, learned = [], None
    if precision == "fp16":
        compile_path, described = model_path, "float graph on HTP FP16 (enable_htp_fp16_precision=1)"
        provider["enable_htp_fp16_precision"] = "1"
    else:
        try:
            _quantize(model_path, out_dir / qdq_name, feeds, options, activation_type, uint16_tensors)
        except Exception as err:
            return {
                "error": f"QDQ quantisation failed: {type(err).__name__}: {err}",
                "log": traceback.format_exc(),
            }
        compile_path = str(out_dir / qdq_name)
        described = _describe(options, activation_type, len(uint16_tensors))
        artifacts.append(qdq_name)
        if options.get("learned"):
            learned = _learn_rounding(model_path, out_dir / qdq_name, list(feeds), options)
            described = f"{described}; {learned}"
        corrected = _correct_biases(model_path, out_dir / qdq_name, list(feeds), options)
        if corrected:
            described = f"{described}; {corrected}"
    devices = _qnn_devices()
    with common.captured("qnn-") as log_path:
        try:
            session_options = ort.SessionOptions()
            session_options.log_severity_level = 0  # verbose: the per-node-unit validation lines
            session_options.log_verbosity_level = 1
            if precision == "fp16":
                # ONNX Runtime's float rewrites before partitioning merge or rename nodes (ViT: 32 of 54 of ours
                # left in QNN's log), hiding which of ours QNN took: QNN gets the bucket as we made it. Not for
                # QDQ graphs: there its basic level keeps every name, and without it GPT-2's uint8 cosine fell
                # from 0.9996 to 0.975 (seen with onnxruntime-qnn 2.7.0).
                session_options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            session_options.add_session_config_entry("ep.context_enable", "1")
            session_options.add_session_config_entry("ep.context_file_path", str(out_dir / context_name))
            session_options.add_session_config_entry("ep.context_embed_mode", "0")  # binary beside the model
            session_options.add_provider_for_devices(devices, provider)
            compiled = ort.InferenceSession(compile_path, session_options)
            error = None
        except Exception as err:
            error = f"QNN could not compile the model: {type(err).__name__}: {err}"
    log = Path(log_path).read_text(errors="replace")
    os.unlink(log_path)
    if error:
        return {"error": error, "log": log}
    kept = {node.name for node in onnx.load(compile_path, load_external_data=False).graph.node}
    result = {"artifacts": artifacts, "log": log, "quantization": described, "kept": kept, "notes": [],
              "learned": learned}  # fmt: skip
    if not (out_dir / context_name).is_file():
        # QNN validated no node for the HTP: everything runs on the CPU provider, and there is no binary.
        result["notes"].append(
            "QNN took no node for the HTP: no context binary, the whole model runs on the CPU"
        )
        result["outputs"] = _quiet_run(compiled, feeds)
        result["sample_outputs"] = [_quiet_run(compiled, sample) for sample in options.get("samples") or []]
        return result
    result["artifacts"] = artifacts + sorted(p.name for p in out_dir.glob(f"model.{name}.qnn_ctx*"))
    try:
        run_options = ort.SessionOptions()
        run_options.add_provider_for_devices(devices, provider)
        session = ort.InferenceSession(str(out_dir / context_name), run_options)
        result["outputs"] = session.run(None, feeds)
        result["sample_outputs"] = [session.run(None, sample) for sample in options.get("samples") or []]
    except Exception as err:
        return {"error": f"the EPContext model did not run: {type(err).__name__}: {err}", "log": log}
    return result


def _quiet_run(session, feeds):
    """Run a session created with the verbose log on, without its per-run log lines reaching the caller."""
    with common.captured("qnn-") as log_path:
        outputs = session.run(None, feeds)
    os.unlink(log_path)
    return outputs


def _quantize(model_path, qdq_path: Path, feeds: dict, options: dict, activation_type: str,
              uint16_tensors=()) -> None:  # fmt: skip
    import numpy as np
    from onnxruntime.quantization import CalibrationDataReader, QuantType, quantize
    from onnxruntime.quantization.execution_providers.qnn import get_qnn_qdq_config

    samples = common.load_samples(options.get("dataset"), list(feeds)) or [feeds]

    class Samples(CalibrationDataReader):
        def __init__(self):
            self._pending = iter(samples)

        def get_next(self):
            sample = next(self._pending, None)
            return None if sample is None else {k: np.asarray(v) for k, v in sample.items()}

    types = {"uint8": QuantType.QUInt8, "uint16": QuantType.QUInt16}
    mixed = activation_type == "mixed"
    # mixed: uint8 activations, the sensitive layers' input/output tensors at uint16 (a16w8 there).
    overrides = {tensor: [{"quant_type": QuantType.QUInt16}] for tensor in uint16_tensors} if mixed else {}
    # A packed output's tensors at uint16 whatever the activations (the core found them on the samples).
    overrides.update({tensor: [{"quant_type": QuantType.QUInt16}] for tensor in options.get("packed_uint16") or []})
    if options.get("conv_per_channel") or options.get("matmul_per_channel"):
        # Conv (and MatMul/Gemm) weights int8, symmetric, one scale per output channel (a depthwise filter's few
        # weights no longer share the layer's scale, nor a projection's columns one outlier's); the other weights
        # keep the config's format (HTP's LayerNorm refuses int8 ones).
        for weight, axis in (options.get("channel_weights") or {}).items():
            overrides[weight] = [{"quant_type": QuantType.QInt8, "symmetric": True, "axis": axis}]
    config = get_qnn_qdq_config(
        model_path,
        Samples(),
        activation_type=types["uint8" if mixed else activation_type],
        weight_type=types[options.get("weight_type", "uint8")],
        per_channel=bool(options.get("per_channel", False)),
        init_overrides=overrides or None,
    )
    quantize(model_path, str(qdq_path), config)


def _core_step(module: str, core: dict | None, model_path, qdq_path: Path, input_names: list[str],
               dataset) -> tuple[dict | None, str | None]:  # fmt: skip
    """Run ``flexdsa_core.precision.<module>`` on the QDQ model the quantiser just wrote, in place, with the core's
    own interpreter (``{"python": ..., "path": ...}``, never imported here) on the quantiser's calibration
    samples: what it printed, or None and why it did not run or failed."""
    if not core:
        return None, "not asked"
    if not dataset:
        return None, "no calibration samples beyond the one sample input"
    listing = qdq_path.with_name(qdq_path.stem + ".calibration.json")
    listing.write_text(json.dumps({"inputs": input_names, "dataset": dataset}))
    command = [core["python"], "-m", f"flexdsa_core.precision.{module}", str(qdq_path), str(model_path),
               str(listing), str(qdq_path)]  # fmt: skip
    try:
        # ``-m`` puts the working folder first on the path: the folder holding flexdsa_core.
        done = subprocess.run(command, capture_output=True, text=True, cwd=core["path"])
    finally:
        listing.unlink()
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
    except (IndexError, ValueError):
        found = None
    if found is None:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return None, f"it failed: {tail[:300]}"
    return found, None


def _correct_biases(model_path, qdq_path: Path, input_names: list[str], options: dict) -> str | None:
    """Flex-DSA's bias correction of the QDQ model (``correct_biases``; ``_core_step``): what it did in words, or
    None where it was not asked. A correction that fails leaves the quantiser's biases and says so: the build is
    judged on the samples either way."""
    if not options.get("correct_biases"):
        return None
    found, why = _core_step("bias_correction", options["correct_biases"], model_path, qdq_path, input_names,
                            options.get("dataset"))  # fmt: skip
    if found is None:
        return f"biases not corrected ({why}): the quantiser's own kept"
    if not found.get("corrected"):
        return f"biases not corrected: {found.get('why', 'no Conv bias to correct')}"
    return (f"{found['corrected']} Conv biases corrected by the mean error each output carries on "
            f"{found['samples']} calibration samples (Flex-DSA's bias correction)")  # fmt: skip


def _learn_rounding(model_path, qdq_path: Path, input_names: list[str], options: dict) -> str:
    """Flex-DSA's learned rounding (AdaRound) of the QDQ model's int8 weights (``learn_rounding``;
    ``_core_step``), before the bias correction: what it did in words. One that fails leaves nearest rounding."""
    found, why = _core_step("adaround", options.get("learn_rounding"), model_path, qdq_path, input_names,
                            options.get("dataset"))  # fmt: skip
    if found is None:
        return f"weights' rounding not learned ({why}): nearest rounding kept"
    if not found.get("rounded"):
        return f"weights' rounding not learned: {found.get('why', 'no layer was below nearest rounding')}"
    error = found.get("output_error_vs_nearest") or {}
    return (f"{found['rounded']} layers' weight rounding learned on {found['samples']} calibration samples by "
            f"Flex-DSA's AdaRound, output error {error.get('median')} of nearest rounding's, median")  # fmt: skip


def _per_channel_weights(graph, constants: set[str], options: dict) -> dict[str, int]:
    """The constant weights quantised int8 per output channel, each with its channel's axis: every Conv's
    (``conv_per_channel``, axis 0) and every 2-D MatMul/Gemm weight's (``matmul_per_channel``: axis 1 of a
    MatMul's [K, N], axis 0 of a Gemm's transposed [N, K])."""
    found = {}
    shapes = {init.name: list(init.dims) for init in graph.initializer}
    for node in graph.node:
        if len(node.input) < 2 or node.input[1] not in constants:
            continue
        weight = node.input[1]
        if node.op_type == "Conv" and options.get("conv_per_channel"):
            found[weight] = 0
        elif node.op_type in ("MatMul", "Gemm") and options.get("matmul_per_channel") and len(shapes.get(weight, [])) == 2:
            trans_b = next((a.i for a in node.attribute if a.name == "transB"), 0)
            if node.op_type == "Gemm" and next((a.i for a in node.attribute if a.name == "transA"), 0):
                continue
            found[weight] = 0 if node.op_type == "Gemm" and trans_b else 1
    return found


def _describe(options: dict, activation_type: str, uint16_tensors: int = 0) -> str:
    weights = options.get("weight_type", "uint8")
    granularity = "per-channel" if options.get("per_channel") else "per-tensor"
    if options.get("conv_per_channel"):
        granularity += ", Conv's int8 per-channel"
    if options.get("matmul_per_channel"):
        granularity += ", MatMul/Gemm's int8 per-channel"
    if activation_type == "mixed":
        activations = f"uint8 activations, {uint16_tensors} tensor(s) of the sensitive layers at uint16"
    else:
        activations = f"{activation_type} activations"
    if options.get("packed_uint16") and activation_type != "uint16":
        activations += f", {len(options['packed_uint16'])} tensor(s) of a packed output at uint16"
    return f"QDQ: {activations}, {weights} {granularity} weights (get_qnn_qdq_config, MinMax)"


def _qnn_devices():
    import onnxruntime as ort
    import onnxruntime_qnn

    with contextlib.suppress(Exception):  # already registered in this process
        ort.register_execution_provider_library(EP_NAME, onnxruntime_qnn.get_library_path())
    devices = [device for device in ort.get_ep_devices() if device.ep_name == EP_NAME]
    if not devices:
        raise RuntimeError("onnxruntime lists no QNN device after registering onnxruntime-qnn's library")
    return devices[:1]


def _run_cpu(model_path, feeds):
    import onnxruntime as ort

    return ort.InferenceSession(model_path, providers=["CPUExecutionProvider"]).run(None, feeds)


def _min_cosine_samples(reference: list, outputs: list) -> float:
    """Per output, the cosine over every sample at once (as the core's accuracy target judges); the worst."""
    import numpy as np

    if len(outputs) != len(reference):
        return 0.0
    joined_want = [np.concatenate([np.ravel(r[i]) for r in reference]) for i in range(len(reference[0]))]
    joined_got = [np.concatenate([np.ravel(o[i]) for o in outputs]) for i in range(len(reference[0]))]
    return _min_cosine(joined_want, joined_got)


def _min_cosine(reference, outputs) -> float:
    import numpy as np

    cosines = []
    for want, got in zip(reference, outputs, strict=False):
        a, b = np.asarray(want, np.float64).ravel(), np.asarray(got, np.float64).ravel()
        norm = float(np.linalg.norm(a) * np.linalg.norm(b))
        cosines.append(float(a @ b / norm) if norm else 1.0)
    return min(cosines, default=1.0)


# ---- the verbose log --------------------------------------------------------------------------------


def parse_units(log: str) -> list[dict]:
    """Node units as QNN validated them, in log order, each with the GetCapability pass it belongs to: op,
    member node names (the layout transform's ``_token_<n>`` suffix taken off, so they are the names we
    gave), passed, and QNN's reason if failed."""
    units: list[dict] = []
    current, pass_number = None, 0
    for line in log.splitlines():
        if PASS_MARK in line:
            pass_number += 1
            current = None
            continue
        match = UNIT.search(line)
        if match:
            current = {"pass": pass_number, "unit": match["unit"], "passed": match["verdict"] == "PASSED",
                       "nodes": [], "ops": []}  # fmt: skip
            units.append(current)
            continue
        if current is None:
            continue
        member = MEMBER.match(line)
        if member:
            current["nodes"].append(TOKEN_SUFFIX.sub("", member["name"]))
            current["ops"].append(member["op"])
            continue
        reason = REASON.match(line)
        if reason:
            current["reason"] = reason["reason"].strip()
            continue
        if line.strip() and not line.startswith(("\t", " ")):
            current = None  # the next log record ends the unit's block
    return units


def parse_cpu_nodes(log: str) -> set[str]:
    """Names of the nodes ORT's "Node placements" puts on the CPU provider (the last listing)."""
    lines = log.splitlines()
    starts = [i for i, line in enumerate(lines) if line.rstrip().endswith("Node placements")]
    if not starts:
        return set()
    found, provider = set(), None
    for line in lines[starts[-1] + 1 :]:
        placed = PLACED_ON.search(line)
        if placed:
            provider = placed["provider"]
            continue
        node = PLACED_NODE.search(line)
        if node is None or "VerifyEachNodeIsAssignedToAnEp" not in line:
            break
        if provider == "CPUExecutionProvider":
            found.add(node["name"])
    return found


def place_nodes(node_names: set[str], units: list[dict], on_cpu: set[str]) -> tuple[dict, dict]:
    """Each of the core's node names QNN's log mentions -> 'accelerator' or 'cpu', and QNN's reasons. A
    later GetCapability pass overrides an earlier one for the nodes it lists again."""
    placement, reasons = {}, {}
    for unit in units:
        for node in unit["nodes"]:
            if node not in node_names:
                continue  # a Q/DQ node the quantiser added, or a Transpose of the layout transform
            if unit["passed"] and node not in on_cpu:
                placement[node] = "accelerator"
                reasons.pop(node, None)
            else:
                placement[node] = "cpu"
                reasons[node] = unit.get("reason") or (
                    "validated by QNN but left on the CPU provider by ONNX Runtime's partitioner"
                    if unit["passed"]
                    else "QNN validation failed (no reason logged)"
                )
    for node in on_cpu & node_names:
        placement[node] = "cpu"
    return placement, reasons


def place_folded(graph, kept: set[str], placement: dict) -> list[str]:
    """Nodes of the float graph the quantiser removed (a Relu or Clip after a Conv becomes the Conv's output
    quantisation range) run where the node they were folded into runs. Returns their names."""
    producer = {out: node.name for node in graph.node for out in node.output}
    folded = []
    for _ in range(len(graph.node)):
        changed = False
        for node in graph.node:
            if not node.name or node.name in kept or node.name in placement or not node.input:
                continue
            source = producer.get(node.input[0])
            if source in placement:
                placement[node.name] = placement[source]
                folded.append(node.name)
                changed = True
        if not changed:
            break
    return folded


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
