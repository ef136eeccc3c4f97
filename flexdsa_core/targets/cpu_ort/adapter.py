"""cpu-ort: a generic CPU running ONNX Runtime's CPU execution provider.

Its op table is not a list someone typed: it is the CPU provider's kernel registry in the installed
onnxruntime, so legality always matches the runtime that validates and runs the output.
"""

from __future__ import annotations

import platform
import re
import tempfile
from functools import cache
from pathlib import Path

import onnx_ir as ir
import onnx_ir.passes.common as common_passes

from flexdsa_core.in_memory import ORT_DISABLED_OPTIMIZERS, InMemoryModel, disabled_optimizers, owned_arrays
from flexdsa_core.ingest import needs_external_data
from flexdsa_core.rewrites import Legalisation
from flexdsa_core.targets.base import BucketModel, Legalized, PlatformAdapter
from flexdsa_core.targets.spec import TargetSpec, op_key


@cache
def _ort_cpu_ops() -> frozenset[str]:
    from flexdsa_core._libraries import ort_kernels  # here: loading targets must not load onnxruntime

    return frozenset(op_key(op_type, domain) for op_type, domain in ort_kernels("CPUExecutionProvider"))


# Normalisations whose residual Add ONNX Runtime's own optimizer fuses at load time (ORT_ENABLE_EXTENDED+).
_SKIP_FUSED_NORMS = {"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization"}


def _same_shape(a: ir.Value, b: ir.Value) -> bool:
    return (
        a.shape is not None
        and b.shape is not None
        and len(a.shape) == len(b.shape)
        and all(x == y for x, y in zip(a.shape, b.shape, strict=True))
    )


def pin_unfused_residuals(model: ir.Model) -> int:
    """Residual ``Add`` -> ``Sum`` in front of a normalisation the Fusion Switcher left unfused.

    The switcher refuses SkipLayerNormalization where ORT's CPU kernel measures slower than Add +
    LayerNormalization (4-6x at [1,128,768] with ORT 1.31), but ORT's own optimizer would fuse the pair
    again when the package is loaded at ORT_ENABLE_ALL. A two-input ``Sum`` computes exactly the same
    element-wise sum at the same speed and is not what that fusion matches, so the decision holds at run
    time. Only same-shape inputs are rewritten (Sum and Add broadcast alike, but we keep it obvious).
    """
    pinned = 0
    for node in list(model.graph):
        if node.op_type not in _SKIP_FUSED_NORMS or node.domain not in ("", "ai.onnx") or not node.inputs:
            continue
        producer = node.inputs[0].producer() if node.inputs[0] is not None else None
        if producer is None or producer.op_type != "Add" or producer.domain not in ("", "ai.onnx"):
            continue
        a, b = producer.inputs
        if not _same_shape(a, b):
            continue
        total = ir.node("Sum", [a, b], name=f"{producer.name}_pinned" if producer.name else None)
        total.outputs[0].shape, total.outputs[0].type = producer.outputs[0].shape, producer.outputs[0].type
        model.graph.insert_before(producer, total)
        producer.outputs[0].replace_all_uses_with(total.outputs[0], replace_graph_outputs=True)
        name = producer.outputs[0].name
        model.graph.remove(producer, safe=True)
        total.outputs[0].name = name
        pinned += 1
    return pinned


# Fusion rules whose fusion ONNX Runtime's own graph optimizers (by their names in ``disabled_optimizers``) make
# again when a model is loaded at ORT_ENABLE_EXTENDED or above, and offline in ``ort_layout``: a rule switched
# off (``disabled_rules``, or by the bisection) with its fusion made anyway. Each pair was seen on the fixtures
# (tests/core/targets/test_cpu_ort_held.py checks every one): MobileNetV2 with conv_bn_fold off came back with no
# BatchNormalization, and with conv_bias_act off with 15 FusedConv. Rules missing here are not made again by
# ONNX Runtime on the fixtures (layer_norm, gelu_erf, attention, multihead_attention, skip_layer_norm: held by
# ``pin_residual_sum``). ONNX Runtime ignores a name it does not know, so a wrong one would fail silently.
ORT_TWINS: dict[str, tuple[str, ...]] = {
    "conv_bn_fold": ("ConvBNFusion",),
    "conv_bias_act": ("ConvActivationFusion",),
    "gemm_act": ("GemmActivationFusion",),
    "bias_gelu": ("BiasGeluFusion",),
    "gelu_tanh": ("FastGeluFusion",),
}


