"""AMD Ryzen AI 300 XDNA 2 NPU through ONNX Runtime's Vitis AI Execution Provider.

There is no offline compiler: the EP compiles a (QDQ) ONNX model when the InferenceSession is created,
caches the result (``cache_dir`` / ``cache_key``), and runs what the NPU cannot on the CPU (A2). AMD publishes
no NPU op list (A10), so the op table is the set of ops the Vitis AI quantiser quantises (X8): those become
quantised NPU ops; anything else the EP leaves to the CPU, which is what the fallback reason says.

The bundle:

* ``quantize_quark.py``: AMD Quark per bucket, XINT8 (power-of-two int8) for a CNN, A8W8 for a transformer,
  as Quark's plan for AMD NPU targets says (A8); the ``amd`` toolchain runs the same step here on the
  request's sample inputs and checks the quantised model in ONNX Runtime;
* ``run_npu.py``: one session per bucket with ``VitisAIExecutionProvider`` and the provider options the
  Ryzen AI docs name (``cache_dir``, ``cache_key``, ``config_file``, ``xclbin``; A2), which compiles and runs it.
"""

from __future__ import annotations

import pprint

import onnx_ir as ir

from flexdsa_core.targets._vitis_ai import (
    QDQ_OPS,
    VitisAIAdapter,
    float_note,
    quantize_entries,
    quantize_script,
)
from flexdsa_core.targets.base import BucketModel
from flexdsa_core.targets.int8_format import Int8Format
from flexdsa_core.targets.render import render
from flexdsa_core.targets.spec import TargetSpec, op_key


class AmdAdapter(VitisAIAdapter):
    vendor = "AMD"
    int8_format = Int8Format(
        "AMD Quark XINT8 (CNN: power-of-two scales) or A8W8 (transformer): symmetric int8, per-tensor", "int8",
        True, False, False, per_channel=False, vendor="amd", float_as="float (excluded from Quark's quantisation)",
    )  # fmt: skip
    artifact_loads = {
        "qdq-onnx": (
            "onnxruntime",
            "onnxruntime.InferenceSession(file, providers=['VitisAIExecutionProvider']) on the NPU (the EP "
            "compiles it at session creation); runs on the CPU provider too",
        ),
    }
    int8_only = False
    presets = {"cnn": "XINT8", "transformer": "A8W8"}
    quant_sources = "A8"
    accelerator = "XDNA 2 NPU"

    def fallback_reason(self, node: ir.Node, target: TargetSpec) -> str | None:
        key = op_key(node.op_type, node.domain)
        if node.op_type != "Constant" and key not in self.supported_op_keys(target):
            return (
                f"{key} is not among the ops the Vitis AI quantiser quantises (X8), and AMD publishes no NPU op "
                "list (A10): the Vitis AI EP runs it on the CPU beside the NPU (A2)"
            )
        return super().fallback_reason(node, target)

    # ---- the bundle ---------------------------------------------------------------------------------
    def vendor_files(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> dict[str, bytes]:
        quantize = quantize_script(
            self, buckets, report, script="quantize_quark.py", what="the Ryzen AI XDNA 2 NPU (Vitis AI EP)",
            quantizers=["quark"],
        )  # fmt: skip
        run = render(
            __package__, "run_npu.py",
            buckets=pprint.pformat(
                [{k: e[k] for k in ("name", "onnx", "qdq", "inputs", "shapes", "dtypes")}
                 for e in quantize_entries(self, buckets)],
                width=110, sort_dicts=False,
            ),
        )  # fmt: skip
        return {"quantize_quark.py": quantize.encode(), "run_npu.py": run.encode()}

    def deploy_steps(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> list[str]:
        qdq = ", ".join(f"`{self.qdq_filename(b)}`" for b in buckets)
        quantized = any(n.op_type in QDQ_OPS for b in buckets for n in b.model.graph)
        steps = []
        if not quantized:
            steps.append(
                "Quantise (any x86 machine): `pip install amd-quark onnxruntime` (with a CPU build of torch, which "
                "Quark imports), then `python quantize_quark.py --dataset ds.txt` (one calibration sample a line, "
                f"one .npy per input; 100-1000 samples). It writes {qdq} with Quark's XINT8 preset for a CNN, "
                f"A8W8 for a transformer (A8){float_note(self, buckets, report)}. When the amd toolchain ran here, "
                "those files are in the bundle already, calibrated on the request's samples only."
            )
        steps += [
            "On a Ryzen AI 300 laptop (Windows, NPU driver and the Ryzen AI Software installed, whose conda "
            "environment carries onnxruntime with the Vitis AI EP): copy the bundle there.",
            "`python run_npu.py` creates one InferenceSession per bucket with "
            "`providers=['VitisAIExecutionProvider']` and `provider_options=[{'cache_dir': 'cache', "
            "'cache_key': 'model.<bucket>'}]`: the first run compiles (minutes), later runs load the cache (A2). "
            "Give `--config-file` (the EP's compile options, BF16 flow) and `--xclbin` where your Ryzen AI "
            "release asks for them (A2).",
            "The EP partitions by itself: NPU-supported subgraphs on the NPU, the rest on the CPU (A2); the "
            "report's partition is our prediction from the quantisable op list (X8), AMD publishes no op list "
            "(A10).",
            "Pick the bucket per request as `manifest.json` says (`pick_bucket`): pad the inputs up to the "
            "smallest bucket that holds them and slice the outputs back.",
        ]
        return steps


ADAPTER = AmdAdapter()
