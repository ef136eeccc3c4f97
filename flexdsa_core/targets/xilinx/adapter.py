"""AMD/Xilinx Kria KV260 DPU (DPUCZDX8G B4096) through Vitis AI: quantise to power-of-two int8, compile
with ``vai_c_xir`` into an xmodel against the board's ``arch.json``.

The DPU computes int8 only (X4). Its operators (X4) are the op table in ``kv260.json`` beside it; what the
DPU cannot run, ``vai_c_xir`` leaves in CPU subgraphs for the board's Cortex-A53s (X9). DPUCZDX8G's own
kernel/stride limits are unsourced: the sibling DPUCAHX8H's (X11) stand in, each reason saying so. What the
op table and the constraint language cannot say is here:

* Clip is the DPU's ReLU6 only with bounds 0 and 6 (X4);
* a Conv's ``kernel_w * kernel_h * ceil(C_in / 16) <= 2048`` and ``C_out <= 256 * 16`` (X11's limits, with
  the B4096's input/output channel parallelism of 16, X2);
* Softmax is optional in the DPU IP (X4) and not assumed on the KV260 overlay: CPU;
* integer tensors computed at run time are not quantised: CPU (the shared base).

The bundle: ``quantize_kv260.py`` (AMD Quark XINT8: symmetric int8, power-of-two scales, MinMSE, per tensor,
the DPU's scheme (X8); or ``--quantizer vai_q_onnx``), and ``compile_kv260.sh``, which runs it and then
``vai_c_xir`` per bucket with the KV260 ``arch.json`` (X10, X5). The ``amd`` toolchain quantises here with
Quark on the request's samples, leaving the nodes our partition puts on the CPU in float (they become CPU
subgraphs), with the shared accuracy ladder when plain XINT8 misses the target (a node it leaves in float
runs on the CPU, and the toolchain notes say how many), and checks the quantised model in ONNX Runtime; the
compiler itself does not install here.
"""

from __future__ import annotations

import math

import onnx_ir as ir

from flexdsa_core.targets._vitis_ai import VitisAIAdapter, float_note, quantize_script
from flexdsa_core.targets.base import BucketModel
from flexdsa_core.targets.int8_format import Int8Format
from flexdsa_core.targets.render import render
from flexdsa_core.targets.spec import TargetSpec, op_key

ARCH_JSON = "/opt/vitis_ai/compiler/arch/DPUCZDX8G/KV260/arch.json"  # inside the Vitis AI docker (X10)
CHANNEL_PARALLEL = 16  # B4096: input and output channel parallelism 16 (X2)
KERNEL_CHANNEL_MAX = 2048  # kernel_w * kernel_h * ceil(C_in / channel_parallel) (X11)
OUTPUT_CHANNELS_MAX = 256 * CHANNEL_PARALLEL  # C_out <= 256 * channel_parallel (X11)