def _hold_switched_off(result: Legalized, target: TargetSpec) -> bool:
    """Name, in the model's metadata, the ONNX Runtime optimizers that would make a switched-off fusion again;
    every session here, the bundle's manifest and the runtime load the model with them off."""
    rules = sorted(rule for rule in result.disabled if rule in ORT_TWINS)
    if not rules:
        return False
    held = sorted({name for rule in rules for name in ORT_TWINS[rule]})
    result.model.metadata_props[ORT_DISABLED_OPTIMIZERS] = ",".join(held)
    result.notes.append(
        f"{', '.join(rules)} switched off: ONNX Runtime's own {', '.join(held)} would make the same fusion when "
        "the model is loaded, so they are switched off too (the manifest's session_options.disabled_optimizers, "
        f"and the model's metadata {ORT_DISABLED_OPTIMIZERS})"
    )
    return True


# The domain of ONNX Runtime's blocked-layout kernels: their weights are reordered for this CPU.
_NCHWC_DOMAIN = "com.microsoft.nchwc"
# Above this the model cannot pass through ONNX Runtime's in-memory save (protobuf's 2 GB cap).
_ORT_LAYOUT_LIMIT_BYTES = 1_800_000_000


# What the offline pass pays for: ONNX Runtime's blocked layout (NCHWc) is built for convolutions. On
# graphs without enough of them the pass ran 0.8-1.9 s on the bench's transformers and its output ran within
# noise of ours without it, at ORT_DISABLE_ALL and ORT_ENABLE_ALL alike (BERT, GPT-2, ViT: 0.97-1.01x), since
# what else it does ONNX Runtime does again at load time.
_CONVOLUTIONS = frozenset({"Conv", "ConvTranspose", "com.microsoft::FusedConv", "com.microsoft::NhwcConv"})
_HEAVY = _CONVOLUTIONS | {"MatMul", "Gemm", "com.microsoft::FusedMatMul", "com.microsoft::Attention",
                          "com.microsoft::MultiHeadAttention", "Attention"}  # fmt: skip
ORT_LAYOUT_MIN_CONV_SHARE = 0.10


def convolution_share(model: ir.Model) -> float:
    """Convolutions among the main graph's heavy kernels (convolutions, matrix products, attention)."""
    heavy = [key for key in (op_key(n.op_type, n.domain) for n in model.graph) if key in _HEAVY]
    return sum(key in _CONVOLUTIONS for key in heavy) / len(heavy) if heavy else 0.0


