"""Qualcomm Snapdragon 8 Gen 3 (SM8650) Hexagon NPU through ONNX Runtime's QNN execution provider (HTP
backend, v75): limits the constraint language cannot say, and the bundle's QNN scripts.

The op table (what the QNN EP maps, Q1) and the per-op limits that are attribute or constant-input rules
(ArgMax ``select_last_index``, CumSum ``reverse``, Pad ``wrap``, pool dilations, run-time shape inputs)
are data in ``sm8650.json`` beside it. What is here needs the graph; each rule is what onnxruntime-qnn
2.7.0's HTP validation refused on a probe graph, its REASON quoted:

* tensors of rank above 5 ("Failed to add node.": HTP tensors have at most 5 dims);
* MaxPool over 3 spatial dims ("QNN NPU does not support PoolMax3d!");
* LayerNormalization over anything but the last axis ("QNN LayerNorm on HTP only supports normalization
  along the last axis.");
* Einsum with one input ("Einsum requires at least 2 inputs.");
* ReduceProd, which the EP maps but the HTP backend lacks ("ReduceProd operator not supported by HTP
  backend.");
* com.microsoft::Inverse of anything but 2x2 matrices ("QNN expects 2x2 Inverse Op: [..., 2, 2].");
* RandomUniformLike and STFT: QNN's validation passes them, but the emulated HTP graph then fails to
  execute (QNN_COMMON_ERROR_GENERAL) or to finalise (QNN_COMMON_ERROR_MEM_ALLOC): we place them on the CPU,
  where QNN's own placement (taken from its validation) says HTP. The only rules here that disagree with
  QNN's placement, on purpose: a model holding one does not compile for the HTP as QNN partitions it.

No legalisation rewrite is needed for the fixtures: QNN validates every node of the six after our passes
(the erf GELU fuses into com.microsoft::Gelu, which the EP's Gelu builder takes). QNN HTP computes
quantised or fp16 graphs, not float32: the toolchain quantises each bucket to QNN's QDQ (asymmetric
uint8, or uint16 activations when uint8 misses the accuracy target) before compiling it.
"""

from __future__ import annotations

import pprint
import sys
from pathlib import Path

import onnx_ir as ir

from flexdsa_core.targets.accelerator import AcceleratorAdapter
from flexdsa_core.targets.base import BucketModel
from flexdsa_core.targets.bundle_inputs import (
    float_layer_tensors,
    mixed_sections,
    requested_precision,
    runtime_inputs,
)
from flexdsa_core.targets.int8_format import Int8Format
from flexdsa_core.targets.render import render
from flexdsa_core.targets.spec import TargetSpec
from flexdsa_core.targets.vendor_cost import VendorCost

# QNN HTP architecture and SoC id of the Snapdragon 8 Gen 3 (QNN EP provider options htp_arch / soc_model).
HTP_ARCH = "75"
SOC_MODEL = "57"
PROVIDER_OPTIONS = {"backend_type": "htp", "htp_arch": HTP_ARCH, "soc_model": SOC_MODEL}
MAX_RANK = 5  # a rank-6 Add or Concat: "Failed to add node." (onnxruntime-qnn 2.7.0)
# Ops the QNN EP maps (Q1) that the HTP backend still refuses or cannot run (onnxruntime-qnn 2.7.0).
HTP_LACKS = {
    "ReduceProd": "ReduceProd has no HTP kernel (QNN: 'QNN EP: ReduceProd operator not supported by HTP backend.')",
    "RandomUniformLike": (
        "RandomUniformLike passes QNN's validation but the HTP graph holding it fails to execute "
        "(QNN_COMMON_ERROR_GENERAL, seen in HTP emulation): kept on the CPU"
    ),
    "STFT": (
        "STFT passes QNN's validation but the HTP graph holding it fails to finalise "
        "(QNN_COMMON_ERROR_MEM_ALLOC, seen in HTP emulation): kept on the CPU"
    ),
}


