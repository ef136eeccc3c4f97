"""What the two AMD Vitis AI targets share: quantisation with AMD Quark before the vendor compiler.

Both the Ryzen AI NPU (``amd.py``) and the KV260 DPU (``xilinx.py``) take quantised QDQ ONNX, made by AMD
Quark (or the older vai_q_onnx): the bundle's models stay float (validated against the original like every
bundle), and the bundle carries the quantise step as a script, which the ``amd`` toolchain (Quark in its own
environment) also runs here on the request's sample inputs. The variants differ by class-level flags:

* ``int8_only``: the accelerator computes nothing but int8 (the DPU, X4): a float model runs there only after
  quantisation. The NPU compiles an fp32 model to BF16 instead (A1), so quantising is its preference, not a
  precondition;
* ``presets``: Quark preset per model kind (``cnn`` / ``transformer``), as Quark's own plan says (A8);
* ``ladder``: per model kind, what the toolchain tries, in order, until the quantised model reaches the
  accuracy target;
* ``quantize_cpu_nodes``: whether nodes the partition places on the CPU are quantised too;
* ``quant_sources``: the source ids the quantisation sentences cite.

A node that reads an integer tensor computed at run time (token ids, shape arithmetic) is not quantised by
Quark and cannot run as an int8 accelerator op: it stays on the CPU, with that reason.
"""

from __future__ import annotations

import onnx_ir as ir

from flexdsa_core.targets.accelerator import AcceleratorAdapter, is_constant, runtime_input_of
from flexdsa_core.targets.bundle_inputs import mixed_sections
from flexdsa_core.targets.render import render
from flexdsa_core.targets.spec import TargetSpec
from flexdsa_core.toolchains.base import MIN_COSINE

INTEGER_DTYPES = frozenset(
    {ir.DataType.INT64, ir.DataType.INT32, ir.DataType.UINT64, ir.DataType.UINT32, ir.DataType.BOOL}
)
QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
# The ops a transformer has and a CNN does not; Quark's plan picks the preset by this (A8).
TRANSFORMER_OPS = frozenset({"Softmax", "LayerNormalization"})


class VitisAIAdapter(AcceleratorAdapter):
    vendor = "AMD"
    int8_only = False
    presets: dict[str, str] = {"cnn": "XINT8", "transformer": "A8W8"}
    # A CNN keeps every op quantised (AdaRound next); a transformer first leaves all but Conv/Gemm/MatMul in
    # float (its norms and softmax lose most to int8); either way the step that holds is reported.
    ladder: dict[str, tuple[str, ...]] = {
        "cnn": ("preset", "adaround", "float_non_compute"),
        "transformer": ("preset", "float_non_compute", "adaround"),
    }
    quant_sources = "A8"
    accelerator = "accelerator"
    # False: nodes our partition puts on the CPU stay float in the quantised model (the DPU compiler makes
    # CPU subgraphs of them, X9); True: the whole graph is quantised and the EP decides (A2).
    quantize_cpu_nodes = True

    # ---- legality -----------------------------------------------------------------------------------
    def node_reason(self, node: ir.Node, target: TargetSpec) -> str | None:
        if node.domain not in ("", "ai.onnx") or node.op_type in QDQ_OPS:
            return None
        integer = runtime_input_of(node, INTEGER_DTYPES)
        if integer is not None:
            dtype = integer.dtype.name.lower() if integer.dtype is not None else "integer"
            return (
                f"{node.op_type} reads the {dtype} tensor {integer.name!r}, computed at run time: the quantiser "
                f"leaves integer arithmetic unquantised and the {self.accelerator} runs quantised int8 ops, so it "
                f"stays on the CPU ({self.quant_sources})"
            )
        return None

    def partition_notes(self, model: ir.Model, target: TargetSpec) -> list[str]:
        if any(node.op_type in QDQ_OPS for node in model.graph):
            return [f"the model is already quantised (QDQ): {target.name} takes it as it is"]
        kind = model_kind(model)
        preset = self.presets[kind]
        if self.int8_only:
            return [
                f"the bundle's model is float and the {self.accelerator} computes int8 only: the accelerator "
                f"partitions run there only after quantisation. The bundle carries that step (Quark {preset}, "
                f"power-of-two int8 per tensor, {self.quant_sources}); the amd toolchain runs it here when "
                "installed, and until then the placement above is what the quantised model would get"
            ]
        return [
            f"the bundle's model is float: quantise it for the {self.accelerator} with the bundle's Quark step "
            f"({preset} for a {kind} model, {self.quant_sources}); run as fp32 the Vitis AI EP compiles it to "
            "BF16 instead (A1)"
        ]

    # ---- the toolchain ------------------------------------------------------------------------------
    def toolchain_options(self, target: TargetSpec, report: dict) -> dict:
        """The request's ``precision`` picks what Quark makes (``report["precision"]``): ``int8`` the preset
        per model kind with the ladder; ``mixed`` the same with the layers our sensitivity search keeps out of
        int8 excluded (float; on the DPU a CPU subgraph); ``fp32`` on an int8-only accelerator still XINT8 (the
        only thing it runs, said so), elsewhere Quark's BF16, what the Vitis AI EP compiles a float model to.
        (fp16 is refused before any work: neither part computes float16.)"""
        plan = report.get("precision") or {}
        requested = plan.get("requested") or "fp32"
        accuracy = plan.get("accuracy_target") or {}
        options = {
            "presets": dict(self.presets),
            "ladder": {kind: list(steps) for kind, steps in self.ladder.items()},
            "min_cosine": accuracy.get("min_cosine", MIN_COSINE),
            "precision": "mixed" if requested == "mixed" else "int8",
        }
        if requested == "fp32" and self.int8_only:
            options["why"] = (
                f"precision fp32 was asked, and the {self.accelerator} computes int8 only ({self.quant_sources}): "
                "the only model it runs, XINT8, was made and judged (an fp32 request brings no calibration data: "
                "calibrated on the seeded sample input)"
            )
        elif requested == "fp32":
            options["precision"] = "bf16"
            options["why"] = (
                f"precision fp32 was asked: the Vitis AI EP compiles a float model to BF16 for the "
                f"{self.accelerator} (A1), so Quark's BF16 was made here and judged"
            )
        if requested == "mixed":
            sections = mixed_sections(report)
            options["float_layers"] = {name: list(s.get("float_layers") or []) for name, s in sections.items()}
        if not self.quantize_cpu_nodes:
            options["keep_float"] = cpu_nodes(report)
        return options

    def qdq_filename(self, bucket) -> str:
        return self.model_filename(bucket).removesuffix(".onnx") + ".qdq.onnx"