def ort_layout(model: ir.Model) -> ir.Model | None:
    """The model after ONNX Runtime's own graph transformers at ORT_ENABLE_ALL, run offline.

    ORT's NCHWc transformer converts convolutions to its blocked layout with the filters reordered for this
    CPU's vector width; that layout is where most of ORT_ENABLE_ALL's 1.4-2.7x on CNNs comes from, and it
    is only available from ORT itself. Running it here means the package needs no help from the runtime
    (it runs as fast at ORT_DISABLE_ALL). The result is hardware-specific, so the portable model ships
    beside it. Returns None for models too large for ORT's in-memory save.
    """
    import onnxruntime as ort

    if needs_external_data(model, external_data_threshold=_ORT_LAYOUT_LIMIT_BYTES):
        return None
    with tempfile.TemporaryDirectory(prefix="flexdsa-ort-") as folder:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.optimized_model_filepath = str(Path(folder) / "model.onnx")
        options.intra_op_num_threads = 1
        options.log_severity_level = (
            3  # its "hardware specific" warning is what we want; we say so in the manifest
        )
        # The weights go to ONNX Runtime from memory (``in_memory``): the file it writes is the same, byte for
        # byte, without serialising them first (ResNet-18: 0.31 -> 0.16 s).
        InMemoryModel.from_ir(model, finished=False).session(options)  # with the model's disabled optimizers
        optimized = ir.load(Path(folder) / "model.onnx")
        for initializer in optimized.graph.initializers.values():
            # ORT writes one file here, so tensors are in memory; any external one is read before cleanup.
            if isinstance(initializer.const_value, ir.ExternalTensor):
                initializer.const_value = ir.tensor(initializer.const_value.numpy(), name=initializer.name)
        # The weights as arrays that sessions read in place: the parsed file goes, not kept beside a copy; a
        # weight ORT left as it was is the input model's own array (shared with the original's, every bucket's).
        owned_arrays(optimized, share_with=model)
    # ORT does not keep node metadata (which fusion rule made a node): carried over by node name.
    metadata = {
        node.name: dict(node.metadata_props) for node in model.graph if node.name and node.metadata_props
    }
    for node in optimized.graph:
        node.metadata_props.update(metadata.get(node.name, {}))
    optimized.metadata_props.update(model.metadata_props)
    _renumber_ort_names(optimized, model)
    # ORT writes an import for every domain it knows (ai.onnx.ml, training, preview...); keep the used ones.
    common_passes.RemoveUnusedOpsetsPass()(optimized)
    return optimized


# ORT names what its transformers create ``reorder``, ``reorder_token_12``..., from a counter whose order
# varies from run to run (the same model came out with ReorderOutput_token_28 or _29 at the same place).
_ORT_TOKEN = re.compile(r"_token_\d+$")


def _renumber_ort_names(model: ir.Model, before: ir.Model) -> None:
    """Rename what ORT created (names ``before`` did not have) to ``<base>_ort<k>``, k by first appearance in
    graph order, and order the initializers by name, so the same graph is always written with the same bytes."""
    known = {
        v.name for v in [*before.graph.inputs, *before.graph.outputs, *before.graph.initializers.values()]
    }
    for node in before.graph:
        known.add(node.name)
        known.update(v.name for v in node.outputs)
    created: dict[ir.Value, str] = {}  # in order of first appearance -> base name
    for node in model.graph:
        for value in [*node.inputs, *node.outputs]:
            if value is None or value in created or not value.name or value.name in known:
                continue
            if not (value.is_graph_input() or value.is_graph_output()):
                created[value] = _ORT_TOKEN.sub("", value.name)
    taken = set(known)

    def fresh(base: str) -> str:
        index = 0
        while f"{base}_ort{index}" in taken:
            index += 1
        taken.add(f"{base}_ort{index}")
        return f"{base}_ort{index}"

    for index, value in enumerate(created):
        value.name = (
            f"~ort-renaming-{index}"  # out of the way first: a new name may be another value's old one
        )
    for value, base in created.items():
        value.name = fresh(base)
    for node in model.graph:
        if node.name and node.name not in known:
            node.name = fresh(_ORT_TOKEN.sub("", node.name))
    initializers = sorted(model.graph.initializers.values(), key=lambda v: v.name or "")
    model.graph.initializers.clear()
    for value in initializers:
        model.graph.register_initializer(value)


