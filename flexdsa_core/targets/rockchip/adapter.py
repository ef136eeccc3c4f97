"""Rockchip RK3588 NPU through RKNN-Toolkit2: limits the constraint language cannot say, the rewrites its
ONNX front end needs, and the bundle's ``convert_rknn.py``.

The op table and the per-op limits (Conv kernel <= 31, MaxPool ceil_mode, batch 1 for Softmax, ...) are
data in ``rk3588.json`` beside it; what is here needs the graph:

* integer tensors: the NPU computes int8/float16 (R2), so an op on a run-time int64/int32 tensor (token
  ids, an attention mask before its Cast, an embedding lookup's indices) runs on the RKNN CPU runtime;
* ops the toolkit accepts but only implements on the CPU beside the NPU (``CPU_ONLY``, R2 chapter 4);
* MaxPool's C, H and W at most 8192 (R2).

Legalisation rewrites (each named, so ``disabled_rules`` and the accuracy bisection can switch it off):

* ``pad_into_conv``: ``Conv(Pad(x))`` -> ``Conv(x, pads += ...)`` for a zero constant Pad of the spatial axes
  (onnxscript's rule). rknn-toolkit2 2.5.0 tries the same fusion itself and crashes in it on any such pair
  (``ValueError: assignment destination is read-only`` in ``_p_fuse_pad_into_conv``, seen): a model whose pads
  our folding made constant (tf2onnx computes them) would otherwise not build where its original does.

* ``gelu_erf_div_form``: ``Erf(x * 0.7071...)`` -> ``Erf(x / 1.4142...)``. rknn-toolkit2 fuses an erf GELU
  into its NPU op exGelu only when written with the Div, as PyTorch exports it; our algebraic
  simplification turns the Div by a constant into a Mul, which leaves the Erf on the CPU.
* ``neg_to_mul``: ``Neg(x) -> Mul(x, -1)``; Neg is not in the op list (R3), Mul runs on the NPU. Exact.
* ``sum_to_add``: ``Sum(a, b, ...) -> Add(Add(a, b), ...)``; Sum is not in the op list (R3).

What rknn-toolkit2 2.5.0 does itself, seen in its layer table: it splits a Conv or pool over the NPU's
kernel/stride limits into several NPU ops, fuses attention (exSDPAttention), tanh and erf GELU (exGelu),
SiLU (exSwish), RMSNorm and LayerNorm (exNorm), and Conv + Add + activation. Its ``optimization_level``
below 3 keeps an attention mask's -3.4e38 fill, which overflows float16 (NaN outputs): the bundle keeps 3.

Where rknn's own w8a8 loses accuracy, exploration offers exact rewrites (``vendor_exact_forms``:
``forms/bounded_mask.py``, ``forms/outlier_channels.py``, ``forms/input_outliers.py``) and float16 hybrids chosen from the toolkit's own
per-layer analysis of them (``vendor_sensitivity_hybrids``). Outputs the runtime can serve from the inputs
(inputs passed through, their shapes and casts: ``rknn_outputs.py``) are left out of the toolkit's model: it dies
with SIGFPE on a model that passes an input it consumes through to an output; the manifest lists them per bucket
(``served_by_runtime``) and ``flexdsa_runtime`` makes them.

The bundle's ``convert_rknn.py`` is the template ``templates/convert_rknn.py``; it imports ``rknn_hybrid.py`` and
``rknn_outputs.py``, shipped beside it, the same files the toolchain's ``driver.py`` maps the hybrid layers' names
and leaves the served outputs out with. By default it rebuilds what shipped: a bucket's ``.rknn`` as its build record
(``model.<bucket>.rknn.build.json``, written by the driver) says, else the precision planned here (``precision`` in
its ``BUCKETS``); it writes into ``rebuilt/`` and never over a shipped file.
"""

from __future__ import annotations

import pprint
from importlib import resources
from types import SimpleNamespace

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as ir_passes

from flexdsa_core.fusions.walk import drive
from flexdsa_core.rewrites import counting
from flexdsa_core.targets.accelerator import AcceleratorAdapter, is_constant, runtime_input_of
from flexdsa_core.targets.base import BucketModel
from flexdsa_core.targets.bundle_inputs import mixed_sections
from flexdsa_core.targets.int8_format import Int8Format
from flexdsa_core.targets.render import render
from flexdsa_core.targets.rockchip.rknn_outputs import runtime_served
from flexdsa_core.targets.spec import TargetSpec
from flexdsa_core.targets.vendor_cost import VendorCost

