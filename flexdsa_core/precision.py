"""Precision, after the fp32 pipeline: int8 and mixed on cpu-ort, fp16 on accelerators, judged by accuracy.

Accuracy (``AccuracyTarget``, scored by ``accuracy.score``: per output its task's metric, cosine, top-1 or
per-slice) is judged against the fp32 original on samples the quantiser did not calibrate on: the samples
are split (``holdout.plan``; k-fold when few), every quantiser calibrates on one part (``run.calibration``)
and every decision is taken on the other (``run.judged``); the candidate about to ship is confirmed on every
fold (``_confirm``). A model below the target on the held-out samples is never shipped, whatever it scored on
its calibration samples (both figures are reported). Synthetic samples check numerics only and say so.

**int8 on cpu-ort.** Candidates, each made from our fused fp32 model:

* ``static_qdq``: ``onnxruntime.quantization.quantize_static`` (QDQ, MinMax calibration on the samples),
  u8 activations and s8 per-channel weights, the format ONNX Runtime's x86 int8 kernels take. Without an
  int8 dot-product instruction (AVX-512 VNNI, AVX-VNNI, AMX) the u8 x s8 kernels sum pairs of products in
  16 bits (``vpmaddubsw``) and can saturate: there weights get 7 bits (``reduce_range``); with one, 8.
* ``static_qdq_unfused``: the same, on the model compiled without our fusions whose com.microsoft ops hold
  weights (``QDQ_OPAQUE_WEIGHT_OPS``: the QDQ quantiser knows no com.microsoft op and leaves them, weights
  and all, in float; ONNX Runtime fuses the QDQ graph itself at ORT_ENABLE_ALL). Our other fusions
  (GELU, SkipLayerNorm, MultiHeadAttention...) stay. Which order is faster is measured, not assumed.
* ``dynamic``: ``quantize_dynamic``, s8 per-tensor weights, activations quantised per run, of MatMuls only, in
  the form ONNX Runtime's ``DynamicQuantizeMatMul`` takes (``int8_forms``: our Attention back to a projection
  MatMul + MultiHeadAttention, a tied-weight FusedMatMul to a MatMul with a transposed constant weight).
* ``static_qdq_costed``: the static model of the graph that quantises more layers, with the ops measured
  slower in int8 than in fp32 on this CPU kept float (``int8_costing``: profiled, interleaved, paired). The
  per-op figures are kept in the kernel cache (``int8_cache``): a compile whose ops were all measured before
  on this machine, in this format, does not profile again; ``layers[].timing_source`` says which were.
* ``static_qdq_weights``: only the weight layers (Conv, MatMul, Gemm with initializer weights) in int8;
  residual Adds, LayerNorm, Softmax and attention-score MatMuls float (ViT's residual stream does not fit
  one per-tensor int8 scale: ONNX Runtime's static QDQ of every op keeps a cosine of 0.33 there).

Each is scored, then timed with the fp32 model (and the original) in interleaved paired rounds
(``significance.paired``); the fastest that meets the target and is not significantly slower than fp32
ships (the never-slower guard), else fp32 or a failure naming the most sensitive layers, as asked.

**mixed** (cpu-ort). Sensitivity of a layer (a node with quantised weights) = the accuracy it alone costs:
the model with only that layer quantised, ``1 - min over outputs of min(cosine, top-1 agreement)``. Then the
``k`` most sensitive weight layers stay float for the smallest ``k`` whose static model meets the target,
found by bisection over ``k`` (ops measured slower in int8 are float throughout; when every other op in
int8 misses the target, only weight layers are quantised); then the kept-float layers with the largest
measured int8 gain are tried back one at a time. The calibration ranges are computed once and reused.
Where dynamic int8 of every MatMul misses the target, ``dynamic_mixed`` keeps the most sensitive of them float
in dynamic int8, by the same ranking: the one most sensitive, then the fewest found by bisection.

**A classifier head** (a MatMul with a constant [D, V] weight, V >= 2048, writing a top-1-judged output: an
LM head) gets its top 8 candidates per row re-scored exactly in fp32 after int8 (``int8_forms.exact_top_k``):
its top-1 is then the fp32 head's, and the int8 GEMM still does the bulk. ``dynamic_exact_head`` (dynamic
int8 of every MatMul so) is a candidate where plain ``dynamic`` misses the target; ``dynamic_mixed`` keeps
such a head int8 and ranks only the other MatMuls.

**fp16** (accelerators): float16 weights and arithmetic (ONNX Runtime's float16 converter, keeping float32
graph inputs/outputs under ``keep_io_types``), checked element-wise with the float16 tolerances and by the
accuracy target.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from flexdsa_core.accuracy import describe as _describe
from flexdsa_core.accuracy import metrics_for, score
from flexdsa_core.cache import KernelCache, kernel_key
from flexdsa_core.cost_model import _machine_fingerprint
from flexdsa_core.errors import InvalidOptionsError, ValidationFailedError
from flexdsa_core.holdout import Fold, SplitPlan, plan
from flexdsa_core.int8_cache import CACHED, CostingScope, cached_profile
from flexdsa_core.int8_costing import PROFILES, decide, profile_int8_vs_fp32, quantised_nodes
from flexdsa_core.int8_forms import (
    DYNAMIC_OP_TYPES,
    EXACT_TOP_K,
    ClassifierHead,
    classifier_head,
    dynamic_form,
    exact_top_k,
)
from flexdsa_core.options import AccuracyTarget, OptimizeOptions
from flexdsa_core.significance import KERNEL_MIN_EFFECT, MIN_ROUNDS, MODEL_MIN_EFFECT, paired
from flexdsa_core.validate import DEFAULT_TOLERANCES, latency_samples, owned, session
from flexdsa_core.version import __version__

__all__ = [
    "apply_precision", "check_calibration_source", "check_precision_request", "int8_only", "cpu_int8_features", "int8_format", "samples_dataset", "samples_npz",
    "score", "vendor_verdict",
]  # fmt: skip

# Flags that give the int8 GEMM a dot-product instruction without 16-bit intermediate sums.
_INT8_DOT_FLAGS = ("avx512_vnni", "avx512vnni", "avx_vnni", "amx_int8", "asimddp", "dotprod", "i8mm")
# com.microsoft ops of our fusions that take weights and that onnxruntime.quantization's QDQ registry does
# not know: quantised, their weights would stay float (FusedConv on ResNet-18: 1.05x instead of 1.77x).
QDQ_OPAQUE_WEIGHT_OPS = frozenset(
    {"com.microsoft::FusedConv", "com.microsoft::FusedGemm", "com.microsoft::FusedMatMul", "com.microsoft::Attention"}
)
# Layers whose weight is an initializer and whose work is a dot product: what weight-only int8 quantises.
WEIGHT_COMPUTE_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
# After the bisection, at most this many kept-float layers (largest measured int8 gain first) are tried
# back in int8, one quantise-and-score each.
READMIT_LAYERS = 8
# Sensitivity ranks layers: this many samples order them as well as all would, at a fraction of the runs.
SENSITIVITY_SAMPLES = 8
# Runs of each model before the per-op profile's rounds count (caches, ORT's first-run allocations).
PROFILE_WARMUP = 3
# Percentile calibration clips each activation range at this percentile of what the samples showed.
CALIBRATION_PERCENTILE = 99.999
# Calibration methods tried beyond MinMax when the all-int8 model misses the target (ONNX Runtime's).
CALIBRATION_METHODS = ("Percentile", "Entropy")
# Ops an output's tail may pass through back to the layers that compute it (no weights: cheap in float).
_TAIL_OPS = frozenset({"Concat", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Transpose", "Add", "Sub", "Mul", "Div",
                       "Softmax", "Sigmoid", "Slice", "Gather", "Split", "Expand", "Identity", "Cast", "Tile"})  # fmt: skip


def cpu_int8_features() -> dict:
    """This CPU's vector flags as ONNX Runtime's kernels see them, and the int8 format chosen for it."""
    fingerprint = _machine_fingerprint()
    flags = fingerprint.rsplit("isa=", 1)[-1].split(",")
    dot = [flag for flag in _INT8_DOT_FLAGS if flag in flags]
    x86 = any(flag.startswith(("avx", "sse")) for flag in flags)
    return {
        "flags": flags,
        "int8_dot_product": dot,
        "activations": "uint8",
        "weights": "int8, per channel",
        "reduce_range": bool(x86 and not dot),
        "why": (
            f"{', '.join(dot)}: full 8-bit weights"
            if dot
            else "no VNNI/AMX: u8 x s8 products are summed in 16 bits and can saturate, so weights use 7 bits "
            "(reduce_range)"
        ),
    }


def check_precision_request(options: OptimizeOptions, target, buckets: int | None = None) -> None:
    """Refuse, before any work, a precision this target cannot compute (its ``dtypes``, from the sourced facts):
    fp16 on cpu-ort (float16 through casts), on the KV260 DPU (int8 only) or on the XDNA 2 NPU (bfloat16, not
    float16); int8/mixed where the part has no int8. Every shape bucket gets the precision (``buckets`` is
    accepted for callers that pass it)."""
    if options.precision == "fp32":
        return
    calibrated = bool(getattr(target, "calibrated", False))
    if options.precision == "fp16" and calibrated:
        raise InvalidOptionsError(
            "precision 'fp16' is for accelerator targets: ONNX Runtime's CPU kernels compute float16 through "
            "casts and would be slower than fp32. Use 'int8' or 'mixed' on cpu-ort.",
            details={"precision": "fp16", "target": target.name},
        )
    dtypes = list(getattr(target, "dtypes", None) or [])
    wanted = "float16" if options.precision == "fp16" else "int8"
    if calibrated or not dtypes or wanted in dtypes:
        return
    floats = [d for d in dtypes if d in ("bfloat16", "float32")]
    notes = getattr(target, "quantization", None) or {}
    if wanted == "float16" and "bfloat16" in floats:
        advice = (
            f"its half-precision type is bfloat16 ({notes.get('bfloat16', 'no float16 on the part')}): use "
            "precision 'fp32' for that, or 'int8'/'mixed'"
        )
    elif wanted == "float16":
        advice = "use precision 'int8' or 'mixed' (quantised with the target's own scheme)"
    else:
        advice = "use precision 'fp32' or 'fp16'"
    raise InvalidOptionsError(
        f"unsupported dtype on target: {target.name} computes {', '.join(dtypes)}, not {wanted} "
        f"(precision {options.precision!r}); {advice}.",
        details={"precision": options.precision, "target": target.name, "target_dtypes": dtypes},
    )


def int8_only(target) -> bool:
    """The part computes int8 and nothing else (the KV260's DPU): every model it runs is quantised."""
    dtypes = list(getattr(target, "dtypes", None) or [])
    return bool(dtypes) and all(dtype in ("int8", "uint8", "int4") for dtype in dtypes)


def check_calibration_source(options: OptimizeOptions, target, has_samples: bool) -> None:
    """Refuse, before any work, an int8-only target without calibration samples: it would quantise the model
    on synthetic inputs and claim an accuracy it never measured. ``allow_synthetic_calibration`` lets it
    through (with a warning, ``synthetic_calibration_warning``)."""
    if has_samples or options.allow_synthetic_calibration or not int8_only(target):
        return
    raise InvalidOptionsError(
        f"{target.name} computes int8 only, so every model is quantised for it, and quantising needs calibration "
        "samples of your data: send them as the 'calibration' file (flexdsa optimize --calibration samples.npz: "
        "one array per model input, named as the input, samples stacked on the first axis) with precision 'int8' "
        "or 'mixed'. To quantise on seeded random inputs instead (numerics only, no accuracy claim), set "
        "allow_synthetic_calibration: true.",
        details={"target": target.name, "target_dtypes": list(target.dtypes), "fix": "calibration samples"},
    )


def synthetic_calibration_warning(target) -> str:
    return (
        f"{target.name} computes int8 only and no calibration samples were given (allow_synthetic_calibration): "
        "the model was quantised on seeded random inputs, which check numerics only and make no accuracy claim. "
        "Send samples of your data (the 'calibration' .npz) for an accuracy check on them"
    )


# ---------------------------------------------------------------------------------------------- accuracy
def _classifier_outputs(reference: dict[str, np.ndarray], accuracy: AccuracyTarget) -> list[str]:
    """The outputs judged by top-1 (their metric, named or by their look)."""
    return [name for name, spec in metrics_for(reference, accuracy).items() if spec.metric == "top1"]


def _outputs(source, samples: list[dict], level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> list[dict]:
    sess = session(source, level=level)
    names = [o.name for o in sess.get_outputs()]
    # A float16 model without keep_io_types takes float16: the same samples, cast (as its caller would).
    halves = {i.name for i in sess.get_inputs() if i.type == "tensor(float16)"}
    feeds = [{k: v.astype(np.float16) if k in halves else v for k, v in feed.items()} for feed in samples]
    # Kept by the caller: copied out of the session's arena (``owned``), which then goes with the session.
    return [{n: owned(v) for n, v in zip(names, sess.run(names, feed), strict=True)} for feed in feeds]


# ---------------------------------------------------------------------------------------------- int8
class _Samples:
    """``onnxruntime.quantization.CalibrationDataReader``'s protocol over our list of feeds."""

    def __init__(self, samples: list[dict]) -> None:
        self._iterator = iter(samples)

    def get_next(self):
        return next(self._iterator, None)

    def __iter__(self):
        return self

    def __next__(self):
        item = self.get_next()
        if item is None:
            raise StopIteration
        return item


def _named(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every node named, uniquely: the quantiser includes and excludes layers by node name."""
    seen: set[str] = set()
    for index, node in enumerate(model.graph.node):
        if not node.name or node.name in seen:
            node.name = f"{node.op_type}_{index}"
        seen.add(node.name)
    return model


@dataclass(frozen=True)
class Int8Format:
    """How a target wants its int8, as ONNX Runtime QDQ: activation and weight types, symmetry, granularity.

    Where the vendor's own toolchain quantises (``vendor`` set: QNN, RKNN, Quark, AMCT), this QDQ is only its
    stand-in here, close to the vendor's scheme, used to rank layers by sensitivity and to find how many must
    stay float (``mixed``); what ships is the vendor's own quantisation, judged by its simulator/emulator."""

    name: str
    activations: str  # "uint8" or "int8"
    symmetric: bool  # activations symmetric around zero (zero point 0), as TensorRT requires
    reduce_range: bool  # 7-bit weights (x86 without VNNI, see the module docstring)
    runs_here: bool  # the target is this machine: candidates are timed, dynamic quantisation is one of them
    weights: str = "int8"  # "int8" or "uint8" (QNN's default)
    per_channel: bool = True
    vendor: str | None = None  # the vendor toolchain that quantises for real (None: this QDQ ships)
    float_as: str = "float32"  # what a layer kept out of int8 becomes on the target

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


# The ONNX Runtime QDQ that stands in for each vendor quantiser when layers are ranked here (by adapter name).
_VENDOR_FORMATS = {
    "qualcomm": Int8Format(
        "QNN QDQ (get_qnn_qdq_config): uint8 activations, uint8 per-tensor weights, asymmetric; the layers mixed "
        "keeps out of uint8 get uint16 activations (a16w8)", "uint8", False, False, False,
        weights="uint8", per_channel=False, vendor="qualcomm", float_as="uint16 activations (a16w8)",
    ),
    "rockchip": Int8Format(
        "RKNN w8a8 (rknn-toolkit2's own quantiser on our dataset.txt): asymmetric int8 activations, per-channel "
        "int8 weights; mixed's float layers go to its hybrid quantisation", "uint8", False, False, False,
        vendor="rockchip", float_as="float16 (rknn hybrid quantisation)",
    ),
    "amd": Int8Format(
        "AMD Quark XINT8 (CNN: power-of-two scales) or A8W8 (transformer): symmetric int8, per-tensor", "int8",
        True, False, False, per_channel=False, vendor="amd", float_as="float (excluded from Quark's quantisation)",
    ),
    "xilinx": Int8Format(
        "AMD Quark XINT8: symmetric int8, power-of-two scales, per-tensor (the DPU's only datatype)", "int8", True,
        False, False, per_channel=False, vendor="amd", float_as="float, in a CPU subgraph on the Cortex-A53s",
    ),
    "huawei": Int8Format(
        "AMCT-style int8 (the vendor step's own calibration on our dataset): asymmetric activations, per-channel "
        "weights", "uint8", False, False, False, vendor="huawei", float_as="float16",
    ),
}  # fmt: skip


def int8_format(target) -> Int8Format | None:
    """The target's int8 format (for a vendor-quantised target, the stand-in QDQ with ``vendor`` set); None for
    a target nobody here knows how to quantise for."""
    if getattr(target, "calibrated", False):  # cpu-ort: ONNX Runtime's x86/ARM kernels, u8 activations
        return Int8Format("onnxruntime u8s8 QDQ", "uint8", False, cpu_int8_features()["reduce_range"], True)
    if str(getattr(target, "vendor", "")).lower() == "nvidia":  # TensorRT: symmetric s8 QDQ only
        return Int8Format("TensorRT symmetric s8s8 QDQ", "int8", True, False, False)
    return _VENDOR_FORMATS.get(str(getattr(target, "adapter", "")))


def packed_tails(model: onnx.ModelProto, accuracy: AccuracyTarget) -> dict:
    """The outputs that pack unlike quantities, and the nodes kept float so each quantity keeps its own scale.

    A packed output is one the user judges by ``slices``, or one a ``Concat`` assembles from computed parts
    (boxes and scores stacked: YOLO-style heads, ``[x1, y1, x2, y2, score]``). Static QDQ gives a Concat one
    scale for all its inputs, so scores in 0..1 beside boxes in pixels round to a few levels. Its tail, every
    weightless node between the output and the layers that compute its parts, stays float (elementwise work,
    cheap); the layers themselves stay int8, each with its own output scale."""
    producers = {out: node for node in model.graph.node for out in node.output}
    initializers = {init.name for init in model.graph.initializer}
    constants = {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    named = {name for name, spec in (accuracy.outputs or {}).items() if spec.metric == "slices"}
    found: dict = {"nodes": set(), "outputs": {}}
    for output in model.graph.output:
        tail, stack, concat = [], [output.name], False
        while stack:
            node = producers.get(stack.pop())
            if node is None or node.op_type not in _TAIL_OPS or node.name in tail:
                continue
            tail.append(node.name)
            computed = [i for i in node.input if i and i not in initializers and i not in constants]
            concat |= node.op_type == "Concat" and len(computed) > 1
            # Through a Concat to each part; through elementwise ops only along a single computed input (a
            # residual Add of two computed branches is the network itself, not a head's decode).
            if node.op_type == "Concat" or len(computed) == 1:
                stack.extend(computed)
        if tail and (concat or output.name in named):
            why = "judged by slices" if output.name in named else "a Concat packs its computed parts"
            found["outputs"][output.name] = {"kept_float": tail, "why": why}
            found["nodes"].update(tail)
    found["nodes"] = sorted(found["nodes"])
    return found


def _quantize_static(fp32: Path, out: Path, samples, cache: Path, fmt: Int8Format, keep: frozenset[str] = frozenset(),
                     method: str = "MinMax", **nodes) -> Path:  # fmt: skip
    """ONNX Runtime's static QDQ of ``fp32`` in ``fmt``, calibrated on ``samples`` by ``method`` (MinMax,
    Percentile, Entropy; the ranges kept in ``cache`` for the next call on the same samples). ``keep``: nodes
    that stay float whatever ``nodes`` asks (the tails of packed outputs, ``packed_tails``)."""
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

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
    return out


def _quantize_dynamic(fp32: Path, out: Path, fmt: Int8Format, keep_float: tuple[str, ...] = (),
                      head: ClassifierHead | None = None, require_int8: bool = False) -> Path:  # fmt: skip
    """Dynamic int8 of ``fp32`` in the form ONNX Runtime's fused int8 MatMul takes (``int8_forms``): every
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
        "machine": _machine_fingerprint(),
    }
    key = _key(run, canonical)
    cached = _cache_read(run, key)
    if isinstance(cached, dict):
        return {str(name): float(share) for name, share in cached.items()}
    shares = _time_shares(fp32, run.samples[0], runs, run.workdir)
    _cache_write(run, key, shares)
    return shares


def _digest(source: bytes | Path) -> str:
    if not isinstance(source, Path):
        return hashlib.sha256(source).hexdigest()
    digest = hashlib.sha256()
    with open(source, "rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _key(run: PrecisionRun, canonical: dict) -> str:
    target = run.target
    return kernel_key(canonical, str(getattr(target, "name", "")), str(getattr(target, "version", "")), __version__)


def _cache_read(run: PrecisionRun, key: str):
    try:
        raw = run.cache.get(key) if run.cache is not None else None
        return json.loads(raw) if raw is not None else None
    except Exception:  # noqa: BLE001 - a broken cache (or entry) is a cache that misses
        return None


def _cache_write(run: PrecisionRun, key: str, entry) -> None:
    if run.cache is not None:
        try:
            run.cache.put(key, json.dumps(entry).encode())
        except Exception:  # noqa: BLE001 - a cache that cannot write is a cache that misses next time
            pass


@dataclass
class _Candidate:
    name: str
    path: Path
    how: str
    accuracy: dict = field(default_factory=dict)
    timing: dict | None = None
    ratio: float | None = None
    verdict: str | None = None
    error: str | None = None
    # The nodes this candidate asks the quantiser to compute in int8 (None: every one it can).
    int8_nodes: frozenset[str] | None = None
    # How to make it again from other calibration samples: ``recipe(samples, fold_tag, out) -> out`` (k-fold).
    recipe: object = None
    # Its figures on the samples it calibrated on (reported beside the held-out ``accuracy``).
    calibration_accuracy: dict | None = None

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "how": self.how,
            "accuracy": self.accuracy,
            **({"calibration_accuracy": self.calibration_accuracy} if self.calibration_accuracy else {}),
            "meets_target": bool(self.accuracy.get("ok")),
            "time_ratio_vs_fp32": None if self.ratio is None else round(self.ratio, 4),
            "verdict_vs_fp32": self.verdict,
            "timing_vs_fp32": self.timing,
            **({"error": self.error} if self.error else {}),
        }


@dataclass
class PrecisionRun:
    """What ``apply_precision`` needs from the optimizer: the fp32 result and how to make more of it."""

    options: OptimizeOptions
    target: object
    original: bytes | Path
    fp32_model: ir.Model
    samples: list[dict]
    synthetic: bool
    workdir: Path
    # The first bucket's model compiled with the com.microsoft fusions off (None: not available).
    unfused_model: ir.Model | None = None
    # The optimizer's progress callback (stage, fraction, message): also where a cancel request lands.
    progress: object = None
    # The job's kernel cache: per-op int8/fp32 timings are kept there as kernel measurements are (``int8_cache``).
    cache: KernelCache | None = None
    # How ``samples`` split between calibrating and judging (``holdout.plan``; set by ``apply_precision``), and
    # the first fold's two parts: every quantiser calibrates on ``calibration``, every decision is on ``judged``.
    split: SplitPlan | None = None
    calibration: list[dict] = field(default_factory=list)
    judged: list[dict] = field(default_factory=list)
    # The calibration method of the static candidates (MinMax; Percentile or Entropy where they judge better).
    method: str = "MinMax"
    _tails: dict = field(default_factory=dict)
    _reference: list[dict] | None = None
    _calibration_reference: list[dict] | None = None

    def use_fold(self, index: int) -> None:
        fold = self.split.folds[index]
        self.calibration = [self.samples[i] for i in fold.calibrate]
        self.judged = [self.samples[i] for i in fold.judge]
        self._reference = self._calibration_reference = None

    def calibration_reference(self) -> list[dict]:
        """The original model's outputs on the calibration samples (graph as written)."""
        if self._calibration_reference is None:
            self._calibration_reference = _outputs(
                self.original, self.calibration, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            )
        return self._calibration_reference

    def reference(self) -> list[dict]:
        """The original model's outputs on the judged samples (graph as written)."""
        if self._reference is None:
            self._reference = _outputs(self.original, self.judged, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
        return self._reference

    def tail(self, fp32: Path) -> frozenset[str]:
        """The nodes of ``fp32`` that stay float in every static candidate: the tails of its packed outputs."""
        if fp32 not in self._tails:
            self._tails[fp32] = packed_tails(onnx.load(str(fp32), load_external_data=False), self.options.accuracy)
        return frozenset(self._tails[fp32]["nodes"])

    def packed(self, fp32: Path) -> dict:
        self.tail(fp32)
        return self._tails[fp32]["outputs"]

    def measured_on(self, judged: bool = True) -> str:
        """What a figure was measured on, in words."""
        kind = "synthetic random inputs (numerics only: no accuracy claim)" if self.synthetic else "samples of yours"
        if self.split is None or self.split.mode == "none":
            return f"{len(self.samples)} calibration {kind}: none could be held out"
        if not judged:
            return f"the {len(self.calibration)} calibration {kind} (the ones the quantiser saw)"
        if self.split.mode == "kfold":
            return f"{len(self.judged)} held-out {kind} (fold 1 of {len(self.split.folds)})"
        return f"{len(self.judged)} held-out {kind}, never calibrated on"

    def report(self, fraction: float, message: str) -> None:
        if self.progress is not None:
            self.progress("precision", fraction, message)

    @property
    def judge_level(self) -> ort.GraphOptimizationLevel:
        """How a quantised model is run to judge its accuracy. On cpu-ort the int8 kernels of this CPU are what
        ships, so they are what is judged (ORT_ENABLE_ALL: QDQ fused into QLinearConv, MatMulInteger...). A
        vendor's int8 model is judged as the quantisation it describes (ORT_DISABLE_ALL: each Q/DQ pair run as
        written, the op in float on int8-grid values), which is what an accelerator's int32 accumulation
        computes; this CPU's int8 kernels would add their own error (without AVX-512 VNNI, ONNX Runtime's
        u8s8 path saturates 16-bit pair sums), so the verdict would depend on the machine that judged it."""
        fmt = int8_format(self.target)
        if fmt is None or fmt.runs_here:
            return ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        return ort.GraphOptimizationLevel.ORT_DISABLE_ALL


def _save(model: ir.Model | onnx.ModelProto, path: Path) -> Path:
    proto = ir.to_proto(model) if isinstance(model, ir.Model) else model
    onnx.save(_named(proto), str(path))
    return path


def _time_against_fp32(run: PrecisionRun, fp32: Path, candidates: list[_Candidate]) -> dict:
    """Interleaved paired rounds of the original, fp32 and every candidate; each candidate's comparison
    with fp32 (and fp32's with the original) on the first calibration sample."""
    models: dict = {"original": run.original, "fp32": fp32}
    models.update({c.name: c.path for c in candidates})
    rounds = max(run.options.latency_repeats, MIN_ROUNDS)
    feed = run.samples[0]
    key = _key(run, {
        "int8_candidates_vs_fp32": {name: _digest(source) for name, source in sorted(models.items())},
        "feed": {name: [list(np.shape(a)), np.asarray(a).dtype.name, _digest(np.ascontiguousarray(a).tobytes())]
                 for name, a in sorted(feed.items())},
        "rounds": rounds,
        "min_effect": MODEL_MIN_EFFECT,
        "runtime": {"ort": ort.__version__, "level": "all", "threads": 1},
        "machine": _machine_fingerprint(),
    })  # fmt: skip
    cached = _cache_read(run, key)
    from_cache = isinstance(cached, dict) and set(cached) == set(models)
    samples = cached if from_cache else latency_samples(models, feed, repeats=rounds)
    for candidate in candidates:
        comparison = paired(samples["fp32"], samples[candidate.name], min_effect=MODEL_MIN_EFFECT)
        candidate.timing = comparison.as_dict()
        candidate.ratio, candidate.verdict = comparison.ratio, comparison.verdict
        versus_original = paired(samples["original"], samples[candidate.name], min_effect=MODEL_MIN_EFFECT)
        candidate.timing["speedup_vs_original"] = round(1.0 / versus_original.ratio, 4)
        candidate.timing["vs_original"] = versus_original.as_dict()  # the headline's interval and verdict
    fp32_vs_original = paired(samples["original"], samples["fp32"], min_effect=MODEL_MIN_EFFECT)
    # Kept only when a candidate may ship (``_fast_enough``): these same models are then picked alike
    # by the next compile; "nothing is as fast as fp32" is never kept, so that fallback rests on fresh timings.
    if not from_cache and any(_fast_enough(c) for c in candidates):
        _cache_write(run, key, samples)
    return {
        "engine": "onnxruntime CPUExecutionProvider, ORT_ENABLE_ALL, 1 thread",
        # These models' rounds on this machine read from the kernel cache (timed by an earlier compile).
        "from_kernel_cache": from_cache,
        "interleaved": True,
        "rounds": fp32_vs_original.rounds,
        "input_shapes": {k: list(v.shape) for k, v in run.samples[0].items()},
        "original_s": fp32_vs_original.first_s,
        "fp32_s": fp32_vs_original.second_s,
    }


def _pick(candidates: list[_Candidate], measured: bool) -> _Candidate | None:
    """The fastest candidate that meets the target, is not significantly slower than fp32 and whose median time
    ratio to fp32 is a gain (at most 1 - MODEL_MIN_EFFECT): a lower precision costs accuracy, so it ships only
    for speed; a tie at a ratio above that (a "lower precision" 6% slower than fp32 on a noisy run) does not."""
    good = [c for c in candidates if c.accuracy.get("ok") and c.error is None]
    if measured:
        good = [c for c in good if _fast_enough(c)]
        return min(good, key=lambda c: c.ratio, default=None)
    return good[0] if good else None


def _fast_enough(candidate: _Candidate) -> bool:
    """Measured not significantly slower than fp32, with a median time ratio of at most 1 - MODEL_MIN_EFFECT."""
    return candidate.verdict != "slower" and candidate.ratio is not None and candidate.ratio <= 1 - MODEL_MIN_EFFECT


def _static_recipe(run: PrecisionRun, fp32: Path, cache: Path, fmt: Int8Format, **nodes):
    """A static candidate's recipe: the same quantisation (nodes, method, kept tails) of ``fp32`` from any
    samples, with each fold's ranges in a cache of its own."""
    method = run.method

    def build(samples: list[dict], tag: str, out: Path) -> Path:
        ranges = cache if tag == "fold0" else cache.with_name(f"{cache.stem}.{tag}.json")
        return _quantize_static(fp32, out, samples, ranges, fmt, keep=run.tail(fp32), method=method, **nodes)

    return build


def _confirm(run: PrecisionRun, candidate: _Candidate) -> bool:
    """The candidate about to ship, judged beyond the first fold. ``split``: its figures on the calibration
    samples are added (the held-out ones decided). ``kfold``: made again for every other fold from that fold's
    calibration samples and judged on its held-out ones; the held-out figure pools all folds (every sample
    judged once by a model that never saw it) and decides; the model that ships is then calibrated on every
    sample (its figure on them is the calibration figure). Returns whether the pooled figure holds."""
    accuracy = run.options.accuracy
    level = run.judge_level
    split = run.split
    if split.mode != "kfold" or candidate.recipe is None:
        if candidate.calibration_accuracy is None:
            _score_on_calibration(run, candidate)
        return bool(candidate.accuracy.get("ok"))
    judged_ids, reference, got = [], [], []
    for index, fold in enumerate(split.folds):
        feeds = [run.samples[i] for i in fold.judge]
        if index == 0:
            path = candidate.path
        else:
            run.report(0.9, f"{candidate.name}: judging fold {index + 1} of {len(split.folds)}")
            path = candidate.recipe([run.samples[i] for i in fold.calibrate], f"fold{index}",
                                    run.workdir / f"{candidate.name}.fold{index}.onnx")  # fmt: skip
        judged_ids.extend(fold.judge)
        reference.extend(_outputs(run.original, feeds, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL))
        got.extend(_outputs(path, feeds, level=level))
    pooled = score(reference, got, accuracy)
    pooled["measured_on"] = (
        f"all {len(judged_ids)} samples, each held out from the model that judged it ({len(split.folds)}-fold)"
    )
    pooled["first_fold"] = {k: candidate.accuracy.get(k) for k in ("ok", "loss", "samples")}
    candidate.accuracy = pooled
    if not pooled["ok"]:
        return False
    final = candidate.recipe(run.samples, "all", run.workdir / f"{candidate.name}.all.onnx")
    candidate.path = final
    candidate.calibration_accuracy = score(
        _outputs(run.original, run.samples, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
        _outputs(final, run.samples, level=level), accuracy,
    )  # fmt: skip
    candidate.calibration_accuracy["measured_on"] = f"all {len(run.samples)} samples, the ones the shipped model calibrated on"
    return True


def _sensitivity(run, fp32: Path, layers, reference, cache: Path, fmt: Int8Format) -> dict[str, dict]:
    """Each layer quantised alone (the rest float): the accuracy it costs by itself, on the first
    ``SENSITIVITY_SAMPLES`` samples (a ranking; the chosen model is judged on all of them)."""
    samples, reference = run.judged[:SENSITIVITY_SAMPLES], reference[:SENSITIVITY_SAMPLES]
    result = {}
    for index, (name, _) in enumerate(layers):
        run.report(0.3 + 0.5 * index / max(len(layers), 1), f"sensitivity of layer {index + 1}/{len(layers)}: {name}")
        out = run.workdir / f"only_{index}.onnx"
        _quantize_static(fp32, out, run.calibration, cache, fmt, keep=run.tail(fp32), method=run.method, nodes_to_quantize=[name])
        result[name] = score(reference, _outputs(out, samples, level=run.judge_level), run.options.accuracy)
        out.unlink(missing_ok=True)
    return result


def _cosine_kept(accuracy_score: dict) -> float:
    """The worst output cosine of a score (1.0 where no output has one)."""
    return min((entry["cosine"] for entry in accuracy_score["outputs"].values() if "cosine" in entry), default=1.0)


def _readmit(run, fp32, cache, fmt, reference, kept: list[str], chosen: frozenset[str], gains: dict[str, float]):
    """After the bisection: the kept-float layers that gain most from int8 (measured), tried back in int8
    one at a time, largest gain first; each stays int8 if the target still holds. Bisection over one
    ranking assumes the ranking is right; this recovers speed where it was not."""
    order = sorted((name for name in kept if gains.get(name, 0.0) > 0), key=lambda name: -gains[name])
    outcome, best = [], None
    for index, name in enumerate(order[:READMIT_LAYERS]):
        trial = chosen | {name}
        out = run.workdir / f"mixed_readmit_{index}.onnx"
        _quantize_static(fp32, out, run.calibration, cache, fmt, keep=run.tail(fp32), method=run.method, nodes_to_quantize=sorted(trial))
        accuracy = score(reference, _outputs(out, run.judged, level=run.judge_level), run.options.accuracy)
        outcome.append({"layer": name, "gain_ms": round(gains[name], 4), "ok": accuracy["ok"], "loss": accuracy["loss"]})
        if accuracy["ok"]:
            chosen, best = trial, (out, accuracy)
    return chosen, best, outcome


def _mixed(run, fp32, layers, reference, cache, fmt, full: _Candidate, slower: frozenset[str],
           gains: dict[str, float] | None = None):  # fmt: skip
    """The fewest most-sensitive weight layers kept float so that the static model meets the target.

    ``full`` is every quantisable op in int8 except those measured slower (``slower``). When it misses the
    target, the search quantises the weight layers only (Conv, MatMul, Gemm with an initializer weight):
    activation-only ops (residual Adds, LayerNorm, Softmax, attention-score MatMuls) stay float, so with
    every weight layer excluded the model is the fp32 one and keeping more layers float always reaches the
    target."""
    sensitivity = _sensitivity(run, fp32, layers, reference, cache, fmt)
    # Ties in loss are common where top-1 decides it (one flipped sample of 8 each): the cosine lost breaks
    # them; equal on both keeps graph order (sorted is stable).
    ranked = sorted(layers, key=lambda layer: (-sensitivity[layer[0]]["loss"], _cosine_kept(sensitivity[layer[0]])))
    tried: dict[int, dict] = {}
    path_of: dict[int, Path] = {}
    chosen_of: dict[int, frozenset[str] | None] = {}

    def attempt(keep_float: int) -> dict:
        if keep_float not in tried:
            chosen = [name for name, _ in ranked[keep_float:] if name not in slower]
            chosen_of[keep_float] = frozenset(chosen)
            if not chosen:  # nothing left in int8: the fp32 model
                tried[keep_float] = {"ok": True, "loss": 0.0, "outputs": {}}
                return tried[keep_float]
            out = run.workdir / f"mixed_{keep_float}.onnx"
            _quantize_static(fp32, out, run.calibration, cache, fmt, keep=run.tail(fp32), method=run.method, nodes_to_quantize=chosen)
            tried[keep_float] = score(reference, _outputs(out, run.judged, level=run.judge_level), run.options.accuracy)
            path_of[keep_float] = out
        return tried[keep_float]

    lo, hi = 0, len(ranked)  # invariant: lo misses the target; hi (everything float: fp32) meets it
    scope = "weight layers"
    if full.error is None and full.accuracy.get("ok"):  # every op int8 (bar the slower) meets the target
        hi, scope = 0, "every quantisable op"
        tried[0], path_of[0], chosen_of[0] = full.accuracy, full.path, full.int8_nodes
    elif not attempt(0)["ok"]:
        tried[hi] = {"ok": True, "loss": 0.0, "outputs": {}}  # every weight layer float: the fp32 model
        hi = _bisect_float_layers(attempt, lo, hi)
    else:
        hi = 0
    keep = hi
    readmitted: list[dict] = []
    if gains and keep > 0:
        kept = [name for name, _ in ranked[:keep]]
        chosen, best, readmitted = _readmit(
            run, fp32, cache, fmt, reference, kept, chosen_of.get(keep) or frozenset(), gains
        )
        if best is not None:
            chosen_of[keep], path_of[keep], tried[keep] = chosen, best[0], best[1]
    back = sum(entry["ok"] for entry in readmitted)
    measured = f"; {len(slower)} measured slower in int8 kept float" if slower else ""
    measured += f"; {back} of them back in int8 by measured gain" if back else ""
    candidate = _Candidate(
        "mixed", path_of.get(keep, run.workdir / "mixed_none.onnx"),
        f"static QDQ of {scope}, the {keep} most sensitive of {len(ranked)} weight layers kept float{measured}",
        accuracy=tried[keep], int8_nodes=chosen_of.get(keep),
    )  # fmt: skip
    if keep not in path_of:
        candidate.error = "no weight layer can be int8 within the accuracy target: the mixed model is the fp32 one"
    reasons = {}
    back_in = {entry["layer"]: entry for entry in readmitted if entry["ok"]}
    for rank, (name, _) in enumerate(ranked[:keep]):
        loss = sensitivity[name]["loss"]
        if name in back_in:
            reasons[name] = (
                f"int8: rank {rank + 1} of {len(ranked)} by sensitivity (loss {loss:.4f} alone) and kept float by "
                f"the bisection, then tried back in int8 for its measured gain ({back_in[name]['gain_ms']:.3f} ms): "
                "the target still holds"
            )
            continue
        reason = f"kept float: rank {rank + 1} of {len(ranked)} by sensitivity (loss {loss:.4f} quantised alone)"
        short = tried.get(keep - 1)
        if short is not None:
            reason += (
                f"; with only the {keep - 1} most sensitive layers in float the model misses the target "
                f"({_describe(short, run.options.accuracy)})"
            )
        reasons[name] = reason
    search = {
        "keep_float": keep,
        "scope": scope,
        "measured_slower": sorted(slower),
        "readmitted": readmitted,
        "tried": {str(k): {"ok": v["ok"], "loss": v["loss"]} for k, v in tried.items()},
    }
    if scope == "weight layers":
        search["why_weight_layers"] = (
            f"with every quantisable op in int8 the model misses the target ({_describe(full.accuracy, run.options.accuracy)})"
            if full.error is None else f"the all-int8 model failed: {full.error}"
        )  # fmt: skip
    return candidate, sensitivity, reasons, search


def _float_islands(run, fp32: Path, layers, sensitivity: dict, cache: Path, fmt: Int8Format, slower: frozenset[str],
                   full: _Candidate) -> _Candidate:  # fmt: skip
    """Every quantisable op in int8 (bar those measured slower) except the ``k`` most sensitive weight layers,
    which stay float islands, for the smallest ``k`` whose model meets the target (bisection; ``full`` is
    ``k = 0`` and missed it). ``mixed`` keeps every activation-only op float once the all-int8 model misses
    (its weight-only scope); on a CNN that costs a Q/DQ pair around every layer, and the weight-only model ran
    slower than fp32 (EfficientNet-Lite0: 1.09x its time) where a few float islands keep the int8 chain."""
    ranked = sorted((name for name, _ in layers), key=lambda n: (-sensitivity[n]["loss"], _cosine_kept(sensitivity[n])))
    tried: dict[int, dict] = {0: full.accuracy}

    def attempt(keep: int) -> dict:
        if keep not in tried:
            out = run.workdir / f"islands_{keep}.onnx"
            excluded = sorted(slower | set(ranked[:keep]))
            _quantize_static(fp32, out, run.calibration, cache, fmt, keep=run.tail(fp32), method=run.method,
                             nodes_to_exclude=excluded)  # fmt: skip
            tried[keep] = score(run.reference(), _outputs(out, run.judged, level=run.judge_level), run.options.accuracy)
        return tried[keep]

    candidate = _Candidate("mixed_islands", run.workdir / "mixed_islands.onnx", "")
    if not ranked or not attempt(len(ranked))["ok"]:
        candidate.error = (
            "with every weight layer float the other int8 ops still miss the target: no float-island model "
            "(the weight-only scope of 'mixed' applies)"
        )
        return candidate
    keep = _bisect_float_layers(attempt, 0, len(ranked))
    (run.workdir / f"islands_{keep}.onnx").replace(candidate.path)
    candidate.accuracy = tried[keep]
    candidate.recipe = _static_recipe(run, fp32, cache, fmt, nodes_to_exclude=sorted(slower | set(ranked[:keep])))
    candidate.int8_nodes = None
    candidate.how = (
        f"static QDQ of every quantisable op, the {keep} most sensitive of {len(ranked)} weight layers kept float "
        f"(islands: {', '.join(ranked[:keep][:8])}{' ...' if keep > 8 else ''})"
        + (f"; {len(slower)} ops measured slower in int8 kept float" if slower else "")
    )
    candidate.accuracy["islands"] = {str(k): {"ok": v["ok"], "loss": v["loss"]} for k, v in sorted(tried.items())}
    for other in run.workdir.glob("islands_*.onnx"):
        other.unlink(missing_ok=True)
    return candidate


def _dynamic_mixed(run, fp32: Path, fmt: Int8Format, sensitivity: dict, reference,
                   head: ClassifierHead | None = None) -> _Candidate:  # fmt: skip
    """Dynamic int8 (``int8_forms``) with the fewest most sensitive MatMuls kept float that meets the target,
    ranked by the static sensitivity (``sensitivity``, layers named alike in both graphs): the most sensitive
    one float first (dynamic int8 loses less than static per layer, activations scaled per run: on ViT-B
    width one float MatMul gave top-1 1.0 on the samples, 15 of 16 int8), then a
    bisection over how many. A classifier head (``head``) stays int8 with its top candidates re-scored exactly
    (``exact_top_k``) and is not ranked: with every other MatMul float it is the last int8 layer standing
    (GPT-2's LM head, 53% of its fp32 time). Without one, every ranked MatMul float is the fp32 model."""
    form, _ = dynamic_form(onnx.load(str(fp32)))
    matmuls = {node.name for node in form.graph.node if node.op_type in DYNAMIC_OP_TYPES}
    del form
    ranked = [
        name
        for name, entry in sorted(sensitivity.items(), key=lambda item: (-item[1]["loss"], _cosine_kept(item[1])))
        if name in matmuls and (head is None or name != head.node)
    ]
    candidate = _Candidate("dynamic_mixed", run.workdir / "dynamic_mixed.onnx", "")
    tried: dict[int, dict] = {}

    def attempt(keep: int) -> dict:
        if keep not in tried:
            out = run.workdir / f"dynamic_mixed_{keep}.onnx"
            _quantize_dynamic(fp32, out, fmt, keep_float=tuple(ranked[:keep]), head=head)
            tried[keep] = score(reference, _outputs(out, run.judged, level=run.judge_level), run.options.accuracy)
            if not tried[keep]["ok"]:
                out.unlink(missing_ok=True)
        return tried[keep]

    keep = min(1, len(ranked))
    if keep and not attempt(keep)["ok"]:
        low, keep = keep, len(ranked)  # invariant: low misses the target; keep meets it (or is the last tried)
        if keep > low and not matmuls - set(ranked):
            tried[keep] = {"ok": True, "loss": 0.0, "outputs": {}}  # every MatMul float: the fp32 model
        elif keep > low and not attempt(keep)["ok"]:
            low = keep  # even with every ranked MatMul float it misses: nothing to bisect
        keep = _bisect_float_layers(attempt, low, keep)
    kept = tuple(ranked[:keep])
    result = run.workdir / f"dynamic_mixed_{keep}.onnx"
    candidate.accuracy = tried.get(keep) or attempt(keep)
    int8 = matmuls - set(kept)
    if result.exists():
        result.replace(candidate.path)
    elif not candidate.accuracy.get("outputs"):
        candidate.error = "no MatMul can be int8 within the accuracy target: every one would be float (the fp32 model)"
    exact = (
        f"; the classifier head {head.node!r} int8 with its top {EXACT_TOP_K} per row re-scored exactly in fp32"
        if head is not None else ""
    )  # fmt: skip
    candidate.how = (
        f"dynamic int8 of {len(int8)} of {len(matmuls)} MatMuls (int8_forms), the {len(kept)} most "
        f"sensitive by the static ranking kept float: {', '.join(kept) or 'none'}{exact}"
    )
    candidate.int8_nodes = frozenset(int8)
    candidate.recipe = lambda samples, tag, out: _quantize_dynamic(fp32, out, fmt, keep_float=kept, head=head)
    for other in run.workdir.glob("dynamic_mixed_*.onnx"):
        other.unlink(missing_ok=True)
    return candidate


def _layer_table(in_int8: frozenset[str], rows: list[tuple[str, str]], decisions: dict, sensitivity: dict,
                 kept_reasons: dict, outside: str) -> list[dict]:  # fmt: skip
    """``precision.layers``: per quantisable node, the precision the quantiser was asked to give it
    (``in_int8``) and why, with its measured int8 and fp32 kernel times (``int8_costing``) and its
    sensitivity where those were taken."""
    table = []
    for name, op in rows:
        decision = decisions.get(name)
        row: dict = {"layer": name, "op": op}
        if name in sensitivity:
            row["sensitivity"] = sensitivity[name]["loss"]
            row["alone"] = dict(sensitivity[name]["outputs"])
        if name in in_int8:
            row["precision"] = "int8"
            parts = [decision.reason] if decision else []
            if name in sensitivity:
                parts.append(f"the target holds with it quantised (loss {sensitivity[name]['loss']:.4f} alone)")
            row["reason"] = kept_reasons.get(name) or "int8: " + ("; ".join(parts) or "quantised")
        else:
            row["precision"] = "float32"
            if decision is not None and decision.precision == "float32":
                row["reason"] = f"kept float: {decision.reason}"
            elif name in kept_reasons:
                row["reason"] = kept_reasons[name]
            else:
                row["reason"] = f"kept float: {outside}"
        if decision is not None:
            row.update(decision.columns())
        table.append(row)
    return table


def _op_costing(run: PrecisionRun, fp32: Path, static: _Candidate, report: dict, fmt: Int8Format):
    """Each quantisable node's int8 kernel against its fp32 kernel on this CPU (``int8_costing``), from the
    kernel cache where every node's figures are there (``int8_cache``): the decisions, the nodes measured
    slower, and per node where its figures came from."""
    nodes = quantised_nodes(onnx.load(str(static.path)))
    rounds = max(run.options.latency_repeats, MIN_ROUNDS)
    target = (str(getattr(run.target, "name", "")), str(getattr(run.target, "version", "")))
    scope = CostingScope(fmt.as_dict(), rounds, PROFILE_WARMUP, target, __version__)
    started = time.perf_counter()
    timings, sources = cached_profile(
        fp32, static.path, [n for n, _ in nodes], run.samples[0], run.workdir,
        cache=run.cache, scope=scope, profile=profile_int8_vs_fp32,
    )  # fmt: skip
    decisions = decide(timings)
    slower = frozenset(name for name, d in decisions.items() if d.precision == "float32")
    origins = Counter("kernel cache" if source == CACHED else "measured" for source in sources.values())
    report["op_costing"] = {
        "engine": "onnxruntime CPUExecutionProvider profiler, ORT_ENABLE_ALL, 1 thread, interleaved rounds",
        "rounds": rounds,
        "models": f"fp32 against {static.name} (every quantisable op int8)",
        "rule": f"float where int8 is significantly slower (95% interval of the ratio above 1 + {KERNEL_MIN_EFFECT})",
        "quantisable": len(nodes),
        "measured_slower": len(slower),
        "fp32_ms": round(sum(d.fp32_ms or 0.0 for d in decisions.values()), 3),
        "int8_ms": round(sum(d.int8_ms or 0.0 for d in decisions.values()), 3),
        # Whether this compile ran the profile, and per source how many nodes' figures came from it.
        "profiled": origins["measured"] > 0,
        "figures": {"measured": origins["measured"], "kernel_cache": origins["kernel cache"]},
        "seconds": round(time.perf_counter() - started, 3),
    }
    return decisions, slower, sources


def _scored(run: PrecisionRun, candidate: _Candidate, build, reference: list[dict]) -> _Candidate:
    """Build a candidate and score it; a quantiser failing is the candidate's error, said in the report."""
    started = time.perf_counter()
    try:
        build()
        candidate.accuracy = score(reference, _outputs(candidate.path, run.judged, level=run.judge_level), run.options.accuracy)
        _score_on_calibration(run, candidate)
    except Exception as err:  # noqa: BLE001 - one quantiser failing leaves the others; said in the report
        candidate.error = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
    candidate.accuracy["seconds"] = round(time.perf_counter() - started, 3)
    return candidate


def _score_on_calibration(run: PrecisionRun, candidate: _Candidate) -> None:
    """The candidate's figures on the samples it calibrated on, beside the held-out ones that decide: where
    they differ, the calibration samples flattered it."""
    if run.split is None or run.split.mode == "none" or not run.calibration:
        return
    reference = run.calibration_reference()
    candidate.calibration_accuracy = score(
        reference, _outputs(candidate.path, run.calibration, level=run.judge_level), run.options.accuracy
    )
    candidate.calibration_accuracy["measured_on"] = run.measured_on(judged=False)


def _scored_search(search) -> _Candidate:
    """A candidate that scores itself while searching (``_dynamic_mixed``); a quantiser failing is its error."""
    started = time.perf_counter()
    try:
        candidate = search()
    except Exception as err:  # noqa: BLE001 - one quantiser failing leaves the others; said in the report
        candidate = _Candidate("searched", Path("searched.onnx"), "a searched candidate")
        candidate.error = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
    candidate.accuracy["seconds"] = round(time.perf_counter() - started, 3)
    return candidate


def _int8(run: PrecisionRun, report: dict) -> ir.Model | None:
    options = run.options
    fmt = int8_format(run.target)
    report["format"] = fmt.as_dict()
    if fmt.runs_here:
        report["cpu"] = cpu_int8_features()
    fp32 = _save(run.fp32_model, run.workdir / "fp32.onnx")
    reference = run.reference()
    cache = run.workdir / "calibration_ranges.json"
    if run.packed(fp32):  # outputs packing unlike quantities: their tails stay float in every static candidate
        report["packed_outputs"] = run.packed(fp32)

    static = _Candidate("static_qdq", run.workdir / "static.onnx", "static QDQ of the fused fp32 model",
                        recipe=_static_recipe(run, fp32, cache, fmt))  # fmt: skip
    builders = [(static, lambda: static.recipe(run.calibration, "fold0", static.path))]
    if run.unfused_model is not None:
        unfused_fp32 = _save(run.unfused_model, run.workdir / "fp32_unfused.onnx")
        unfused = _Candidate(
            "static_qdq_unfused", run.workdir / "static_unfused.onnx",
            "static QDQ of the model compiled without our fusions whose com.microsoft ops hold weights "
            "(FusedConv, FusedGemm, FusedMatMul, Attention: the QDQ quantiser leaves those in float)",
        )  # fmt: skip
        cache_unfused = run.workdir / "calibration_ranges_unfused.json"
        unfused.recipe = _static_recipe(run, unfused_fp32, cache_unfused, fmt)
        builders.append((unfused, lambda: unfused.recipe(run.calibration, "fold0", unfused.path)))
    dynamic = _Candidate(
        "dynamic", run.workdir / "dynamic.onnx",
        "dynamic int8 (weights s8, activations per run) of every MatMul with a constant weight, our Attention and "
        "tied-weight FusedMatMul first rewritten to MatMuls the quantiser takes (int8_forms)",
    )  # fmt: skip
    dynamic.recipe = lambda samples, tag, out: _quantize_dynamic(fp32, out, fmt)  # calibrates on nothing
    if fmt.runs_here:  # dynamic int8 is an ONNX Runtime CPU technique, not an accelerator format
        builders.append((dynamic, lambda: _quantize_dynamic(fp32, dynamic.path, fmt, require_int8=True)))
    candidates: list[_Candidate] = []
    for index, (candidate, build) in enumerate(builders):
        run.report(0.3 * index / len(builders), f"int8 candidate {candidate.name}")
        candidates.append(_scored(run, candidate, build, reference))
    head = None
    if fmt.runs_here:  # a big classifier head (an LM's) whose top-1 int8 would flip: its top-k re-scored exactly
        head, why = _classifier_head(fp32, _classifier_outputs(reference[0], options.accuracy))
        report["classifier_head"] = (
            {"node": head.node, "output": head.output, "classes": head.classes, "exact_top_k": EXACT_TOP_K}
            if head is not None else {"node": None, "why": why}
        )  # fmt: skip
    exact_head = _Candidate(
        "dynamic_exact_head", run.workdir / "dynamic_exact_head.onnx",
        f"dynamic int8 of every MatMul (as 'dynamic'), the classifier head's top {EXACT_TOP_K} per row re-scored "
        "exactly in fp32 (int8_forms.exact_top_k)",
    )  # fmt: skip
    if head is not None and dynamic.error is None and not dynamic.accuracy.get("ok"):
        run.report(0.3, f"int8 candidate {exact_head.name}")
        build = lambda: _quantize_dynamic(fp32, exact_head.path, fmt, head=head)  # noqa: E731
        exact_head.recipe = lambda samples, tag, out: _quantize_dynamic(fp32, out, fmt, head=head)
        candidates.append(_scored(run, exact_head, build, reference))

    layers = _weight_layers(onnx.load(str(static.path))) if static.error is None else []
    # The static model that quantises more layers is the base of the per-op costing and of mixed: ONNX
    # Runtime's quantiser leaves our com.microsoft::FusedConv/FusedGemm in float, so on CNNs the graph
    # without those fusions is the base (ResNet-18 here: 1.77x vs 1.05x for all-int8 on the fused graph).
    base_fp32, base_cache, base = fp32, cache, static
    if run.unfused_model is not None and unfused.error is None and static.error is None:
        unfused_layers = _weight_layers(onnx.load(str(unfused.path)))
        if len(unfused_layers) > len(layers):
            layers, base_fp32, base_cache, base = unfused_layers, unfused_fp32, cache_unfused, unfused
    weight_layers = [(name, op) for name, op in layers if op in WEIGHT_COMPUTE_OPS]

    measured = options.measure_latency and fmt.runs_here
    decisions, slower, sources = {}, frozenset(), {}
    if measured and base.error is None:
        run.report(0.3, "timing every quantisable op in int8 against fp32")
        try:
            decisions, slower, sources = _op_costing(run, base_fp32, base, report, fmt)
        except Exception as err:  # noqa: BLE001 - without per-op times the candidates are still timed whole
            report["op_costing"] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
    full = base
    if slower:  # the all-int8 model with the ops measured slower in int8 kept float
        costed = _Candidate(
            "static_qdq_costed", run.workdir / "static_costed.onnx",
            f"static QDQ of {base.name}'s graph with the {len(slower)} ops measured slower in int8 kept float",
        )  # fmt: skip
        costed.recipe = _static_recipe(run, base_fp32, base_cache, fmt, nodes_to_exclude=sorted(slower))
        build = lambda: costed.recipe(run.calibration, "fold0", costed.path)  # noqa: E731
        costed.int8_nodes = frozenset(n for n, _ in quantised_nodes(onnx.load(str(base.path)))) - slower
        full = _scored(run, costed, build, reference)
        candidates.append(full)
    if base.error is None and full.error is None and not full.accuracy.get("ok"):
        full = _calibration_methods(run, base_fp32, base_cache, fmt, full, slower, candidates, report)
    weights_int8 = [name for name, _ in weight_layers if name not in slower]
    if base.error is None and weights_int8:  # what keeps ViT: its residual stream and attention stay float
        weights = _Candidate(
            "static_qdq_weights", run.workdir / "static_weights.onnx",
            f"static QDQ of the weight layers only ({len(weights_int8)} Conv/MatMul/Gemm with initializer "
            f"weights, of {base.name}'s graph); activation-only ops (residual Add, LayerNorm, Softmax, "
            "attention-score MatMul) stay float",
            int8_nodes=frozenset(weights_int8),
        )  # fmt: skip
        weights.recipe = _static_recipe(run, base_fp32, base_cache, fmt, nodes_to_quantize=weights_int8)
        build = lambda: weights.recipe(run.calibration, "fold0", weights.path)  # noqa: E731
        candidates.append(_scored(run, weights, build, reference))

    sensitivity, kept_reasons, table_model, search = {}, {}, full, None
    if options.precision == "mixed" and base.error is None and weight_layers:
        report["mixed_base"] = base.name
        mixed, sensitivity, kept_reasons, search = _mixed(
            run, base_fp32, weight_layers, reference, base_cache, fmt, full, slower,
            {name: d.fp32_ms - d.int8_ms for name, d in decisions.items() if d.precision == "int8" and d.comparison},
        )  # fmt: skip
        mixed.how += f" (from {base.name})"
        mixed.recipe = (
            full.recipe if mixed.int8_nodes is None
            else _static_recipe(run, base_fp32, base_cache, fmt, nodes_to_quantize=sorted(mixed.int8_nodes))
        )  # fmt: skip
        candidates.append(mixed)
        table_model = mixed
        if search["scope"] == "weight layers" and full.error is None:  # float islands in the all-int8 model
            islands = _scored_search(
                lambda: _float_islands(run, base_fp32, weight_layers, sensitivity, base_cache, fmt, slower, full)
            )
            candidates.append(islands)
        dynamic_ok = dynamic.accuracy.get("ok") or (exact_head.error is None and exact_head.accuracy.get("ok"))
        if fmt.runs_here and dynamic.error is None and not dynamic_ok and sensitivity:
            build_dynamic_mixed = lambda: _dynamic_mixed(run, fp32, fmt, sensitivity, reference, head)  # noqa: E731
            candidates.append(_scored_search(build_dynamic_mixed))

    if measured:
        run.report(0.85, "timing the int8 candidates against fp32")
        runnable = [c for c in candidates if c.error is None and c.accuracy.get("ok")]
        if runnable:
            report["timing"] = _time_against_fp32(run, fp32, runnable)
    chosen, refuted = _pick(candidates, measured), []
    while chosen is not None and not _confirm(run, chosen):  # k-fold: the pooled held-out figure decides
        refuted.append(chosen)
        chosen = _pick([c for c in candidates if c not in refuted], measured)
    for candidate in candidates:
        candidate.accuracy.setdefault("measured_on", run.measured_on())
        if candidate.error is None and candidate.calibration_accuracy is None and candidate.path.is_file():
            _score_on_calibration(run, candidate)
    report["candidates"] = [c.as_dict() for c in candidates]
    if base.error is None and (decisions or search is not None):
        outside = (
            "not a weight layer; the mixed search quantises weight layers only ("
            + search.get("why_weight_layers", "")
            + ")"
            if search is not None and search["scope"] == "weight layers"
            else "not quantised in this model"
        )
        rows = quantised_nodes(onnx.load(str(base.path)))
        in_int8 = frozenset() if table_model.error else table_model.int8_nodes
        table = _layer_table(
            frozenset(n for n, _ in rows) if in_int8 is None else in_int8, rows, decisions, sensitivity,
            kept_reasons, outside,
        )  # fmt: skip
        shares = _cached_time_shares(run, base_fp32)
        for row in table:
            row["time_share"] = round(shares.get(row["layer"], 0.0), 4)
            if row["layer"] in sources:  # measured in this compile, or read from the kernel cache
                row["timing_source"] = sources[row["layer"]]
        report["layers"] = table
        report["layers_model"] = table_model.name
        if search is not None:
            report["search"] = search
    if chosen is None:
        return _no_int8(run, report, candidates, weight_layers, reference, base_cache, fmt, base_fp32)
    report["shipped"] = chosen.name
    report["accuracy"] = chosen.accuracy
    report["calibration_accuracy"] = chosen.calibration_accuracy
    report["warnings"].extend(_thin_evidence(chosen.accuracy, options.accuracy))
    return ir.from_proto(onnx.load(str(chosen.path)))


def _thin_evidence(accuracy_score: dict, target: AccuracyTarget) -> list[str]:
    """A top-1 target met on too few held-out rows to support it: its one-sided 95% bound far below the
    target (22 crops of 3 photos agreeing on EfficientNet-Lite0 bound top-1 at 0.89; on 85 crops of other
    photos that model kept 0.88). Said, so the figure is not taken for more than it is."""
    found = []
    for name, entry in accuracy_score.get("outputs", {}).items():
        bound = entry.get("top1_bound")
        if bound is not None and entry.get("ok") and bound < target.min_top1 - 0.05:
            found.append(
                f"output {name!r}: top-1 {entry['top1_agreement']:.3f} on {entry['rows']} held-out rows only bounds "
                f"the agreement at {bound:.3f} (95%), short of the {target.min_top1} asked: send more samples of your "
                "data (the held-out part decides) for a figure that supports the target"
            )
    return found


def _calibration_methods(run, fp32: Path, cache: Path, fmt: Int8Format, full: _Candidate, slower: frozenset[str],
                         candidates: list[_Candidate], report: dict) -> _Candidate:  # fmt: skip
    """The all-int8 model (``full``) misses the target with MinMax ranges: the same model calibrated by
    ONNX Runtime's Percentile (ranges clipped at the 99.999th percentile: one outlier no longer stretches a
    scale) and Entropy (the range keeping the most information, KL divergence) methods, each a candidate.
    The method whose model judges best (least loss on the held-out samples) calibrates the later candidates
    (weights only, mixed); ``precision.calibration_method`` says which and why."""
    tried = {"MinMax": full.accuracy.get("loss")}
    best = full
    nodes = {"nodes_to_exclude": sorted(slower)} if slower else {}
    for method in CALIBRATION_METHODS:
        run.method = method
        candidate = _Candidate(
            f"static_qdq_{method.lower()}", run.workdir / f"static_{method.lower()}.onnx",
            f"{full.how}, calibrated by {method} instead of MinMax",
            recipe=_static_recipe(run, fp32, cache, fmt, **nodes), int8_nodes=full.int8_nodes,
        )  # fmt: skip
        run.report(0.3, f"int8 candidate {candidate.name}")
        _scored(run, candidate, lambda c=candidate: c.recipe(run.calibration, "fold0", c.path), run.reference())
        candidates.append(candidate)
        tried[method] = None if candidate.error else candidate.accuracy.get("loss")
        if candidate.error is None and candidate.accuracy.get("loss", 1.0) < best.accuracy.get("loss", 1.0):
            best = candidate
    run.method = "MinMax" if best is full else best.name.rsplit("_", 1)[-1].capitalize()
    report["calibration_method"] = {
        "chosen": run.method, "loss_by_method": tried,
        "why": "MinMax's all-int8 model missed the target on the held-out samples; the method with the least loss "
        "there calibrates the later candidates",
    }  # fmt: skip
    return best


def _no_int8(run, report, candidates, layers, reference, cache, fmt, fp32) -> None:
    """No int8 model both meets the target and is not slower than fp32: fp32 with a warning, or a failure
    that names the layers which miss the target."""
    accurate = [c for c in candidates if c.accuracy.get("ok") and c.error is None]
    if accurate:  # accurate but slower: the never-slower guard keeps fp32, whatever the fallback setting
        report["shipped"] = "fp32"
        report["warnings"].append(
            "no int8 model was faster than the fp32 one on this machine ("
            + ", ".join(f"{c.name}: time ratio {c.ratio:.3f}" for c in accurate if c.ratio is not None)
            + "); shipped fp32 (never-slower guard)"
        )
        return None
    best = max((c for c in candidates if c.error is None), key=lambda c: 1 - c.accuracy["loss"], default=None)
    missed = _describe(best.accuracy, run.options.accuracy) if best else "every quantiser failed"
    worst_layers = ""
    if layers and not any("sensitivity" in row for row in report.get("layers", [])):
        sensitivity = _sensitivity(run, fp32, layers, reference, cache, fmt)
        ranked = sorted(sensitivity.items(), key=lambda item: -item[1]["loss"])[:5]
        rows = {row["layer"]: row for row in report.get("layers", [])}
        for name, entry in sensitivity.items():
            rows.setdefault(name, {"layer": name}).update(sensitivity=entry["loss"], alone=entry["outputs"])
        if not report.get("layers"):  # no per-op costing: the five most sensitive layers
            report["layers"] = [rows[name] for name, _ in ranked]
        worst_layers = "; most sensitive layers: " + ", ".join(f"{n} (loss {s['loss']:.4f})" for n, s in ranked)
    message = (
        f"no int8 model meets the accuracy target on {run.measured_on()} (best: {best.name if best else '-'}, "
        f"{missed}){worst_layers}"
    )
    if run.options.precision == "mixed":  # float everywhere is the end of mixed's search: fp32, said so
        report["shipped"] = "fp32"
        report["warnings"].append(f"{message}; mixed kept every layer in float, so fp32 shipped")
        return None
    if run.options.precision_fallback == "fp32":
        report["shipped"] = "fp32"
        report["warnings"].append(f"{message}; shipped fp32 as precision_fallback asks")
        return None
    raise ValidationFailedError(
        f"{message}. Use precision 'mixed' to keep the sensitive layers in float, relax 'accuracy', or set "
        "precision_fallback 'fp32'.",
        details={"precision": report},
    )


# ---------------------------------------------------------------------------------------------- vendor
def _vendor(run: PrecisionRun, report: dict, fmt: Int8Format | None) -> None:
    """int8/mixed on a target whose toolchain quantises: the bucket ships in fp32 with our calibration samples
    for the vendor's quantiser. For ``mixed``, layers are ranked and the fewest float ones found here, on the
    stand-in QDQ (``fmt``), and handed to the toolchain as ``float_layers`` (QNN: uint16 activations; RKNN: its
    hybrid quantisation; Quark: excluded). The vendor's result is judged afterwards (``vendor_verdict``)."""
    report["shipped"] = "fp32"
    report["vendor_quantiser"] = True
    if fmt is not None:
        report["format"] = fmt.as_dict()
    report["note"] = (
        f"{run.options.precision} on {run.target.name} is the vendor toolchain's own quantisation: the model "
        "ships in fp32 with the calibration samples for it (calibration.npz; dataset.txt listing one .npy per "
        "input a line under calibration/), the toolchain calibrates on exactly these samples where it installs, "
        "and the bundle's scripts ask the vendor step for it"
    )
    if run.options.precision != "mixed" or fmt is None:
        return
    fp32 = _save(run.fp32_model, run.workdir / "fp32.onnx")
    reference = run.reference()
    cache = run.workdir / "calibration_ranges.json"
    full = _quantize_static(fp32, run.workdir / "stand_in.onnx", run.calibration, cache, fmt, keep=run.tail(fp32), method=run.method)
    layers = _weight_layers(onnx.load(str(full)))
    full_score = score(reference, _outputs(full, run.judged, level=run.judge_level), run.options.accuracy)
    full_score["measured_on"] = run.measured_on()
    report["stand_in_all_int8"] = full_score
    if not layers:
        report["float_layers"] = []
        return
    # The stand-in search ranks every layer with int8 weights (its weight-scope tier quantises exactly those):
    # what the vendor keeps out of int8 is this list. No per-op timing: the part is not this machine.
    stand_in = _Candidate("stand_in", full, "stand-in QDQ of every op", accuracy=full_score)
    candidate, sensitivity, reasons, search = _mixed(run, fp32, layers, reference, cache, fmt, stand_in, frozenset())
    int8_nodes = frozenset() if candidate.error else candidate.int8_nodes
    table = _layer_table(
        frozenset(n for n, _ in layers) if int8_nodes is None else int8_nodes, layers, {}, sensitivity, reasons,
        "not quantised in the stand-in model",
    )  # fmt: skip
    for row in table:
        row["on_target"] = fmt.float_as if row["precision"] == "float32" else "int8"
    report["layers"] = table
    report["search"] = search
    report["stand_in_mixed"] = {"note": candidate.error} if candidate.error else candidate.accuracy
    report["float_layers"] = [row["layer"] for row in table if row["precision"] == "float32"]
    report["float_layer_tensors"] = _layer_tensors(run.fp32_model, report["float_layers"])


def _layer_tensors(model: ir.Model, layers: list[str]) -> dict[str, list[str]]:
    """Per layer (node name), its first run-time input and its first output: the ends of the one-node subgraph
    a vendor tool keeps in float (rknn-toolkit2's ``custom_hybrid`` takes ``[input, output]`` pairs)."""
    wanted, found = set(layers), {}
    for node in model.graph:
        if node.name not in wanted:
            continue
        data = next(
            (v for v in node.inputs if v is not None and v.const_value is None and not v.is_initializer()), None
        )
        if data is not None and node.outputs:
            found[node.name] = [data.name, node.outputs[0].name]
    return found


def vendor_verdict(run: PrecisionRun, section: dict, bucket: str, accuracy: dict | None, ran: bool) -> bool:
    """The vendor toolchain's quantised bucket judged by the accuracy target (``accuracy``: ``score`` of its
    simulator/emulator outputs on the held-out samples, which its quantiser did not calibrate on). Returns whether its artifacts may ship. A miss
    fails the job naming the most sensitive layers, or, with ``precision_fallback: "fp32"`` (and always for
    ``mixed``, whose float end is fp32), ships the float bundle without them, with a warning."""
    if not ran or accuracy is None:
        section["warnings"].append(
            f"[{bucket}] the vendor toolchain did not run here, so the {run.options.precision} model it makes was "
            "not checked against the accuracy target: the bundle ships fp32 with the samples for its quantiser"
        )
        return True
    if accuracy.get("ok"):
        return True
    missed = _describe(accuracy, run.options.accuracy)
    ranked = section.get("layers")
    if not ranked:
        fmt = int8_format(run.target)
        fp32 = _save(run.fp32_model, run.workdir / "fp32.onnx")
        reference = run.reference()
        cache = run.workdir / "calibration_ranges.json"
        full = _quantize_static(fp32, run.workdir / "stand_in.onnx", run.calibration, cache, fmt, keep=run.tail(fp32), method=run.method)
        sensitivity = _sensitivity(run, fp32, _weight_layers(onnx.load(str(full))), reference, cache, fmt)
        ranked = [{"layer": n, "sensitivity": s["loss"], "alone": s["outputs"]}
                  for n, s in sorted(sensitivity.items(), key=lambda item: -item[1]["loss"])[:5]]  # fmt: skip
        section["layers"] = ranked
    worst = sorted(ranked, key=lambda row: -row["sensitivity"])[:5]
    names = ", ".join(f"{row['layer']} (loss {row['sensitivity']:.4f})" for row in worst) or "none found"
    message = (
        f"[{bucket}] the vendor toolchain's {run.options.precision} model misses the accuracy target on "
        f"{accuracy.get('measured_on') or 'its samples'} ({missed}); most sensitive layers (ranked on the stand-in QDQ): "
        f"{names}"
    )
    if run.options.precision == "mixed" or run.options.precision_fallback == "fp32":
        section["warnings"].append(f"{message}; its quantised artifacts were left out and the bundle ships fp32")
        section.setdefault("dropped_buckets", []).append(bucket)
        return False
    raise ValidationFailedError(
        f"{message}. Use precision 'mixed' to keep the sensitive layers out of int8, relax 'accuracy', or set "
        "precision_fallback 'fp32'.",
        details={"precision": section},
    )


# ---------------------------------------------------------------------------------------------- fp16
def _fp16(run: PrecisionRun, report: dict) -> ir.Model:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    proto = ir.to_proto(run.fp32_model)
    converted = convert_float_to_float16(proto, keep_io_types=run.options.keep_io_types, disable_shape_infer=True)
    path = _save(converted, run.workdir / "fp16.onnx")
    reference = run.reference()
    try:
        got = _outputs(path, run.judged, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    except Exception as err:  # noqa: BLE001 - ONNX Runtime's words are the reason
        raise ValidationFailedError(
            f"the float16 model cannot run in ONNX Runtime for validation: {str(err).splitlines()[0][:300]}. "
            "Use precision 'fp32' for this model.",
        ) from None
    atol, rtol = DEFAULT_TOLERANCES["float16"]
    if run.options.tolerances and "float16" in run.options.tolerances:
        atol, rtol = run.options.tolerances["float16"].atol, run.options.tolerances["float16"].rtol
    accuracy = score(reference, [{k: v.astype(np.float32) for k, v in s.items()} for s in got], run.options.accuracy)
    worst_abs = 0.0
    elementwise_ok = True
    for want_sample, got_sample in zip(reference, got, strict=True):
        for name, want in want_sample.items():
            if not np.issubdtype(want.dtype, np.floating):
                continue
            have = got_sample[name].astype(np.float64)
            scale = float(np.abs(want).max()) or 1.0  # float16 keeps ~3 digits of the output's own range
            diff = np.abs(have - want)
            worst_abs = max(worst_abs, float(diff.max()) if diff.size else 0.0)
            elementwise_ok &= bool(np.all(diff <= atol * scale + rtol * np.abs(want)))
    accuracy["elementwise"] = {"atol": atol, "rtol": rtol, "relative_to": "each output's largest magnitude",
                               "max_abs": worst_abs, "ok": elementwise_ok}  # fmt: skip
    accuracy["measured_on"] = f"all {len(run.judged)} samples (float16 calibrates on none)"
    report["accuracy"] = accuracy
    report["keep_io_types"] = run.options.keep_io_types
    if not (accuracy["ok"] and elementwise_ok):
        raise ValidationFailedError(
            f"the float16 model misses the accuracy target: {_describe(accuracy, run.options.accuracy)}"
            + ("" if elementwise_ok else f"; max abs error {worst_abs:.3g} beyond float16 tolerance")
            + ". Use precision 'fp32', or relax 'accuracy'/'tolerances'.",
            details={"precision": report},
        )
    report["shipped"] = "fp16"
    return ir.from_proto(onnx.load(str(path)))


# ---------------------------------------------------------------------------------------------- entry
def apply_precision(run: PrecisionRun) -> tuple[ir.Model | None, dict]:
    """The lower-precision model to ship (None: keep fp32) and the report's ``precision`` section."""
    report: dict = {
        "requested": run.options.precision,
        "accuracy_target": run.options.accuracy.model_dump(),
        "calibration": {
            "source": "synthetic" if run.synthetic else "uploaded",
            "samples": len(run.samples),
            "input_shapes": {k: list(v.shape) for k, v in run.samples[0].items()} if run.samples else {},
        },
        "warnings": [],
    }
    if run.options.precision == "fp16":  # nothing calibrates: every sample judges
        run.split = SplitPlan("none", len(run.samples), (Fold((), tuple(range(len(run.samples)))),), "as_given")
        run.use_fold(0)
        report["judgement"] = {"mode": "no calibration (float16)", "judged_on": len(run.samples)}
    else:
        run.split = plan(len(run.samples), run.options.holdout, run.options.seed)
        run.use_fold(0)
        report["judgement"] = run.split.as_dict()
    report["judgement"]["claim"] = (
        "numerics only: synthetic random inputs check that the lower-precision model computes what the original "
        "does on them; they make no accuracy claim (upload samples of your data for one)"
        if run.synthetic
        else "accuracy on your samples, decided on the ones held out from calibration"
    )
    if run.synthetic:
        report["warnings"].append(
            f"the {run.options.precision} model was checked on {len(run.samples)} synthetic random inputs, not on "
            "your data: numerics only, no accuracy claim. Upload calibration samples (an .npz of named inputs) "
            "for a real check"
        )
    elif run.split.mode == "none":
        report["warnings"].append(
            "one calibration sample: nothing could be held out, so the accuracy figures are on the sample the "
            f"quantiser calibrated on. Upload at least {run.options.holdout.folds_below} samples for a held-out check"
        )
    started = time.perf_counter()
    logging.getLogger("onnxruntime").setLevel(logging.ERROR)
    if run.options.precision == "fp16":
        model = _fp16(run, report)
    else:
        fmt = int8_format(run.target)
        if fmt is None or fmt.vendor:
            model = None
            _vendor(run, report, fmt)
        else:
            model = _int8(run, report)
    report["seconds"] = round(time.perf_counter() - started, 3)
    if not math.isfinite(report["seconds"]):
        report["seconds"] = None
    return model, report


def replace_model(bucket, model: ir.Model):
    """The bucket with its model replaced (the portable fp32 variant does not describe it any more)."""
    return dataclasses.replace(bucket, model=model, portable=None)


def samples_npz(samples: list[dict]) -> bytes:
    """The calibration samples as one ``.npz`` (rows stacked on the first axis), for a vendor's quantiser."""
    import io

    buffer = io.BytesIO()
    np.savez(buffer, **{name: np.concatenate([s[name] for s in samples]) for name in samples[0]})
    return buffer.getvalue()


def samples_dataset(samples: list[dict], bucket: str | None = None) -> dict[str, bytes]:
    """The samples as ``calibration/NNN_<input>.npy`` files and ``dataset.txt`` listing one sample a line
    (its inputs' files, space-separated, in the model's input order): what RKNN-Toolkit2's
    ``build(do_quantization=True, dataset=...)`` and similar vendor quantisers read. With ``bucket`` (a model
    with several shape buckets, each calibrated at its own shapes): ``calibration/<bucket>/...`` and
    ``dataset.<bucket>.txt``."""
    import io

    folder = "calibration/" if bucket is None else f"calibration/{_safe_name(bucket)}/"
    files: dict[str, bytes] = {}
    lines = []
    for index, sample in enumerate(samples):
        names = []
        for name, array in sample.items():
            path = f"{folder}{index:03d}_{_safe_name(name)}.npy"
            buffer = io.BytesIO()
            np.save(buffer, array, allow_pickle=False)
            files[path] = buffer.getvalue()
            names.append(path)
        lines.append(" ".join(names))
    listing = "dataset.txt" if bucket is None else f"dataset.{_safe_name(bucket)}.txt"
    files[listing] = ("\n".join(lines) + "\n").encode()
    return files


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _bisect_float_layers(attempt, misses: int, meets: int) -> int:
    """The fewest most-sensitive layers kept float that meet the target, between ``misses`` (a count known to
    miss it) and ``meets`` (one known to meet it): ``attempt(count)["ok"]`` is monotone in the count."""
    while meets - misses > 1:
        middle = (misses + meets) // 2
        if attempt(middle)["ok"]:
            meets = middle
        else:
            misses = middle
    return meets