def cpu_nodes(report: dict) -> dict[str, list[str]]:
    """Per bucket, the nodes the partition places on the CPU (``report["partition"]``)."""
    return {
        bucket: sorted(node for node, device in part.get("placement", {}).items() if device == "cpu")
        for bucket, part in (report.get("partition") or {}).items()
    }


def model_kind(model: ir.Model) -> str:
    """'transformer' for Softmax/LayerNormalization or a MatMul of two run-time tensors, else 'cnn'."""
    for node in model.graph:
        if node.op_type in TRANSFORMER_OPS:
            return "transformer"
        if node.op_type == "MatMul" and len(node.inputs) == 2 and not any(is_constant(v) for v in node.inputs):
            return "transformer"
    return "cnn"


# ---- the bundle's quantise step (shared by both targets) --------------------------------------------


def quantize_entries(adapter: VitisAIAdapter, buckets, report: dict | None = None) -> list[dict]:
    """Per bucket: its float ONNX, the QDQ file to write, its inputs, the Quark preset for its kind, and the
    nodes the quantise step leaves in float, as the toolchain run here does (``toolchain_options``):
    ``float_layers``, the layers the ``mixed`` plan's sensitivity search keeps out of int8, and ``keep_float``,
    the nodes the partition puts on the CPU beside an int8-only accelerator (``quantize_cpu_nodes`` False)."""
    from flexdsa_core.targets.bundle_inputs import input_dims, runtime_inputs

    report = report or {}
    sections = mixed_sections(report)
    on_cpu = {} if adapter.quantize_cpu_nodes else cpu_nodes(report)
    entries = []
    for bucket in buckets:
        inputs = runtime_inputs(bucket.model)
        names = {node.name for node in bucket.model.graph}
        float_layers = [n for n in (sections.get(bucket.name) or {}).get("float_layers") or [] if n in names]
        entries.append({
            "name": bucket.name,
            "onnx": adapter.model_filename(bucket),
            "qdq": adapter.qdq_filename(bucket),
            "inputs": [v.name for v in inputs],
            "shapes": [input_dims(v) for v in inputs],
            "dtypes": [v.dtype.numpy().name if v.dtype is not None else "float32" for v in inputs],
            "preset": adapter.presets[model_kind(bucket.model)],
            "float_layers": float_layers,
            "keep_float": sorted(names & set(on_cpu.get(bucket.name) or [])),
        })  # fmt: skip
    return entries


def float_note(adapter: VitisAIAdapter, buckets, report: dict) -> str:
    """The deploy step's words for the nodes the bundle's quantise script leaves in float ('' for none)."""
    entries = quantize_entries(adapter, buckets, report)
    mixed = {e["name"]: e["float_layers"] for e in entries if e["float_layers"]}
    cpu = sum(len(e["keep_float"]) for e in entries)
    parts = []
    if mixed:
        named = "; ".join(f"{name}: {', '.join(layers[:6])}{' ...' if len(layers) > 6 else ''}"
                          for name, layers in mixed.items())  # fmt: skip
        parts.append(f"keeps the mixed plan's float layers out of int8 ({named})")
    if cpu:
        parts.append(f"leaves the {cpu} node(s) the partition puts on the CPU in float")
    return "; the script " + " and ".join(parts) + ", as the toolchain here did (its `BUCKETS`)" if parts else ""



def quantize_script(
    adapter: VitisAIAdapter,
    buckets,
    report: dict | None = None,
    *,
    script: str,
    what: str,
    quantizers: list[str],
) -> str:
    import pprint

    note = (
        "Or the Vitis AI quantiser: `--quantizer vai_q_onnx` (vai_q_onnx.quantize_static, QDQ, PowerOfTwoMethod."
        "MinMSE, int8, per tensor: X8)."
        if "vai_q_onnx" in quantizers
        else ""
    )
    return render(
        "flexdsa_core.targets", "quantize_vitis_ai.py",
        what=what,
        script=script,
        sources=adapter.quant_sources,
        quantizer_note=note,
        buckets=pprint.pformat(quantize_entries(adapter, buckets, report), width=110, sort_dicts=False),
        preset_note=", ".join(f"{kind} -> {preset}" for kind, preset in adapter.presets.items()),
        quantizers=repr(quantizers),
    )