# Ops rknn-toolkit2 2.5.0 takes but runs on its CPU runtime for the RK3588, each alone in a graph: all are
# in R2's list of CPU ops (chapter 4) and none in its RK3588 NPU section (erf GELU: see gelu_erf_div_form).
CPU_ONLY = frozenset({"Erf", "Exp", "Log", "Floor", "Cos", "Sin", "Min", "LogSoftmax", "SpaceToDepth", "LRN"})
INTEGER_DTYPES = frozenset({ir.DataType.INT64, ir.DataType.INT32, ir.DataType.UINT64, ir.DataType.UINT32})
POOL_DIM_MAX = 8192  # RK3588 MaxPool C, H, W limit (R2)
SQRT2 = float(np.sqrt(2.0))
# Below 3, the toolkit keeps an attention mask's -3.4e38 fill, which overflows float16 (NaN outputs, seen).
OPTIMIZATION_LEVEL = 3
# Rows of the toolkit's layer table that are the graph's inputs and outputs, not layers.
BOUNDARY_OPS = frozenset({"InputOperator", "OutputOperator"})
# The toolkit's layers its table gives no cycles in int8 or float16 (seen on MiniLM-L6, BERT, ViT): keeping them
# float16 costs nothing by its measure. Its convolutions (MatMul, Gemm) carry every cycle.
# A Reshape or Transpose between two of them is kept float16 too: else it rounds the tensor to int8 and back (seen:
# MiniLM-L6's embedding sum on its way to the first norm, single-layer cosine 0.998). Div and Pow run on its CPU
# in int8 and on the NPU in float16 (MiniLM-L6's pooling and L2 norm: 7 CPU layers in w8a8, 4 in float16).
FLOAT16_FREE = ("exNorm", "exSDPAttention", "exSoftmax13", "exGelu", "exSwish", "Add", "Mul", "Sub", "Div", "Pow",
                "Reshape", "Transpose")
# A layer whose single-layer cosine in the toolkit's accuracy_analysis is below this is sensitive.
SENSITIVE_COSINE = 0.999


