"""The quantisers themselves: ONNX Runtime's static QDQ and dynamic int8 over our fused fp32 model.

``_quantize_static`` (calibrated QDQ in a target's ``Int8Format``, some nodes kept float) and
``_quantize_dynamic`` (MatMuls only, in the form ``cpu_forms.dynamic_form`` gives them); ``_static_recipe``
records how to make a static candidate again from other samples (k-fold); ``_cached_time_shares`` is each
layer's share of the fp32 run time, which orders the layers the searches try.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from flexdsa_core.kernel_timing import machine_fingerprint
from flexdsa_core.precision.costing import PROFILES
from flexdsa_core.precision.cpu_forms import (
    DYNAMIC_OP_TYPES,
    ClassifierHead,
    classifier_head,
    dynamic_form,
    exact_top_k,
)
from flexdsa_core.precision.float_layers import keep_float_layers_float
from flexdsa_core.precision.scoring import PrecisionRun, _cache_read, _cache_write, _digest, _key, _Samples
from flexdsa_core.targets.int8_format import Int8Format

# com.microsoft ops of our fusions that take weights and that onnxruntime.quantization's QDQ registry does
# not know: quantised, their weights would stay float (FusedConv on ResNet-18: 1.05x instead of 1.77x).
QDQ_OPAQUE_WEIGHT_OPS = frozenset(
    {"com.microsoft::FusedConv", "com.microsoft::FusedGemm", "com.microsoft::FusedMatMul", "com.microsoft::Attention"}
)


# Layers whose weight is an initializer and whose work is a dot product: what weight-only int8 quantises.
WEIGHT_COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})


# Runs of each model before the per-op profile's rounds count (caches, ORT's first-run allocations).
PROFILE_WARMUP = 3


# Percentile calibration clips each activation range at this percentile of what the samples showed.
CALIBRATION_PERCENTILE = 99.999


def _quantize_static(fp32: Path, out: Path, samples, cache: Path, fmt: Int8Format, keep: frozenset[str] = frozenset(),
                     method: str = "MinMax", **nodes) -> Path:  # fmt: skip
    """ONNX Runtime's static QDQ of ``fp32`` in ``fmt``, calibrated on ``samples`` by ``method`` (MinMax,
    Percentile, Entropy; the ranges kept in ``cache`` for the next call on the same samples). ``keep``: nodes
    that stay float whatever ``nodes`` asks (the tails of packed outputs, ``packed_tails``). Where ONNX Runtime
    runs the result (cpu-ort, and the vendors' stand-ins ranked here), the weight layers left float are kept
    float at load (``float_layers``); TensorRT's QDQ ships as the quantiser wrote it."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    if nodes.get("nodes_to_quantize") is not None:
        nodes["nodes_to_quantize"] = _with_activations(fp32, nodes["nodes_to_quantize"])
    if keep:
        if nodes.get("nodes_to_quantize") is not None:
            nodes["nodes_to_quantize"] = [name for name in nodes["nodes_to_quantize"] if name not in keep]
        else:
            nodes["nodes_to_exclude"] = sorted(set(nodes.get("nodes_to_exclude") or ()) | keep)
    activations = QuantType.QUInt8 if fmt.activations == "uint8" else QuantType.QInt8
    weights = QuantType.QUInt8 if fmt.weights == "uint8" else QuantType.QInt8
    extra = {"ActivationSymmetric": fmt.symmetric, "WeightSymmetric": fmt.weights == "int8"}
    if method == "Percentile":
        extra["CalibPercentile"] = CALIBRATION_PERCENTILE
    # The histogram calibrators print their progress to stdout: not for a job's log or the CLI's output.
    with contextlib.redirect_stdout(io.StringIO()):
        quantize_static(
            str(fp32), str(out), _Samples(samples), quant_format=QuantFormat.QDQ,
            activation_type=activations, weight_type=weights, per_channel=fmt.per_channel,
            reduce_range=fmt.reduce_range, calibration_cache_path=str(cache.with_suffix(f".{method}.json")),
            calibrate_method=getattr(CalibrationMethod, method), extra_options=extra, **nodes,
        )  # fmt: skip
    if fmt.runs_here or fmt.vendor is not None:  # run by ONNX Runtime here: its layers kept float stay float
        model = onnx.load(str(out))
        if keep_float_layers_float(model):
            onnx.save(model, str(out))
    return out


# Activations the QDQ quantiser folds into the layer before them (the layer's output takes their range).
_FOLDED_ACTIVATIONS = ("Relu", "Clip")


def _with_activations(fp32: Path, names) -> list[str]:
    """``names`` and the Relu or Clip that alone reads each of them. Quantised without it, a Conv's output is
    quantised over its range before the activation (a ReLU6 stem of EfficientNet-Lite0: -30..30, so 0..6
    got a fifth of the levels) instead of the activation's, and the layer looks far more sensitive than it
    is in the model where both are int8 (its relative logit error 0.43 alone against 0.05 with its Clip)."""
    stat = fp32.stat()
    after = _activation_after(str(fp32), stat.st_mtime_ns, stat.st_size)
    listed = list(names)
    return listed + [after[name] for name in listed if name in after and after[name] not in listed]


@functools.lru_cache(maxsize=1)  # one model at a time: the candidates of one compile quantise the same file
def _activation_after(path: str, mtime_ns: int, size: int) -> dict[str, str]:
    """Node name -> the Relu or Clip that alone reads its one output (not a graph output), in the file."""
    model = onnx.load(path, load_external_data=False)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {output.name for output in model.graph.output}
    found = {}
    for node in model.graph.node:
        after = readers.get(node.output[0], []) if len(node.output) == 1 else []
        if len(after) == 1 and after[0].op_type in _FOLDED_ACTIVATIONS and node.output[0] not in outputs:
            found[node.name] = after[0].name
    return found


def _quantize_dynamic(fp32: Path, out: Path, fmt: Int8Format, keep_float: tuple[str, ...] = (),
                      head: ClassifierHead | None = None, require_int8: bool = False) -> Path:  # fmt: skip
    """Dynamic int8 of ``fp32`` in the form ONNX Runtime's fused int8 MatMul takes (``cpu_forms``): every
    MatMul with a constant weight becomes DynamicQuantizeMatMul; the rest stays fp32. With ``head`` (found by
    ``_classifier_head``), that head's top candidates per row are re-scored exactly in fp32 (``exact_top_k``)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # The form drops our value_info (the rewritten graph re-infers its shapes); untyped new tensors are float.
    model, _ = dynamic_form(onnx.load(str(fp32)))
    if require_int8 and not any(node.op_type in DYNAMIC_OP_TYPES for node in model.graph.node):
        raise ValueError("no MatMul with a constant weight: dynamic int8 would quantise nothing (the fp32 model)")
    bare = out.with_name(f"{out.stem}.input.onnx")
    onnx.save(model, str(bare))
    del model
    quantize_dynamic(
        str(bare), str(out), weight_type=QuantType.QInt8, per_channel=False, reduce_range=fmt.reduce_range,
        op_types_to_quantize=list(DYNAMIC_OP_TYPES), nodes_to_exclude=list(keep_float),
        extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
    )  # fmt: skip
    bare.unlink(missing_ok=True)
    if head is not None and head.node not in keep_float:
        onnx.save(exact_top_k(onnx.load(str(out)), head), str(out))
    return out


def _classifier_head(fp32: Path, top1_outputs: list[str]) -> tuple[ClassifierHead | None, str]:
    """The classifier head of ``fp32``'s dynamic form whose top-k ``exact_top_k`` re-scores, or None and why."""
    if not top1_outputs:
        return None, "no output is judged by top-1"
    return classifier_head(dynamic_form(onnx.load(str(fp32)))[0], top1_outputs)


def _weight_layers(quantized: onnx.ModelProto) -> list[tuple[str, str]]:
    """(name, op type) of nodes that take a dequantised initializer: the layers with int8 weights."""
    initializers = {init.name for init in quantized.graph.initializer}
    dequantized_weights = {
        node.output[0]
        for node in quantized.graph.node
        if node.op_type == "DequantizeLinear" and node.input[0] in initializers
    }
    layers = []
    for node in quantized.graph.node:
        if node.op_type in ("DequantizeLinear", "QuantizeLinear"):
            continue
        if any(name in dequantized_weights for name in node.input):
            layers.append((node.name, node.op_type if not node.domain else f"{node.domain}::{node.op_type}"))
    return layers


def _time_shares(source, feed: dict, runs: int, workdir: Path) -> dict[str, float]:
    """Each node's share of the fp32 model's kernel time (ONNX Runtime's profiler, graph as written)."""
    PROFILES["time_shares"] += 1
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    options.enable_profiling = True
    options.profile_file_prefix = str(workdir / "profile")
    source = str(source) if isinstance(source, Path) else source
    sess = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    for _ in range(runs):
        sess.run(None, feed)
    profile = Path(sess.end_profiling())
    totals: Counter = Counter()
    for event in json.loads(profile.read_text()):
        if event.get("cat") == "Node" and event.get("name", "").endswith("_kernel_time"):
            totals[event["name"][: -len("_kernel_time")]] += event.get("dur", 0)
    profile.unlink(missing_ok=True)
    whole = sum(totals.values()) or 1
    return {name: value / whole for name, value in totals.items()}


def _cached_time_shares(run: PrecisionRun, fp32: Path, runs: int = 5) -> dict[str, float]:
    """``_time_shares`` of ``fp32``, kept in the kernel cache under the model's bytes (sha256), the input
    shapes, the runs, ONNX Runtime's version and this machine: a compile of the same model again does not
    profile it again (the shares are a column of the report, no decision rests on them)."""
    canonical = {
        "fp32_time_shares": _digest(fp32),
        "feed": {name: [list(np.shape(a)), np.asarray(a).dtype.name] for name, a in sorted(run.samples[0].items())},
        "runs": runs,
        "runtime": {"ort": ort.__version__, "level": "disabled", "threads": 1},
        "machine": machine_fingerprint(),
    }
    key = _key(run, canonical)
    cached = _cache_read(run, key)
    if isinstance(cached, dict):
        return {str(name): float(share) for name, share in cached.items()}
    shares = _time_shares(fp32, run.samples[0], runs, run.workdir)
    _cache_write(run, key, shares)
    return shares


def _static_recipe(run: PrecisionRun, fp32: Path, cache: Path, fmt: Int8Format, **nodes):
    """A static candidate's recipe: the same quantisation (nodes, method, kept tails) of ``fp32`` from any
    samples, with each fold's ranges in a cache of its own."""
    method = run.method

    def build(samples: list[dict], tag: str, out: Path) -> Path:
        ranges = cache if tag == "fold0" else cache.with_name(f"{cache.stem}.{tag}.json")
        return _quantize_static(fp32, out, samples, ranges, fmt, keep=run.tail(fp32), method=method, **nodes)

    return build