def cpu_features() -> dict[str, object]:
    """What the hardware-specific layout was built for (x86 vector extensions from /proc/cpuinfo)."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return {
        "machine": platform.machine(),
        "vector_extensions": sorted(
            f for f in flags if f.startswith(("avx", "sse4", "fma", "neon", "asimd"))
        ),
    }


def _pin_residual_sum(result: Legalized, target: TargetSpec) -> bool:
    pinned = pin_unfused_residuals(result.model)
    if pinned:
        result.notes.append(
            f"{pinned} residual Add(s) before a normalisation written as Sum, so that ONNX Runtime's "
            "load-time SkipLayerNormalization fusion, which the Fusion Switcher measured as slower here, "
            "does not undo its decision"
        )
    return bool(pinned)


def _ort_layout(result: Legalized, target: TargetSpec) -> bool:
    model = result.model
    calls = sorted(
        {
            f"{n.domain}::{n.op_type}"
            for n in model.graph
            if (n.domain, n.op_type, n.overload) in model.functions
        }
    )
    if calls:
        # ORT's offline pass inlines model-local functions: a fusion that produces one (weighted_sum's
        # flexdsa::WeightedSum, for a target that runs it natively) would vanish from the delivered file.
        result.notes.append(
            f"ONNX Runtime's offline pass skipped: it would inline the model-local function(s) {', '.join(calls)}"
        )
        return False
    if (share := convolution_share(model)) < ORT_LAYOUT_MIN_CONV_SHARE:
        result.notes.append(
            f"ONNX Runtime's offline pass skipped: convolutions are {share:.0%} of the heavy kernels (under "
            f"{ORT_LAYOUT_MIN_CONV_SHARE:.0%}), and its blocked layout for them is what pays offline; ONNX "
            "Runtime applies its other graph transformers itself when it loads the model"
        )
        return False
    tuned = ort_layout(model)
    if tuned is None:
        result.notes.append(
            "ONNX Runtime's offline layout pass skipped: the model keeps its weights in external data"
        )
        return False
    result.model = tuned
    if any(node.domain == _NCHWC_DOMAIN for node in tuned.graph):
        # Blocked for this CPU's vector width: ship the graph from before it as well.
        result.portable = model
        result.notes.append(
            "ONNX Runtime's own layout transformers (NCHWc blocked convolutions) run offline: "
            f"this model is specific to CPUs like this one ({cpu_features()['machine']}); "
            "its .portable.onnx beside it runs anywhere"
        )
    else:
        result.notes.append(
            "ONNX Runtime's own graph transformers run offline; nothing hardware-specific resulted, "
            "so this model runs on any CPU"
        )
    return True


class CpuOrtAdapter(PlatformAdapter):
    vendor = "generic"
    legalisations = (
        Legalisation(
            name="hold_switched_off", apply=_hold_switched_off,
            summary="A fusion rule switched off stays off where the model runs: ONNX Runtime's optimizer that "
            "makes the same fusion at load time is named in the model's metadata and the manifest, and "
            "switched off in every session.",
        ),
        Legalisation(
            name="pin_residual_sum", apply=_pin_residual_sum, produces=("Sum",),
            summary="A residual Add before a normalisation the Fusion Switcher left unfused written as Sum, so "
            "ONNX Runtime's load-time SkipLayerNormalization fusion does not undo the decision.",
        ),
        Legalisation(
            name="ort_layout", apply=_ort_layout, after=("pin_residual_sum", "hold_switched_off"), float_only=True,
            summary="ONNX Runtime's own graph transformers run offline (NCHWc blocked convolutions where "
            "convolutions dominate); for the float model only: the int8 quantiser takes the graph before it.",
        ),
    )  # fmt: skip

    def supported_op_keys(self, target: TargetSpec) -> frozenset[str]:
        if target.supported_ops == ["*"]:
            return _ort_cpu_ops()
        return frozenset(target.supported_ops)

    def manifest(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> dict:
        manifest = super().manifest(buckets, target, report)
        # The graph is already optimised offline; ORT's own basic passes remain cheap and safe at load time.
        manifest["session_options"] = {
            "graph_optimization_level": "ORT_ENABLE_ALL",
            "providers": ["CPUExecutionProvider"],
        }
        # What a switched-off fusion needs held off at load (``_hold_switched_off``), every bucket's.
        held = sorted({name for bucket in buckets for name in disabled_optimizers(bucket.model.metadata_props)})
        if held:
            manifest["session_options"]["disabled_optimizers"] = held
        return manifest


ADAPTER = CpuOrtAdapter()
