"""Huawei Ascend 310B (Atlas 200I DK A2) through ATC, the CANN offline compiler: ONNX -> .om.

ATC does not install here, so the bundle is checked against the CANN ONNX op list (H15), its scripts by
syntax, and every model numerically in ONNX Runtime. What this adapter adds to the common one:

* legalisation: ATC parses ai.onnx opset 11-15 only (H7), so a model outside is moved inside
  (``opset_convert``: opset-17+ ops such as LayerNormalization and Gelu decomposed, each rewrite named);
* fallback reasons: Loop/Scan/Sequence ops have no AI Core kernel (AI CPU, slow: H21); QDQ is not Ascend's
  quantisation format (AMCT is: H15, H18); a zero-sized dim is refused by ATC (H9);
* ``atc.sh``: one ``atc`` per shape bucket (static ``--input_shape``, H19), ``--precision_mode`` from the
  requested precision, ``--fusion_switch_file`` when the plan switches a GE fusion pass off;
* ``fusion_switch.cfg``: ``PassName:off`` lines (H10, H11) for the GE passes whose pattern our plan refused
  for accuracy (a rule the bisection rolled back, or one the request switched off);
* ``atc_dynamic_dims.sh`` (several buckets): one .om with ``--dynamic_dims`` gears, one per bucket, with
  ``--input_format=ND`` (H8), run on a model whose dims are still symbolic.
"""

from __future__ import annotations

import onnx
import onnx_ir as ir

from flexdsa_core.targets.accelerator import AcceleratorAdapter
from flexdsa_core.targets.base import BucketModel, Legalized
from flexdsa_core.targets.bundle_inputs import input_dims, requested_precision, runtime_inputs
from flexdsa_core.targets.int8_format import Int8Format
from flexdsa_core.targets.opset_convert import convert_opset, opset_legalisations, since_version
from flexdsa_core.targets.render import render
from flexdsa_core.targets.spec import TargetSpec

SOC_VERSION = "Ascend310B1"  # Atlas 200I DK A2 (H7, H20)
_DEFAULT_DOMAINS = ("", "ai.onnx")

_CONTROL_FLOW = frozenset({"Loop", "Scan"})
_SEQUENCE_OPS = frozenset(
    {"SequenceAt", "SequenceConstruct", "SequenceEmpty", "SequenceErase", "SequenceInsert", "SequenceLength"}
    | {"SequenceMap", "SplitToSequence", "ConcatFromSequence"}
)
_QDQ = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"})
# Ops whose output shape depends on the data: the gear mechanism refuses such networks (H24).
_DATA_DEPENDENT = frozenset({"NonZero", "NonMaxSuppression", "Unique", "Compress"})
MAX_GEARS = 100  # --dynamic_dims takes 2-100 profiles (H8)

# Our fusion rules -> the GE fusion passes that rebuild the same pattern inside ATC (names: H12 graph
# fusion, H13 UB fusion). When our plan refuses the fusion for accuracy, the GE pass is switched off too.
GE_PASSES: dict[str, tuple[str, ...]] = {
    "conv_bn_fold": ("ConvBatchnormFusionPass",),
    "conv_transpose_bn_fold": ("Conv2DTransposeBatchnormFusionPass",),
    "conv_add_bias": ("AABiasaddConvFusion",),
    "matmul_add_gemm": ("TbeBatchMatmulElementWiseFusionPass", "ATbeMatMulElemwiseFusionPass"),
    "gemm_act": ("TbeBatchMatmulElementWiseFusionPass", "ATbeMatMulElemwiseFusionPass"),
    "skip_rms_norm": ("AddRmsNormFusionGraphPass",),
}

# The request's precision -> ATC --precision_mode (H7, H22). fp32 leaves ATC's own default policy.
PRECISION_MODES = {"fp16": "allow_fp32_to_fp16", "mixed": "allow_mix_precision", "fp32": "", "int8": ""}


def fusion_switch_plan(report: dict, target: TargetSpec) -> dict[str, str]:
    """GE pass -> why it is switched off, from the rewrites our plan refused (disabled or rolled back)."""
    numerics = {r.get("rewrite") for r in report.get("rollbacks", []) if r.get("reason") == "numerics"}
    plan: dict[str, str] = {}
    for rule in report.get("disabled_rewrites", []):
        for switch in GE_PASSES.get(rule, ()):
            if switch not in target.fusion_switches or switch in plan:
                continue
            why = (
                "broke the numerics and was rolled back"
                if rule in numerics
                else "was switched off in the request"
            )
            plan[switch] = f"our {rule} {why}; GE's {switch} fuses the same pattern"
    return plan


