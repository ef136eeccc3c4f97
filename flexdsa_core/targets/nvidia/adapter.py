"""NVIDIA Jetson Orin Nano through TensorRT: ONNX -> engine (.plan), built on the device.

TensorRT needs the GPU, so nothing compiles here: the bundle is checked against the onnx-tensorrt op matrix
(N5), its scripts by syntax, and every model numerically in ONNX Runtime. What this adapter adds:

* legalisation: the ai.onnx opset into TensorRT's 9-20 (``opset_convert``); ``layer_norm_y_only`` drops the
  unused Mean/InvStdDev outputs of LayerNormalization (TensorRT parses only ``Y``, N5);
  ``compress_to_gather`` rewrites Compress, which the matrix marks unsupported, as
  Gather(x, Reshape(NonZero(condition), [-1]), axis) (x flattened first when there is no axis): NonZero and
  Gather are in the matrix, and the selection is the same elements in the same order;
* fallback reasons the op constraints cannot express: TopK K < 3840, LayerNormalization's extra outputs,
  MaxPool's Indices, 1-D pooling, non-zero Q/DQ zero points (symmetric only), DeformConv's pads (N5);
* ``trtexec.sh`` and ``build_engine.py`` (tensorrt Python API, runs on the Jetson): one engine per shape
  bucket, or, given a model whose dims are still symbolic, one engine with a min/opt/max optimisation
  profile spanning the buckets (opt = the first bucket, the one the manifest tries first; N6, N7);
  ``--fp16``/``--int8`` from the requested precision.

TensorRT has no CPU fallback: where the partition has fallback nodes, the README says to run the model
through ONNX Runtime's TensorRT execution provider, which builds engines for the supported islands and
runs the rest beside them.
"""

from __future__ import annotations

import pprint

import numpy as np
import onnx_ir as ir

from flexdsa_core.rewrites import counting
from flexdsa_core.targets.accelerator import AcceleratorAdapter
from flexdsa_core.targets.base import BucketModel, Legalized
from flexdsa_core.targets.bundle_inputs import input_dims, requested_precision, runtime_inputs
from flexdsa_core.targets.int8_format import Int8Format
from flexdsa_core.targets.opset_convert import (
    Emitter,
    const_ints,
    convert_opset,
    default_opset,
    is_used,
    opset_legalisations,
    replace_node,
)
from flexdsa_core.targets.render import render
from flexdsa_core.targets.spec import TargetSpec

LAYER_NORM_Y_ONLY = "layer_norm_y_only"
COMPRESS_TO_GATHER = "compress_to_gather"
TOPK_K_LIMIT = 3840  # K must be less than 3840 (N5)
WORKSPACE_MIB = 1024
_DEFAULT_DOMAINS = ("", "ai.onnx")

# The request's precision -> trtexec builder flags (N7, N9).
PRECISION_FLAGS = {"fp32": "", "fp16": "--fp16", "int8": "--int8", "mixed": "--int8"}


def profile(buckets: list[BucketModel]) -> dict[str, dict[str, list[int]]]:
    """Per input, the min/opt/max shapes spanning the buckets (opt = the first bucket). Empty when the
    buckets do not share input names and ranks, or a dim is still symbolic."""
    shapes = [{v.name: input_dims(v) for v in runtime_inputs(b.model)} for b in buckets]
    if not shapes:
        return {}
    names = list(shapes[0])
    for shape in shapes:
        if list(shape) != names or any(len(shape[n]) != len(shapes[0][n]) for n in names):
            return {}
        if any(not isinstance(d, int) for dims in shape.values() for d in dims):
            return {}
    return {
        name: {
            "min": [min(s[name][axis] for s in shapes) for axis in range(len(shapes[0][name]))],
            "opt": list(shapes[0][name]),
            "max": [max(s[name][axis] for s in shapes) for axis in range(len(shapes[0][name]))],
        }
        for name in names
    }