class QualcommAdapter(AcceleratorAdapter):
    vendor = "Qualcomm"
    provider_options = PROVIDER_OPTIONS
    int8_format = Int8Format(
        "QNN QDQ (get_qnn_qdq_config): uint8 activations; Conv, MatMul and Gemm weights int8, symmetric, per "
        "output channel, Conv biases corrected on the calibration samples; other weights (LayerNorm's) uint8 per "
        "tensor; where that misses the "
        "target, the int8 weights' rounding learned (AdaRound) before uint16; the layers mixed keeps "
        "out of uint8 get uint16 activations (a16w8)", "uint8", False, False, False,
        weights="int8", per_channel=True, vendor="qualcomm", float_as="uint16 activations (a16w8)",
    )  # fmt: skip
    artifact_loads = {
        "qdq-onnx": (
            None,
            "the QDQ model the QNN context binary was compiled from: compile_qnn.py recompiles it on the device",
        ),
        "qnn-context": (
            "onnxruntime-qnn",
            "onnxruntime.InferenceSession(file) with the QNN execution provider (onnxruntime-qnn registered, "
            "backend_type=htp); the context binary it names must sit beside it",
        ),
        "qnn-context-binary": (
            None,
            "the QNN context binary the .qnn_ctx.onnx beside it loads; keep them together",
        ),
    }
    vendor_needs_inputs = True  # the EP compiles a session: it quantises on and runs a sample
    vendor_package = "onnxruntime-qnn"
    # The vendor alone: qnn_preprocess_model, as QNN's documentation asks, and get_qnn_qdq_config's defaults
    # (uint8 weights per tensor, the quantiser's biases).
    vendor_alone_options = {"vendor_preprocess": True, "conv_per_channel": False, "matmul_per_channel": False,
                            "correct_biases": None, "learn_rounding": None, "packed_uint16": None}  # fmt: skip

    def calibrated_options(self, bucket: BucketModel, samples: list[dict]) -> dict:
        """An output that packs quantities of unlike range (P-Net's boxes in pixels beside its scores in 0..1)
        gets one uint8 scale from QNN, which leaves a score a few steps: the pack's tensors (its computed inputs,
        the Concat and the shape-only ops to the output, ``forms.packed_outputs``) go uint16 instead, at every
        precision that quantises."""
        from flexdsa_core.targets.forms.packed_outputs import find

        applied = find(bucket.model, samples)
        if not applied.float16:
            return {}
        nodes = {node.name: node for node in bucket.model.graph}
        tensors = []
        for name in applied.float16:
            node = nodes[name]
            if node.op_type == "Concat":
                tensors += [v.name for v in node.inputs if v is not None and v.const_value is None]
            tensors += [v.name for v in node.outputs]
        return {"packed_uint16": list(dict.fromkeys(tensors)), "packed_sites": applied.sites}

    def vendor_cost(self, entry: dict, versions: dict) -> VendorCost | None:
        """QNN reports no cost, only where each node runs (its per-node validation in ONNX Runtime's verbose
        log): the nodes it leaves on the CPU, and how many it placed."""
        placement = entry.get("placement") or {}
        if not placement:
            return None
        on_cpu = sorted(name for name, device in placement.items() if device != "accelerator")
        version = versions.get("onnxruntime-qnn") or "(version unknown)"
        return VendorCost(
            cycles=None, cpu_nodes=len(on_cpu), transitions=None, layers=len(placement), cpu_layers=tuple(on_cpu),
            source=f"onnxruntime-qnn {version} placement on the HTP (QNN's own per-node validation); no cost figure",
        )

    # ---- legality beyond the op table --------------------------------------------------------------
    def node_reason(self, node: ir.Node, target: TargetSpec) -> str | None:
        if node.domain == "com.microsoft" and node.op_type == "Inverse":
            shape = node.inputs[0].shape if node.inputs and node.inputs[0] is not None else None
            if shape is not None and list(shape)[-2:] != [2, 2]:
                return "com.microsoft::Inverse: QNN inverts 2x2 matrices only (QNN: 'QNN expects 2x2 Inverse Op: [..., 2, 2].')"
        if node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type in HTP_LACKS:
            return HTP_LACKS[node.op_type]
        deep = _deepest(node)
        if deep is not None and len(deep.shape) > MAX_RANK:
            return (
                f"{node.op_type}: {deep.name!r} has rank {len(deep.shape)}; HTP tensors have at most {MAX_RANK} "
                "dims (QNN validation: 'Failed to add node.')"
            )
        if node.op_type == "MaxPool" and _rank(node.inputs[0]) == 5:
            return "MaxPool over 3 spatial dims: the HTP has no 3-D max pool (QNN: 'QNN NPU does not support PoolMax3d!')"
        if node.op_type == "LayerNormalization":
            rank = _rank(node.inputs[0])
            axis = _int_attr(node, "axis", -1)
            if rank is not None and axis not in (-1, rank - 1):
                return (
                    f"LayerNormalization over axis {axis} of a rank-{rank} tensor: QNN's HTP LayerNorm normalises "
                    "the last axis only (QNN: 'QNN LayerNorm on HTP only supports normalization along the last "
                    "axis.')"
                )
        if node.op_type == "Einsum" and len([v for v in node.inputs if v is not None]) < 2:
            return "Einsum with one input: QNN maps Einsum to a MatMul of two (QNN: 'Einsum requires at least 2 inputs.')"
        return None

    # ---- the vendor toolchain ----------------------------------------------------------------------
    def toolchain_options(self, target: TargetSpec, report: dict) -> dict:
        """The request's ``precision`` decides the HTP format (``report["precision"]``):

        * ``int8``: uint8 activation QDQ (uint8 weights), uint16 activations where uint8 misses the accuracy
          target's cosine (ViT: cosine 0.950 with uint8, 0.99997 with uint16);
        * ``mixed``: uint8, with the layers our stand-in search keeps out of int8 at uint16 activations
          (``get_qnn_qdq_config``'s per-tensor overrides), all-uint16 if that still misses the target;
        * ``fp16``: the float graph on HTP FP16;
        * ``fp32``: the HTP computes no float32, and an fp32 request brings no calibration data to quantise
          on, so the nearest thing runs: HTP FP16 (``report.json`` → ``toolchain`` says what ran and why).

        ``mixed`` raises the float layers' activations only; their weights stay uint8. Measured under HTP
        emulation (onnxruntime-qnn 2.7.0, cosine to the float model on the job's calibration samples; QDQ and
        emulation are deterministic, so these are exact for those samples, not noisy): on ViT, the fixture
        where uint8 misses the target, the mixed plan gives 0.999847, and adding 16-bit overrides for every
        initializer those layers read (LayerNorm scale/bias, position embedding) gives 0.999855 (uint16) or
        0.999847 (int16 symmetric): no gain. On the synthetic sensitive MLP (tests.core.test_precision: one
        weight row scaled by 1e-4) 16-bit weights for the two float MatMuls raise 0.25 to 0.84, yet that still
        misses 0.99 as all-uint16 activations do (0.25), so the verdict is the same. Not worth another override
        (and the HTP placement of 16-bit-weight MatMuls is not verified) until a model where it flips the verdict.
        """
        plan = report.get("precision") or {}
        requested = plan.get("requested") or requested_precision(report)
        precision = {"int8": "int8", "mixed": "mixed"}.get(requested, "fp16")
        options = {"precision": precision, "activation_type": "auto", "provider": dict(PROVIDER_OPTIONS)}
        if precision != "fp16":
            core = _core_interpreter()
            options.update(conv_per_channel=True, matmul_per_channel=True, correct_biases=core, learn_rounding=core)
        accuracy = plan.get("accuracy_target") or {}
        if accuracy.get("min_cosine") is not None:
            options["min_cosine"] = accuracy["min_cosine"]
        if requested == "fp32":
            options["why"] = (
                "precision fp32 was asked, and the Hexagon HTP computes no float32: the float graph runs in HTP "
                "FP16, the nearest it has (no calibration data comes with fp32 to quantise on)"
            )
        if precision == "mixed":
            options["uint16_tensors"] = {
                name: float_layer_tensors(s) for name, s in mixed_sections(report).items()
            }
        return options

    # ---- the bundle --------------------------------------------------------------------------------
    def vendor_files(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> dict[str, bytes]:
        sections = mixed_sections(report)
        ran = (report.get("toolchain") or {}).get("buckets") or {}
        quantised = self.toolchain_options(target, report)["precision"] != "fp16"
        entries = [
            _bucket_entry(
                self.model_filename(b), b, float_layer_tensors(sections.get(b.name) or {}), ran.get(b.name), quantised
            )
            for b in buckets
        ]
        listing = pprint.pformat(entries, width=110, sort_dicts=False)
        provider = pprint.pformat(PROVIDER_OPTIONS, sort_dicts=False)
        converter = render(__package__, "convert_qnn.sh", buckets=_converter_buckets(entries))
        return {
            "compile_qnn.py": render(__package__, "compile_qnn.py", buckets=listing, provider=provider).encode(),
            "run_qnn.py": render(__package__, "run_qnn.py", buckets=listing, provider=provider).encode(),
            "convert_qnn.sh": converter.encode(),
        }

    def deploy_steps(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> list[str]:
        contexts = ", ".join(f"`model.{b.name}.qnn_ctx.onnx`" for b in buckets)
        raised = {name: len(float_layer_tensors(s)) for name, s in mixed_sections(report).items()}
        counts = ", ".join(f"{count} in bucket {name}" for name, count in raised.items())
        formats = (
            f"precision mixed: uint8, the mixed plan's float layers kept out of it, their tensors at uint16 ({counts}), "
            "as the toolchain here ran it; the script's `BUCKETS` lists them"
            if any(raised.values())
            else "uint8, or uint16 activations where the toolchain here needed them: each bucket's `act`"
        )
        made = (
            " The toolchain here made them already (uint8 or, where that missed the accuracy target, uint16 "
            "activations: see `report.json` → `toolchain`); rerun with your own calibration data for deployment."
            if (report.get("toolchain") or {}).get("ran")
            else ""
        )
        return [
            "On an x86_64 Linux or Windows-on-Snapdragon host: `pip install onnxruntime onnxruntime-qnn numpy onnx` "
            "(`flexdsa toolchains install qualcomm` does this in an environment of its own).",
            "In this folder: `python compile_qnn.py` builds every bucket as it shipped into `rebuilt/` (never over "
            "the shipped files): quantised to QNN's QDQ "
            f"({formats}), on the bundle's own calibration samples, or the float graph on HTP FP16 where that is "
            "what shipped, and compiled for the SM8650 HTP into an EPContext model and QNN context binary "
            f"({contexts} plus its `_qnn.bin`). Another build: `--dataset calib.txt` (your samples: one a line, one "
            ".npy per input, space-separated), `--act uint8` or `--act uint16` (one format everywhere), `--fp16`; "
            f"`--check` runs each once.{made}",
            "To check the shipped context binaries against what `report.json` claims: `flexdsa verify-bundle .` (or, "
            "with only `flexdsa_runtime` installed, `python -m flexdsa_runtime verify .`) runs each on the HTP (emulated "
            "on x86 by the qualcomm toolchain) on the bundle's samples.",
            "Alternatively, with the QNN SDK: `bash convert_qnn.sh calib_list.txt` (qnn-onnx-converter, then the "
            "model-library and context-binary generators, per bucket).",
            "Copy the `.qnn_ctx.onnx` and `_qnn.bin` files, `run_qnn.py` and `manifest.json` to the device. With "
            "onnxruntime and onnxruntime-qnn there (arm64 Android/Linux/Windows), `python run_qnn.py --bucket NAME "
            "x.npy ...` loads the EPContext model on the HTP without recompiling.",
            "Pick the bucket per request as `manifest.json` says (`pick_bucket`): pad the inputs up to the "
            "smallest bucket that holds them and slice the outputs back.",
        ]


# ---- node_reason helpers ----------------------------------------------------------------------------


def _rank(value: ir.Value | None) -> int | None:
    return None if value is None or value.shape is None else len(value.shape)


def _deepest(node: ir.Node) -> ir.Value | None:
    values = [v for v in (*node.inputs, *node.outputs) if v is not None and v.shape is not None]
    return max(values, key=lambda v: len(v.shape), default=None)


def _int_attr(node: ir.Node, name: str, default: int) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else int(attr.value)


def _core_interpreter() -> dict:
    """How the driver, in the toolchain's environment, runs the core's bias correction and learned rounding: this
    interpreter, with the folder holding ``flexdsa_core`` on its path."""
    return {"python": sys.executable, "path": str(Path(__file__).resolve().parents[3])}


# ---- the scripts ------------------------------------------------------------------------------------


def _stem(filename: str) -> str:
    return filename.removesuffix(".onnx")


def _bucket_entry(
    filename: str, bucket: BucketModel, uint16_tensors: list[str] = (), ran: dict | None = None,
    quantised: bool = True,
) -> dict:
    """A bucket as the scripts see it. ``uint16_tensors``: under ``precision: mixed``, the tensors of the layers
    the sensitivity search keeps out of int8, which ``compile_qnn.py`` quantises at uint16 (the driver's
    per-tensor overrides). ``act``: the activation format ``compile_qnn.py`` makes by default, the one the
    toolchain here kept (``ran``: its entry for the bucket): "uint16" where uint8 (or mixed) missed the accuracy
    target and it went a16w8 everywhere, else "mixed" with tensors to raise, else "uint8". ``precision``: "fp16"
    where the shipped context is the float graph on HTP FP16 (or, the toolchain not run, none was to be
    ``quantised``), else "qdq"."""
    inputs = runtime_inputs(bucket.model)
    # A packed output's tensors the toolchain here raised to uint16: the script raises them as mixed does.
    uint16_tensors = list(dict.fromkeys([*uint16_tensors, *((ran or {}).get("packed_uint16") or [])]))
    act = "mixed" if uint16_tensors else "uint8"
    ran_as = str((ran or {}).get("quantization") or "")
    if ran_as.startswith("QDQ: uint16 activations"):
        act = "uint16"
    return {
        "name": bucket.name,
        "onnx": filename,
        # As the toolchain's driver names them (a single bucket's too: model.static.qdq.onnx beside model.onnx).
        "qdq": f"model.{bucket.name}.qdq.onnx",
        "context": f"model.{bucket.name}.qnn_ctx.onnx",
        "inputs": [v.name for v in inputs],
        "shapes": [[int(d) for d in v.shape] for v in inputs],
        "dtypes": [v.dtype.numpy().name if v.dtype is not None else "float32" for v in inputs],
        # What compile_qnn.py builds by default: what shipped (the toolchain's run here), else what was planned.
        "precision": "fp16" if ran_as.startswith("float graph on HTP FP16") or (not ran and not quantised) else "qdq",
        "act": act,
        "uint16_tensors": list(uint16_tensors),
        # The weights the toolchain here quantised to (per-tensor uint8: an older run's, or the vendor alone's).
        "weights": ("int8-per-channel" if "MatMul/Gemm's int8 per-channel" in ran_as or not ran
                    else "conv-int8-per-channel" if "Conv's int8 per-channel" in ran_as else "uint8"),
        # Whether Flex-DSA changed the shipped QDQ model after the quantiser (Conv biases corrected, weights'
        # rounding learned): compile_qnn.py then builds from it.
        "corrected": "Conv biases corrected" in ran_as or "weight rounding learned" in ran_as,
    }  # fmt: skip


def _converter_buckets(entries: list[dict]) -> list[dict]:
    """The buckets as convert_qnn.sh sees them: the ONNX file, the stem of the QNN files made from it, and each
    input's name and shape (``1,3,224,224``, as the converter's ``-d`` takes it)."""
    return [
        {
            "name": entry["name"],
            "onnx": entry["onnx"],
            "stem": _stem(entry["onnx"]).replace(".", "_"),
            "inputs": [{"name": name, "shape": ",".join(map(str, shape))}
                       for name, shape in zip(entry["inputs"], entry["shapes"], strict=True)],
        }  # fmt: skip
        for entry in entries
    ]


ADAPTER = QualcommAdapter()