class HuaweiAdapter(AcceleratorAdapter):
    vendor = "huawei"
    int8_format = Int8Format(
        "AMCT-style int8 (the vendor step's own calibration on our dataset): asymmetric activations, per-channel "
        "weights", "uint8", False, False, False, vendor="huawei", float_as="float16",
    )  # fmt: skip
    legalisations = opset_legalisations()

    # ---- legality -----------------------------------------------------------------------------------
    def fallback_reason(self, node: ir.Node, target: TargetSpec) -> str | None:
        """The common checks, with the Ascend-specific sentence first for ops absent from the CANN list
        for a reason the user can act on (control flow, sequences, QDQ)."""
        if node.domain in _DEFAULT_DOMAINS:
            if node.op_type in _CONTROL_FLOW or node.op_type in _SEQUENCE_OPS:
                return (
                    f"{node.op_type}: control-flow and sequence ops have no AI Core kernel on {target.name}; "
                    "ATC leaves them to the AI CPU, which is slow, or refuses them (absent from H15, H21). "
                    "Unroll the loop at a fixed shape or move it out of the model"
                )
            if node.op_type in _QDQ:
                return (
                    f"{node.op_type}: Ascend does not take QDQ ONNX; quantise the fp32 model with AMCT, which "
                    "emits Ascend's own quant ops (H15, H18)"
                )
        return super().fallback_reason(node, target)

    def node_reason(self, node: ir.Node, target: TargetSpec) -> str | None:
        for value in (*node.inputs, *node.outputs):
            if value is None or value.const_value is not None or value.shape is None:
                continue
            if any(isinstance(d, int) and d == 0 for d in value.shape):
                return f"{value.name!r} has a zero-sized dim; ATC needs every non-constant dim != 0 (H9)"
        high = (target.opset_range or (11, 15))[1]
        if (
            node.domain in _DEFAULT_DOMAINS
            and onnx.defs.has(node.op_type)
            and since_version(node.op_type, high) is None
        ):
            return (
                f"{node.op_type} exists only from a later ai.onnx opset; ATC parses opset 11-{high} (H7) and "
                "its decomposition was switched off or not possible (see legalization notes)"
            )
        return None

    # ---- legalisation -------------------------------------------------------------------------------
    def legalize_model(self, model: ir.Model, target: TargetSpec, disabled: frozenset[str]) -> Legalized:
        low, high = target.opset_range or (11, 15)
        conversion = convert_opset(model, low, high, disabled)
        notes = list(conversion.notes)
        if conversion.refused:
            notes.append(conversion.refused)
        return Legalized(conversion.model, conversion.applied, notes)

    # ---- the bundle ---------------------------------------------------------------------------------
    def vendor_files(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> dict[str, bytes]:
        switches = fusion_switch_plan(report, target)
        files = {
            "atc.sh": self.atc_script(buckets, report, switches).encode(),
            "fusion_switch.cfg": "".join(f"{name}:off\n" for name in switches).encode(),
        }
        if len(buckets) > 1 and self.gears(buckets)[0]:
            files["atc_dynamic_dims.sh"] = self.dynamic_dims_script(buckets, report, switches).encode()
        return files

    def atc_script(self, buckets: list[BucketModel], report: dict, switches: dict[str, str]) -> str:
        return render(__package__, "atc.sh", **_head_values(report, switches),
                      buckets=[self._atc_bucket(bucket) for bucket in buckets])  # fmt: skip

    def _atc_bucket(self, bucket: BucketModel) -> dict:
        """A bucket as atc.sh sees it: its files, ``--input_format``, ``--input_shape`` (``name:1,3,8,8;...``)
        and the dims still symbolic, which ATC needs fixed."""
        model_file = self.model_filename(bucket)
        inputs = runtime_inputs(bucket.model)
        return {
            "name": bucket.name,
            "onnx": model_file,
            "output": model_file.removesuffix(".onnx"),
            "input_format": _input_format(inputs),
            "input_shape": ";".join(f"{v.name}:{','.join(str(d) for d in input_dims(v))}" for v in inputs),
            "symbolic": [str(d) for v in inputs for d in input_dims(v) if not isinstance(d, int)],
        }

    def gears(self, buckets: list[BucketModel]) -> tuple[str, list[str], str]:
        """(``--input_shape`` with -1 where buckets differ, one gear per bucket, why not possible or '')."""
        first = runtime_inputs(buckets[0].model)
        names = [v.name for v in first]
        shapes = [{v.name: input_dims(v) for v in runtime_inputs(b.model)} for b in buckets]
        for shape in shapes:
            if list(shape) != names or any(len(shape[n]) != len(shapes[0][n]) for n in names):
                return "", [], "the buckets do not share input names and ranks"
            if any(not isinstance(d, int) for dims in shape.values() for d in dims):
                return "", [], "a bucket still has symbolic dims"
        varying = [
            (n, axis)
            for n in names
            for axis in range(len(shapes[0][n]))
            if len({s[n][axis] for s in shapes}) > 1
        ]
        if not varying:
            return "", [], "the buckets do not differ in any input dim"
        spec = ";".join(
            f"{n}:{','.join('-1' if (n, axis) in varying else str(d) for axis, d in enumerate(shapes[0][n]))}"
            for n in names
        )
        gear_list = [",".join(str(s[n][axis]) for n, axis in varying) for s in shapes]
        return spec, list(dict.fromkeys(gear_list))[:MAX_GEARS], ""

    def dynamic_dims_script(self, buckets: list[BucketModel], report: dict, switches: dict[str, str]) -> str:
        spec, gear_list, _ = self.gears(buckets)
        return render(
            __package__, "atc_dynamic_dims.sh", **_head_values(report, switches),
            input_shape=spec,
            gears=gear_list,
            many_dims=gear_list[0].count(",") + 1 > 4,  # a gear holds one value per dynamic dim
            data_dependent=any(n.op_type in _DATA_DEPENDENT for b in buckets for n in b.model.graph),
        )  # fmt: skip

    def deploy_steps(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> list[str]:
        om_files = ", ".join(f"`{self.model_filename(b).removesuffix('.onnx')}.om`" for b in buckets)
        precision = requested_precision(report)
        steps = [
            "On a machine with the CANN toolkit (x86 host or the board itself), load its environment "
            "(`source <ascend-toolkit>/set_env.sh`), then run `bash atc.sh` in this folder: it writes "
            f"{om_files}, compiled for `--soc_version={SOC_VERSION}` (set `SOC_VERSION` to your board's).",
            "Copy the .om file(s) and `manifest.json` to the Atlas 200I DK A2.",
            "Load and run with pyACL (`acl.init()`, `acl.rt.set_device(0)`, `acl.mdl.load_from_file(...)`, "
            "`acl.mdl.execute(...)`) or the C++ ACL (`aclmdlLoadFromFile`, `aclmdlExecute`): pick the bucket "
            "for each request as `manifest.json` (`pick_bucket`) says, padding the inputs up to it.",
        ]
        if len(buckets) > 1:
            steps.append(
                "Or one .om for all buckets: `bash atc_dynamic_dims.sh MODEL.onnx` with the model whose dims are "
                "symbolic; at run time choose the gear with `aclmdlSetInputDynamicDims` before `aclmdlExecute` (H25)."
            )
        fallback = sum(len(p.get("fallback", [])) for p in (report.get("partition") or {}).values())
        if fallback:
            steps.append(
                f"{fallback} node(s) have no AI Core kernel (report.json, partition.*.fallback, with reasons): ATC "
                "places them on the AI CPU, which is slow; rewrite them out of the model where you can."
            )
        if precision in ("int8", "mixed"):
            steps.append(
                "INT8 on Ascend is AMCT's own quantisation, not QDQ ONNX: quantise the fp32 model with AMCT on "
                "your calibration data, then run ATC on its deploy model (H15, H18); it cannot use gears (H9)."
            )
        if (report.get("disabled_rewrites") or []) and fusion_switch_plan(report, target):
            steps.append(
                "`fusion_switch.cfg` switches off the GE fusion passes our plan refused; atc.sh says why."
            )
        return steps


def _input_format(inputs: list[ir.Value]) -> str:
    ranks = {len(v.shape) for v in inputs if v.shape is not None}
    if 4 in ranks:
        return "NCHW"
    if 5 in ranks:
        return "NCDHW"
    return "ND"


def _head_values(report: dict, switches: dict[str, str]) -> dict:
    """What both ATC scripts' heads say: the SoC, the requested precision and its ``--precision_mode``, and the
    GE fusion passes switched off, with why."""
    precision = requested_precision(report)
    return {
        "soc_version": SOC_VERSION,
        "precision": precision,
        "precision_mode": PRECISION_MODES.get(precision, ""),
        "switches": switches,
    }


ADAPTER = HuaweiAdapter()