class NvidiaAdapter(AcceleratorAdapter):
    vendor = "nvidia"
    int8_format = Int8Format("TensorRT symmetric s8s8 QDQ", "int8", True, False, False)  # TensorRT: symmetric s8 only
    legalisations = (
        *opset_legalisations(),
        counting(LAYER_NORM_Y_ONLY, lambda model: layer_norm_y_only(model),
                 "LayerNormalization's unused Mean/InvStdDev outputs dropped (TensorRT's parser takes Y only)."),
        counting(COMPRESS_TO_GATHER, lambda model: compress_to_gather(model),
                 "Compress with a constant condition -> Gather of the kept indices."),
    )  # fmt: skip

    # ---- legality -----------------------------------------------------------------------------------
    def node_reason(self, node: ir.Node, target: TargetSpec) -> str | None:
        if node.domain not in _DEFAULT_DOMAINS:
            return None
        check = _REASONS.get(node.op_type)
        return check(node) if check else None

    # ---- legalisation -------------------------------------------------------------------------------
    def legalize_model(self, model: ir.Model, target: TargetSpec, disabled: frozenset[str]) -> Legalized:
        low, high = target.opset_range or (9, 20)
        conversion = convert_opset(model, low, high, disabled)
        model, applied, notes = conversion.model, list(conversion.applied), list(conversion.notes)
        if conversion.refused:
            notes.append(conversion.refused)
        # Then the declared legalisations with an ``apply`` of their own (the converter's are done above).
        return self.apply_legalisations(Legalized(model, applied, notes), target, disabled)

    # ---- the bundle ---------------------------------------------------------------------------------
    def vendor_files(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> dict[str, bytes]:
        return {
            "trtexec.sh": self.trtexec_script(buckets, report).encode(),
            "build_engine.py": self.build_engine_script(buckets, report).encode(),
        }

    def engine_filename(self, bucket: BucketModel) -> str:
        return self.model_filename(bucket).removesuffix(".onnx") + ".plan"

    def trtexec_script(self, buckets: list[BucketModel], report: dict) -> str:
        precision = requested_precision(report)
        return render(
            __package__, "trtexec.sh",
            workspace=WORKSPACE_MIB,
            precision=precision,
            precision_flags=PRECISION_FLAGS.get(precision, ""),
            profile=_profile_shapes(profile(buckets)),
            buckets=[self._trtexec_bucket(bucket) for bucket in buckets],
        )  # fmt: skip

    def _trtexec_bucket(self, bucket: BucketModel) -> dict:
        """A bucket as trtexec.sh sees it: its files, and where dims stayed symbolic, each input's dims (an
        int, or the name of the environment variable's stem that gives it: MIN_<stem> ...)."""
        inputs = runtime_inputs(bucket.model)
        dims = {v.name: input_dims(v) for v in inputs}
        return {
            "name": bucket.name,
            "onnx": self.model_filename(bucket),
            "engine": self.engine_filename(bucket),
            "symbolic": any(not isinstance(d, int) for ds in dims.values() for d in ds),
            "inputs": [
                {"name": name, "dims": [d if isinstance(d, int) else _shell_name(d) for d in ds]}
                for name, ds in dims.items()
            ],
        }

    def build_engine_script(self, buckets: list[BucketModel], report: dict) -> str:
        plan = [
            {
                "name": b.name,
                "onnx": self.model_filename(b),
                "engine": self.engine_filename(b),
                "inputs": {v.name: input_dims(v) for v in runtime_inputs(b.model)},
            }
            for b in buckets
        ]
        return render(
            __package__, "build_engine.py",
            buckets=pprint.pformat(plan, width=100, sort_dicts=False),
            profile=pprint.pformat(profile(buckets), width=100, sort_dicts=False),
            precision=repr(requested_precision(report)),
            workspace=WORKSPACE_MIB,
        )

    def deploy_steps(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> list[str]:
        engines = ", ".join(f"`{self.engine_filename(b)}`" for b in buckets)
        steps = [
            "Copy this folder to the Jetson Orin Nano (JetPack 6.x, TensorRT 10.x; engines are specific to the "
            "device and TensorRT version, so build them there).",
            f"Build the engines: `bash trtexec.sh` or `python3 build_engine.py` (tensorrt Python API); each writes "
            f"{engines}. `--precision` / `PRECISION_FLAGS` override the requested precision.",
            "Run an engine with the tensorrt runtime (`trt.Runtime(logger).deserialize_cuda_engine(...)`, "
            "`create_execution_context()`), or `trtexec --loadEngine=...` to time it; pick the bucket for each "
            "request as `manifest.json` (`pick_bucket`) says, padding the inputs up to it.",
        ]
        if len(buckets) > 1 and profile(buckets):
            steps.append(
                "Or one engine for all buckets: `bash trtexec.sh MODEL.onnx` / `python3 build_engine.py --dynamic "
                "MODEL.onnx` with the model whose dims are symbolic; its optimisation profile spans the buckets "
                "(min/opt/max, opt = the first bucket; kernels are tuned for opt, N6)."
            )
        fallback = sorted(
            {f["op"] for p in (report.get("partition") or {}).values() for f in p.get("fallback", [])}
        )
        if fallback:
            steps.append(
                f"TensorRT has no CPU fallback, and {', '.join(fallback)} cannot run in it (report.json, "
                "partition.*.fallback): the engine build fails on them. Run the model through ONNX Runtime with "
                "`providers=['TensorrtExecutionProvider', 'CUDAExecutionProvider', 'CPUExecutionProvider']` "
                "(options `trt_fp16_enable`, `trt_engine_cache_enable`, `trt_engine_cache_path`): it builds "
                "engines for the supported islands and runs the rest beside them."
            )
        return steps


# ---- fallback reasons the constraint language cannot express (N5) ---------------------------------


def _topk(node: ir.Node) -> str | None:
    k = const_ints(node.inputs[1]) if len(node.inputs) > 1 else None
    if k and k[0] >= TOPK_K_LIMIT:
        return f"TopK: K = {k[0]} is not below {TOPK_K_LIMIT}, TensorRT's limit (N5)"
    return None


def _layer_norm(node: ir.Node) -> str | None:
    if any(is_used(value) for value in node.outputs[1:]):
        return (
            "LayerNormalization: TensorRT supports only the first output Y, and Mean/InvStdDev are used (N5)"
        )
    return None


def _pool(node: ir.Node) -> str | None:
    if node.op_type == "MaxPool" and len(node.outputs) > 1 and is_used(node.outputs[1]):
        return "MaxPool: the Indices output is not supported by TensorRT (N5)"
    x = node.inputs[0]
    if x is not None and x.shape is not None and len(x.shape) < 4:
        return f"{node.op_type}: TensorRT pools in 2D or 3D only, and this input has rank {len(x.shape)} (N5)"
    return None


def _zero_point(node: ir.Node) -> str | None:
    zero_point = node.inputs[2] if len(node.inputs) > 2 else None
    if zero_point is None:
        return None
    values = const_ints(zero_point)
    if values is None:
        return f"{node.op_type}: the zero point is not a constant; TensorRT needs it to be 0 (N5)"
    if any(values):
        return f"{node.op_type}: zero point {values[:4]} is not 0; TensorRT takes symmetric quantisation only (N5, N10)"
    return None


def _resize(node: ir.Node) -> str | None:
    scales = node.inputs[2] if len(node.inputs) > 2 else None
    axes = node.attributes.get("axes")
    rank = (
        len(node.inputs[0].shape) if node.inputs[0] is not None and node.inputs[0].shape is not None else None
    )
    if scales is not None and axes is not None and rank is not None:
        if [int(a) % rank for a in axes.value] != list(range(rank)):
            return "Resize: with a scales tensor, TensorRT needs axes to be 0..rank-1 in order (N5)"
    return None


def _deform_conv(node: ir.Node) -> str | None:
    pads = node.attributes.get("pads")
    if pads is not None:
        values = list(pads.value)
        half = len(values) // 2
        if values[:half] != values[half:]:
            return f"DeformConv: pads {values} differ at the beginning and end of an axis; TensorRT needs them equal (N5)"
    return None


_REASONS = {
    "TopK": _topk,
    "LayerNormalization": _layer_norm,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "QuantizeLinear": _zero_point,
    "DequantizeLinear": _zero_point,
    "Resize": _resize,
    "DeformConv": _deform_conv,
}


# ---- rewrites ---------------------------------------------------------------------------------------


def layer_norm_y_only(model: ir.Model) -> int:
    """Drop LayerNormalization's unused Mean/InvStdDev outputs (optional outputs; Y is unchanged)."""
    count = 0
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if (
            node.op_type != "LayerNormalization"
            or node.domain not in _DEFAULT_DOMAINS
            or len(node.outputs) < 2
        ):
            continue
        if any(is_used(value) for value in node.outputs[1:]):
            continue
        node.resize_outputs(1)
        count += 1
    return count


def compress_to_gather(model: ir.Model) -> int:
    """Compress(x, condition, axis) -> Gather(x, Reshape(NonZero(condition), [-1]), axis)."""
    opset = default_opset(model) or 9
    nodes = [
        n for n in ir.traversal.RecursiveGraphIterator(model.graph)
        if n.op_type == "Compress" and n.domain in _DEFAULT_DOMAINS
    ]  # fmt: skip
    for node in nodes:
        e = Emitter(model, node, opset)
        x, condition = node.inputs[0], node.inputs[1]
        flat = np.array([-1], dtype=np.int64)
        indices = e.op("Reshape", e.op("NonZero", condition), e.const(flat))
        axis_attr = node.attributes.get("axis")
        if axis_attr is None:
            x, axis = e.op("Reshape", x, e.const(flat)), 0
        else:
            axis = int(axis_attr.value)
        replace_node(node, [e.op("Gather", x, indices, axis=axis)])
    return len(nodes)


# ---- script pieces ----------------------------------------------------------------------------------


def _profile_shapes(span: dict[str, dict[str, list[int]]]) -> dict[str, str]:
    """trtexec's ``--minShapes`` / ``--optShapes`` / ``--maxShapes`` values: ``name:1x3x8x8,...`` per key."""
    if not span:
        return {}
    return {
        key: ",".join(f"{name}:{'x'.join(map(str, shapes[key]))}" for name, shapes in span.items())
        for key in ("min", "opt", "max")
    }


def _shell_name(dim: str) -> str:
    """A symbolic dim as the stem of a shell variable name: ASCII letters and digits, the rest ``_``."""
    return "".join(c if c.isascii() and c.isalnum() else "_" for c in dim).upper()


ADAPTER = NvidiaAdapter()