class RockchipAdapter(AcceleratorAdapter):
    vendor = "Rockchip"
    artifact_loads = {
        "rknn": (
            "rknn-lite",
            "on the RK3588: RKNNLite().load_rknn(file); init_runtime(); inference(inputs=[...] in the bucket's "
            "input order) (rknn-toolkit-lite2, or librknnrt's rknn_init/rknn_run from C)",
        ),
    }
    int8_format = Int8Format(
        "RKNN w8a8 (rknn-toolkit2's own quantiser on our dataset.txt): asymmetric int8 activations, per-channel "
        "int8 weights; mixed's float layers go to its hybrid quantisation", "uint8", False, False, False,
        vendor="rockchip", float_as="float16 (rknn hybrid quantisation)",
    )  # fmt: skip
    # The rewrites rknn-toolkit2's ONNX front end needs (module docstring), in this order.
    legalisations = tuple(
        counting(name, rewrite, summary, note="{name}: {count} node(s) rewritten for rknn-toolkit2")
        for name, rewrite, summary in (
            ("pad_into_conv", lambda model: _pad_into_conv(model),
             "Conv(Pad(x)) -> Conv(x, pads += ...) for a zero constant spatial Pad (the toolkit crashes fusing it)."),
            ("gelu_erf_div_form", lambda model: _gelu_erf_div_form(model),
             "Erf(x * 0.7071...) -> Erf(x / 1.4142...), the form the toolkit fuses into its NPU exGelu."),
            ("neg_to_mul", lambda model: _neg_to_mul(model), "Neg(x) -> Mul(x, -1): Neg is not in the NPU op list."),
            ("sum_to_add", lambda model: _sum_to_add(model), "Sum(a, b, ...) -> Add(Add(a, b), ...): Sum is not in the NPU op list."),
        )
    )  # fmt: skip

    # ---- legality beyond the op table --------------------------------------------------------------
    def node_reason(self, node: ir.Node, target: TargetSpec) -> str | None:
        if node.domain not in ("", "ai.onnx"):
            return None
        if node.op_type == "Erf" and _erf_gelu_input(node) is not None:
            return None  # fused with its GELU into exGelu, on the NPU
        if node.op_type in CPU_ONLY:
            return (
                f"{node.op_type} has no RK3588 NPU kernel: rknn-toolkit2 runs it on its CPU runtime "
                "(R2 chapter 4 lists it among the CPU ops)"
            )
        if node.op_type == "Div" and len(node.inputs) > 1 and not is_constant(node.inputs[1]):
            if _producer_type(node.inputs[1]) == "Sqrt":
                return None  # x / sqrt(mean + eps): the toolkit fuses the norm into exNorm on the NPU
            return (
                "Div by a run-time tensor runs on the RKNN CPU runtime (a Div by a constant becomes an NPU Mul; "
                "R2 chapter 4 lists Div among the CPU ops)"
            )
        integer = runtime_input_of(node, INTEGER_DTYPES)
        if integer is not None:
            dtype = integer.dtype.name.lower() if integer.dtype is not None else "integer"
            return (
                f"{node.op_type} reads the {dtype} tensor {integer.name!r}: the RK3588 NPU computes int8/float16 "
                "tensors (R2), so rknn-toolkit2 runs it on the CPU runtime"
            )
        if node.op_type == "MaxPool":
            return _pool_dims_reason(node)
        return None

    # ---- the vendor's own figure --------------------------------------------------------------------
    vendor_forms = (
        "strided_conv_space_to_depth", "pooled_conv_space_to_depth", "hoisted_channel_gathers", "strided_conv1d_frames",
    )
    # Rewrites that change no value but what the toolkit's w8a8 keeps (judged by its simulator,
    # ``vendor_runs.explore``).
    vendor_exact_forms = ("bounded_attention_mask", "outlier_channel_split", "input_outlier_split", "packed_output_float16")
    vendor_package = "rknn-toolkit2"
    # The vendor alone is the original as a user hands it over: every output left in (a toolkit crash included).
    vendor_alone_options = {"serve_passthrough": False}

    def vendor_cost(self, entry: dict, versions: dict) -> VendorCost | None:
        """rknn-toolkit2's estimate: the Total cycles of its Network Layer Information Table, summed; the
        layers it runs on its CPU runtime, and the CPU<->NPU switches along the table's (execution) order."""
        layers = [row for row in entry.get("layers") or [] if row.get("op") not in BOUNDARY_OPS]
        if not layers:
            return None
        devices = [row["target"] for row in layers]
        return VendorCost(
            cycles=float(sum(row["cycles"] for row in layers)),
            cpu_nodes=sum(1 for device in devices if device == "CPU"),
            transitions=sum(1 for a, b in zip(devices, devices[1:], strict=False) if a != b),
            source=f"rknn-toolkit2 {versions.get('rknn-toolkit2') or '(version unknown)'} estimate: "
            "Total cycles of its Network Layer Information Table",
            layers=len(layers),
            per_layer=tuple((float(row["cycles"]), tuple(row.get("onnx_nodes") or ())) for row in layers),
            cpu_layers=tuple(f"{row['op']} {row['layer_name']}" for row in layers if row["target"] == "CPU"),
        )

    def vendor_estimate_options(self, target: TargetSpec, report: dict) -> dict:
        """Forms are judged on the float16 build (no calibration needed); precisions are tried afterwards on the
        chosen form (``vendor_precisions``)."""
        return self.toolchain_options(target, {})

    def vendor_precisions(self, target: TargetSpec, report: dict) -> dict[str, dict]:
        """w8a8 (the toolkit's default calibration, what it makes alone), w8a8 with its MMSE calibration, and
        under ``mixed`` the hybrid keeping our float layers float16, the toolkit's own automatic hybrid, and
        float16 itself."""
        requested = (report.get("precision") or {}).get("requested")
        if requested not in ("int8", "mixed"):
            return {}
        int8 = {"dtype": "int8", **_QUANT_CONFIG, "custom_hybrid": {}}
        found = {"w8a8": int8, "w8a8 mmse": {**int8, "quantized_algorithm": "mmse"}}
        if requested == "mixed":
            hybrid = self.toolchain_options(target, report).get("custom_hybrid") or {}
            if any(hybrid.values()):
                found["w8a8 + float16 hybrid"] = {**int8, "custom_hybrid": hybrid}
            # The toolkit's own automatic hybrid: layers whose quantised output falls below its cosine threshold
            # stay float16 (build(auto_hybrid=True)).
            found["w8a8 + the toolkit's auto hybrid"] = {**int8, "auto_hybrid": True}
            found["float16"] = {"dtype": "float16", "custom_hybrid": {}}
        return found

    def vendor_sensitivity_hybrids(self, options: dict, layers: list[dict], float16: list[str]) -> dict[str, dict]:
        """Float16 hybrids over an exact-rewritten w8a8 build, from the toolkit's per-layer analysis of it
        (``layers``): the layers it costs nothing to keep float16 (``FLOAT16_FREE``) whose single-layer cosine
        is below ``SENSITIVE_COSINE``, and all of them; each with the exact forms' float16 paths."""
        sensitive = [row["layer"] for row in layers
                     if row["op"] in FLOAT16_FREE and (row.get("cosine_single") or 0.0) < SENSITIVE_COSINE]  # fmt: skip
        found = {}
        if sensitive:
            found[f"float16 for the {len(sensitive)} sensitive layer(s)"] = {
                **options, "accuracy_analysis": False, "hybrid_layers": {"nodes": float16, "tensors": sensitive}}
        found["float16 for every layer the toolkit gives no cycles"] = {
            **options, "accuracy_analysis": False, "hybrid_layers": {"nodes": float16, "ops": list(FLOAT16_FREE)}}
        return found

    # ---- the bundle --------------------------------------------------------------------------------
    def toolchain_options(self, target: TargetSpec, report: dict) -> dict:
        """float16 for fp32/fp16; for int8 and mixed the toolkit's own w8a8 quantiser calibrated on our
        calibration samples (each bucket's ``dataset``), and for mixed its hybrid quantisation keeping the layers
        our sensitivity search found in float (``custom_hybrid``: each layer's [input, output] tensors). Outputs
        the runtime serves are left out of the toolkit's model (``serve_passthrough``)."""
        options = {"target_platform": "rk3588", "serve_passthrough": True, **_config_switches(target, report)}
        plan = report.get("precision") or {}
        if plan.get("requested") not in ("int8", "mixed"):
            return options
        options.update(dtype="int8", **_QUANT_CONFIG)
        if plan["requested"] == "mixed":
            options["custom_hybrid"] = {
                name: [pair for _, pair in sorted((s.get("float_layer_tensors") or {}).items())]
                for name, s in mixed_sections(report).items()
            }
        return options

    def vendor_files(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> dict[str, bytes]:
        entries = []
        planned = self.toolchain_options(target, report).get("dtype") == "int8"
        for bucket in buckets:
            explored = _explored_quantization(report, bucket.name)
            # A quantised build that missed the accuracy target was not shipped (the bucket ships its float ONNX).
            dropped = (((report.get("toolchain") or {}).get("buckets") or {}).get(bucket.name) or {}).get("shipped") is False
            inputs = [v for v in bucket.model.graph.inputs if v.const_value is None]
            entries.append({
                "name": bucket.name,
                "onnx": self.model_filename(bucket),
                "rknn": rknn_filename(bucket),
                "inputs": [v.name for v in inputs],
                # The bucket's shapes: a bucket that ships the original model keeps its symbolic dims.
                "input_size_list": [[int(d) for d in bucket.input_shapes.get(v.name, v.shape)] for v in inputs],
                "dtypes": [v.dtype.numpy().name if v.dtype is not None else "float32" for v in inputs],
                # What the script builds where the bundle holds no .rknn (else its build record says).
                "precision": "int8" if planned and not dropped and explored.get("int8") is not False else "float16",
                **explored,
                **({"served_by_runtime": served} if (served := served_outputs(bucket, report)) else {}),
            })  # fmt: skip
        script = render(
            __package__, "convert_rknn.py",
            buckets=pprint.pformat(entries, width=110, sort_dicts=False),
            config=pprint.pformat({"target_platform": "rk3588", **_config_switches(target, report)}, sort_dicts=False),
            quant=pprint.pformat(_QUANT_CONFIG, sort_dicts=False),
            hybrid=pprint.pformat(self.toolchain_options(target, report).get("custom_hybrid") or {}, width=110),
        )  # fmt: skip
        # The modules convert_rknn.py maps the hybrid layers' names and leaves the served outputs out with, the
        # very files the driver imports.
        shared = {name: resources.files(__package__).joinpath(name).read_bytes()
                  for name in ("rknn_hybrid.py", "rknn_outputs.py")}  # fmt: skip
        return {"convert_rknn.py": script.encode(), **shared}

    def manifest(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> dict:
        """Per bucket, the outputs its .rknn leaves to the runtime (``served_by_runtime``)."""
        manifest = super().manifest(buckets, target, report)
        for entry, bucket in zip(manifest["buckets"], buckets, strict=True):
            served = served_outputs(bucket, report)
            if served:
                entry["served_by_runtime"] = served
                entry["served_by_runtime_note"] = (
                    "outputs the compiled .rknn does not produce (rknn-toolkit2 2.5.0 dies building a model that "
                    "passes an input it consumes through to an output): the runtime computes each from the "
                    "request's input named, by the steps listed"
                )
        return manifest

    def deploy_steps(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> list[str]:
        rknn_files = ", ".join(f"`{rknn_filename(b)}`" for b in buckets)
        kept = {name: s.get("float_layers") or [] for name, s in mixed_sections(report).items()}
        hybrid = (
            "; precision mixed: the script keeps the mixed plan's float layers ("
            + "; ".join(f"{name}: {', '.join(layers)}" for name, layers in kept.items() if layers)
            + ") float16 through the toolkit's hybrid quantisation, as the toolchain here did (`HYBRID`)"
            if any(kept.values())
            else ""
        )
        return [
            "On an x86_64 or arm64 Linux host: `pip install rknn-toolkit2` (install a CPU build of torch first, or "
            "pip fetches a CUDA one; `flexdsa toolchains install rockchip` does this in an environment of its own).",
            "In this folder: `python convert_rknn.py` compiles every bucket for the RK3588 as it shipped "
            f"({rknn_files}, into `rebuilt/`; it never writes over the shipped files): the precision, switches, "
            "float16 layers and calibration samples each shipped `.rknn`'s build record (`.rknn.build.json`) names, "
            "else the precision planned here; `--check` also runs each in the toolkit's simulator. Another "
            "precision: `--precision float16`, or `--precision int8 --dataset dataset.txt` (one calibration sample a "
            f"line, one .npy or image per input, space-separated; 20-100 samples){hybrid}.",
            "To check the shipped .rknn against what `report.json` claims: `flexdsa verify-bundle .` (or, with only "
            "`flexdsa_runtime` installed, `python -m flexdsa_runtime verify .`) rebuilds each in the toolkit's "
            "simulator as its build record says and runs it on the samples the job judged it on (where the bundle "
            "ships them).",
            "Copy the .rknn file(s) and `manifest.json` to the RK3588 board (the NPU driver and librknnrt.so "
            "come with the board's Rockchip image).",
            "On the board, Python: `pip install rknn-toolkit-lite2`, then `from rknnlite.api import RKNNLite; "
            "r = RKNNLite(); r.load_rknn('model.<bucket>.rknn'); r.init_runtime(core_mask=RKNNLite.NPU_CORE_AUTO); "
            "outputs = r.inference(inputs=[...])` (4-D inputs in NHWC unless `data_format='nchw'` is given); C: "
            "`rknn_init` / `rknn_inputs_set` / `rknn_run` / `rknn_outputs_get` from librknnrt.",
            "Pick the bucket per request as `manifest.json` says (`pick_bucket`): pad the inputs up to the "
            "smallest bucket that holds them and slice the outputs back.",
        ]


# ---- node_reason helpers ----------------------------------------------------------------------------


def _producer_type(value: ir.Value | None) -> str | None:
    producer = value.producer() if value is not None else None
    return producer.op_type if producer is not None else None


def _scalar(value: ir.Value | None) -> float | None:
    """The value of a one-element constant (an initializer or a Constant node's output), else None."""
    if value is None:
        return None
    tensor = value.const_value
    producer = value.producer()
    if (
        tensor is None
        and producer is not None
        and producer.op_type == "Constant"
        and "value" in producer.attributes
    ):
        tensor = producer.attributes["value"].value
    if tensor is None or tensor.size != 1:
        return None
    return float(tensor.numpy().reshape(()))


def _erf_gelu_input(node: ir.Node) -> ir.Value | None:
    """x when ``node`` is Erf(x / sqrt 2) (the form the toolkit fuses into exGelu), else None."""
    producer = node.inputs[0].producer() if node.inputs and node.inputs[0] is not None else None
    if producer is None or producer.op_type != "Div" or len(producer.inputs) != 2:
        return None
    divisor = _scalar(producer.inputs[1])
    return producer.inputs[0] if divisor is not None and abs(divisor - SQRT2) < 1e-3 else None


def _pool_dims_reason(node: ir.Node) -> str | None:
    for value in (node.inputs[0] if node.inputs else None, *node.outputs):
        if value is None or value.shape is None or len(value.shape) < 3:
            continue
        named = dict(zip("CHW", list(value.shape)[1:4], strict=False))
        for axis, dim in named.items():
            if isinstance(dim, int) and dim > POOL_DIM_MAX:
                return f"MaxPool: {axis} = {dim} exceeds the limit of {POOL_DIM_MAX} on the RK3588 NPU (R2)"
    return None


# ---- legalisation rewrites --------------------------------------------------------------------------


def _float_scalar(value: ir.Value, number: float, name: str) -> ir.Value:
    dtype = value.dtype or ir.DataType.FLOAT
    array = np.array(number, dtype=dtype.numpy())
    constant = ir.Value(
        name=name, shape=ir.Shape([]), type=ir.TensorType(dtype), const_value=ir.tensor(array)
    )
    return constant


def _nodes(model: ir.Model, op_type: str) -> list[ir.Node]:
    return [n for n in model.graph if n.op_type == op_type and n.domain in ("", "ai.onnx")]


def _replace(model: ir.Model, old: ir.Node, new_nodes: list[ir.Node], output: ir.Value) -> None:
    """Put ``new_nodes`` where ``old`` was; ``output`` (the last new node's output) takes ``old``'s place,
    keeping its name, shape and type so that graph outputs and the vendor's placement keep their names."""
    graph = model.graph
    graph.insert_after(old, new_nodes)
    result = old.outputs[0]
    name, shape, type_ = result.name, result.shape, result.type
    if result.is_graph_output():
        graph.outputs[graph.outputs.index(result)] = output
    ir.convenience.replace_all_uses_with(result, output)
    graph.remove(old, safe=True)
    output.name, output.shape, output.type = name, shape, type_


def _register(model: ir.Model, constant: ir.Value) -> ir.Value:
    taken = set(model.graph.initializers)
    base, index = constant.name, 0
    while constant.name in taken:
        index += 1
        constant.name = f"{base}_{index}"
    model.graph.register_initializer(constant)
    return constant


def _gelu_erf_div_form(model: ir.Model) -> int:
    count = 0
    for erf in _nodes(model, "Erf"):
        mul = erf.inputs[0].producer() if erf.inputs[0] is not None else None
        if mul is None or mul.op_type != "Mul" or len(mul.inputs) != 2 or len(mul.outputs[0].uses()) != 1:
            continue
        for data, scale in ((mul.inputs[0], mul.inputs[1]), (mul.inputs[1], mul.inputs[0])):
            factor = _scalar(scale)
            if factor is not None and abs(factor * SQRT2 - 1.0) < 1e-3 and data is not None:
                root_two = _register(model, _float_scalar(data, SQRT2, f"{mul.name}_sqrt2"))
                div = ir.node("Div", [data, root_two], name=mul.name)
                _replace(model, mul, [div], div.outputs[0])
                count += 1
                break
    return count


def _neg_to_mul(model: ir.Model) -> int:
    count = 0
    for node in _nodes(model, "Neg"):
        x = node.inputs[0]
        if x is None or x.dtype is None or not x.dtype.is_floating_point():
            continue
        minus_one = _register(model, _float_scalar(x, -1.0, f"{node.name}_minus_one"))
        mul = ir.node("Mul", [x, minus_one], name=node.name)
        _replace(model, node, [mul], mul.outputs[0])
        count += 1
    return count


def _pad_into_conv(model: ir.Model) -> int:
    """onnxscript's ``fuse_pad_into_conv_rule``: a zero, constant-mode Pad of the spatial axes only goes into
    the Conv's ``pads`` (exact)."""
    from onnxscript.rewriter.rules.common import fuse_pad_into_conv_rule

    verdicts = drive(model, [fuse_pad_into_conv_rule], lambda _rule, _delta: _TAKE, rule_name="pad_into_conv")
    if verdicts:
        ir_passes.RemoveUnusedNodesPass()(model)
    return len(verdicts)


class _Take:
    taken = True


_TAKE = _Take()


def _sum_to_add(model: ir.Model) -> int:
    count = 0
    for node in _nodes(model, "Sum"):
        inputs = [v for v in node.inputs if v is not None]
        if len(inputs) < 2:
            continue
        chain, total = [], inputs[0]
        for index, value in enumerate(inputs[1:]):
            name = node.name if index == len(inputs) - 2 else f"{node.name}_add{index}"
            add = ir.node("Add", [total, value], name=name)
            chain.append(add)
            total = add.outputs[0]
        _replace(model, node, chain, total)
        count += 1
    return count


# ---- convert_rknn.py --------------------------------------------------------------------------------


def rknn_filename(bucket: BucketModel) -> str:
    """The bucket's .rknn as the toolchain's driver names it (``model.<bucket>.rknn``, a single bucket's too)."""
    return f"model.{bucket.name}.rknn"


def served_outputs(bucket: BucketModel, report: dict) -> list[dict]:
    """The outputs the bucket's .rknn leaves to the runtime: as the toolchain's build here left them out, else
    as ``convert_rknn.py`` will (``rknn_outputs.runtime_served``, the driver's own rule)."""
    entry = (((report.get("toolchain") or {}).get("buckets") or {}).get(bucket.name)) if (report.get("toolchain") or {}).get("ran") else None
    if entry is not None:
        return list(entry.get("served_by_runtime") or [])
    return runtime_served(_graph_view(bucket.model))


def _graph_view(model: ir.Model) -> SimpleNamespace:
    """The parts of an ONNX GraphProto ``rknn_outputs`` reads (names, op types, integer attributes, input
    dtypes), from the IR without serialising its weights."""

    def value(v: ir.Value) -> SimpleNamespace:
        elem = int(v.dtype) if v.dtype is not None else 0
        return SimpleNamespace(name=v.name, type=SimpleNamespace(tensor_type=SimpleNamespace(elem_type=elem)))

    def attribute(name: str, attr) -> SimpleNamespace:
        number = attr.value if isinstance(attr.value, int) else 0
        return SimpleNamespace(name=name, i=number)

    graph = model.graph
    nodes = [
        SimpleNamespace(op_type=n.op_type, domain=n.domain, input=[v.name if v is not None else "" for v in n.inputs],
                        output=[v.name for v in n.outputs],
                        attribute=[attribute(k, a) for k, a in n.attributes.items()])
        for n in graph
    ]  # fmt: skip
    return SimpleNamespace(input=[value(v) for v in graph.inputs], output=[value(v) for v in graph.outputs],
                           node=nodes, initializer=[SimpleNamespace(name=k) for k in graph.initializers])  # fmt: skip


def _config_switches(target: TargetSpec, report: dict) -> dict:
    """rknn.config() switches. The toolkit has no per-fusion switch that holds (R1; its disable_rules did
    not stop the attention fusion in 2.5.0), and a lower optimization_level breaks float16 attention masks,
    so fusions the user switched off that the toolkit does itself are only reported (see vendor_notes)."""
    return {"optimization_level": OPTIMIZATION_LEVEL}


_QUANT_CONFIG = {"quantized_dtype": "w8a8", "quantized_algorithm": "normal", "quantized_method": "channel"}


def _explored_quantization(report: dict, bucket: str) -> dict:
    """What vendor exploration chose for this bucket's --int8 build (its calibration algorithm, whether the
    hybrid float layers stay float16, or float16 itself), for convert_rknn.py to repeat; {} where it chose nothing."""
    options = (((report.get("vendor") or {}).get("buckets") or {}).get(bucket) or {}).get("options") or {}
    if not options:
        return {}
    if options.get("dtype") != "int8":
        return {"explored": "float16: no quantised build met the accuracy target more cheaply", "int8": False}
    chosen = {key: options[key] for key in _QUANT_CONFIG if key in options}
    return {"quantization": chosen, "hybrid": bool((options.get("custom_hybrid") or {}).get(bucket)),
            "auto_hybrid": bool(options.get("auto_hybrid")),
            **({"hybrid_layers": options["hybrid_layers"]} if any((options.get("hybrid_layers") or {}).values()) else {})}  # fmt: skip


ADAPTER = RockchipAdapter()