class XilinxAdapter(VitisAIAdapter):
    vendor = "AMD (Xilinx)"
    int8_format = Int8Format(
        "AMD Quark XINT8: symmetric int8, power-of-two scales, per-tensor (the DPU's only datatype)", "int8", True,
        False, False, per_channel=False, vendor="amd", float_as="float, in a CPU subgraph on the Cortex-A53s",
    )  # fmt: skip
    artifact_loads = {"qdq-onnx": (None, "the QDQ model to compile for the DPU with compile_kv260.sh (vai_c_xir)")}
    int8_only = True
    presets = {"cnn": "XINT8", "transformer": "XINT8"}  # the DPU takes power-of-two int8 only (X8)
    quant_sources = "X8"
    accelerator = "DPU"
    quantize_cpu_nodes = False  # CPU subgraphs run on the A53s, in float (X9)

    # ---- legality -----------------------------------------------------------------------------------
    def fallback_reason(self, node: ir.Node, target: TargetSpec) -> str | None:
        key = op_key(node.op_type, node.domain)
        if node.op_type != "Constant" and key not in self.supported_op_keys(target):
            if key == "Softmax":
                return (
                    "Softmax is optional in the DPUCZDX8G IP (X4) and not assumed enabled on the KV260 overlay: "
                    "vai_c_xir leaves it to a CPU subgraph on the Cortex-A53s (X9)"
                )
            return (
                f"{key} is not a DPUCZDX8G operator (X4): vai_c_xir puts it in a CPU subgraph that runs on the "
                "board's Cortex-A53s (X9)"
            )
        return super().fallback_reason(node, target)

    def node_reason(self, node: ir.Node, target: TargetSpec) -> str | None:
        reason = super().node_reason(node, target)
        if reason or node.domain not in ("", "ai.onnx"):
            return reason
        if node.op_type == "Clip":
            return _relu6_reason(node)
        if node.op_type == "Conv":
            return _conv_channels_reason(node)
        return None

    # ---- the bundle ---------------------------------------------------------------------------------
    def vendor_files(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> dict[str, bytes]:
        quantize = quantize_script(
            self, buckets, report, script="quantize_kv260.py", what="the KV260 DPU (DPUCZDX8G B4096)",
            quantizers=["quark", "vai_q_onnx"],
        )  # fmt: skip
        return {"quantize_kv260.py": quantize.encode(), "compile_kv260.sh": self.compile_script(buckets).encode()}

    def compile_script(self, buckets: list[BucketModel]) -> str:
        entries = [
            {"name": b.name, "net": _net_name(self.model_filename(b)), "qdq": self.qdq_filename(b)}
            for b in buckets
        ]
        return render(__package__, "compile_kv260.sh", arch=ARCH_JSON, buckets=entries)

    def deploy_steps(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> list[str]:
        nets = ", ".join(f"`compiled/{b.name}/{_net_name(self.model_filename(b))}.xmodel`" for b in buckets)
        return [
            "The DPU runs int8 only (X4): every bucket must be quantised first. `python quantize_kv260.py "
            "--dataset ds.txt` (AMD Quark XINT8: symmetric int8, power-of-two scales, per tensor; or "
            "`--quantizer vai_q_onnx`, X8) writes model.<bucket>.qdq.onnx; 100-1000 calibration samples is usual "
            f"(X8){float_note(self, buckets, report)}. When the amd toolchain ran here, those files are in the "
            "bundle already, calibrated on the request's samples only.",
            "In the Vitis AI docker: `bash compile_kv260.sh ds.txt` quantises and runs `vai_c_xir -x <net>_int.xmodel "
            f"-a {ARCH_JSON} -o compiled/<bucket> -n <net>` per bucket (X10), writing {nets}. Set `ARCH` "
            "to your overlay's arch.json if it is not the KV260 B4096 one (fingerprint "
            "DPUCZDX8G_ISA1_B4096_0101000056010407, X12; X5).",
            "On the KV260 (the Vitis AI runtime and the DPU overlay loaded): run the xmodel with VART "
            "(`xir.Graph.deserialize`, `vart.Runner.create_runner(dpu_subgraph, 'run')`); its CPU subgraphs (the "
            "report's fallback nodes) run on the Cortex-A53s (X9). Inputs are NHWC there (X12). Or run the QDQ "
            "ONNX with ONNX Runtime's Vitis AI EP on the board (A11).",
            "Pick the bucket per request as `manifest.json` says (`pick_bucket`): pad the inputs up to the "
            "smallest bucket that holds them and slice the outputs back.",
        ]


def _net_name(model_file: str) -> str:
    return model_file.removesuffix(".onnx").replace(".", "_")


def _constant_scalar(value: ir.Value | None) -> float | None:
    if value is None:
        return None
    tensor = value.const_value
    producer = value.producer()
    if tensor is None and producer is not None and producer.op_type == "Constant" and "value" in producer.attributes:
        tensor = producer.attributes["value"].value
    if tensor is None or tensor.size != 1:
        return None
    return float(tensor.numpy().reshape(()))


def _relu6_reason(node: ir.Node) -> str | None:
    low = _constant_scalar(node.inputs[1]) if len(node.inputs) > 1 else None
    high = _constant_scalar(node.inputs[2]) if len(node.inputs) > 2 else None
    if low == 0.0 and high == 6.0:
        return None
    bounds = f"min {low if low is not None else 'none'}, max {high if high is not None else 'none'}"
    return (
        f"Clip with {bounds} is not a DPU activation: the DPUCZDX8G runs ReLU, ReLU6 (Clip 0-6) and LeakyReLU "
        "(X4), so vai_c_xir leaves it to the CPU"
    )


def _conv_channels_reason(node: ir.Node) -> str | None:
    weight = node.inputs[1] if len(node.inputs) > 1 else None
    if weight is None or weight.shape is None or len(weight.shape) < 3:
        return None
    dims = list(weight.shape)
    if not all(isinstance(d, int) for d in dims):
        return None
    group = node.attributes["group"].value if "group" in node.attributes else 1
    out_channels, in_per_group, kernel = dims[0], dims[1], dims[2:]
    if out_channels > OUTPUT_CHANNELS_MAX:
        return (
            f"Conv: {out_channels} output channels exceed 256 x channel parallelism {CHANNEL_PARALLEL} = "
            f"{OUTPUT_CHANNELS_MAX} (the sibling DPUCAHX8H's limit, X11; B4096 parallelism, X2)"
        )
    if group != 1 and in_per_group == 1:
        return None  # depthwise: one input channel per output channel, the DPU's depthwise engine (X4)
    load = math.prod(kernel) * math.ceil(in_per_group / CHANNEL_PARALLEL)
    if load > KERNEL_CHANNEL_MAX:
        return (
            f"Conv: kernel {'x'.join(map(str, kernel))} x ceil({in_per_group} input channels / {CHANNEL_PARALLEL}) = "
            f"{load} exceeds {KERNEL_CHANNEL_MAX} (the sibling DPUCAHX8H's limit, X11; B4096 parallelism, X2)"
        )
    return None


ADAPTER = XilinxAdapter()
