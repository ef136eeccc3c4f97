"""The common adapter of the edge accelerators: legality per node, bundles, and the vendor toolchain run.

A vendor file subclasses ``AcceleratorAdapter`` and overrides only what its toolchain needs:

* ``node_reason(node, target)``: a constraint the op table cannot express (e.g. RKNN's Conv kernel <= 31),
  as a plain sentence, or None. The op table, static shapes and the spec's ``op_constraints`` are
  checked here already (``fallback_reason``).
* ``legalize_model(model, target, disabled)``: vendor rewrites, each named (so the bisection and
  ``disabled_rules`` can switch it off); the base first names every node and writes default attributes
  that vendor parsers require explicitly (RKNN's build crashes on a LayerNormalization without
  ``epsilon``).
* ``vendor_files(buckets, target, report)``: the conversion script/config for the bundle, by file name.
* ``deploy_steps(buckets, target, report)``: the README's numbered steps for the person deploying it.
* ``toolchain_options(target, report)``: extra ``options`` for the vendor driver's request.
* ``calibrated_options(bucket, samples)``: a bucket's driver options only its calibration samples can decide
  (QNN: the tensors of a packed output, at uint16); ``vendor_alone_options``: the vendor alone's, laid over them.
* ``partition_notes(model, target)``: what the partition report must say about the whole model on this
  target (e.g. that a float model runs on an int8-only accelerator only once quantised).
* ``vendor_cost(entry, versions)`` and ``vendor_forms``: the vendor compiler's own figure for a compiled
  model, and the rewrites only that figure can decide (``vendor_runs.explore``).

Its pipeline extends the default (``PlatformAdapter.stages`` and ``verifiers``): the Subgraph Mapper after the
memory plan, and after the default verifiers the vendor's exploration, its build and simulator, and the
accuracy verdict on its quantised model.
"""

from __future__ import annotations

import json

import onnx_ir as ir

from flexdsa_core.targets.base import BucketModel, Legalized, PlatformAdapter
from flexdsa_core.targets.constraints import violations
from flexdsa_core.targets.spec import TargetSpec, op_key
from flexdsa_core.targets.vendor_cost import VendorCost

# Ops that only carry data between others: free on any side of a partition boundary.
SHAPE_OPS = frozenset(
    {"Constant", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Shape", "Size", "Dropout"}
)

# Default attributes some vendor parsers need written out (ONNX defaults, so numerics do not change).
_EXPLICIT_DEFAULTS: dict[str, dict[str, object]] = {
    "LayerNormalization": {"epsilon": 1e-5, "axis": -1},
    "RMSNormalization": {"epsilon": 1e-5, "axis": -1},
    "InstanceNormalization": {"epsilon": 1e-5},
    "BatchNormalization": {"epsilon": 1e-5, "momentum": 0.9},
    "Gelu": {"approximate": "none"},
    "LeakyRelu": {"alpha": 0.01},
    "Elu": {"alpha": 1.0},
}


class AcceleratorAdapter(PlatformAdapter):
    vendor = "generic"

    # ---- hooks a vendor file overrides ----------------------------------------------------------
    def node_reason(self, node: ir.Node, target: TargetSpec) -> str | None:
        """Why this (op-table-supported) node cannot run on the accelerator, or None."""
        return None

    def legalize_model(self, model: ir.Model, target: TargetSpec, disabled: frozenset[str]) -> Legalized:
        return self.apply_legalisations(Legalized(model), target, disabled)

    def vendor_files(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> dict[str, bytes]:
        return {}

    def deploy_steps(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> list[str]:
        return []

    def toolchain_options(self, target: TargetSpec, report: dict) -> dict:
        return {}

    def partition_notes(self, model: ir.Model, target: TargetSpec) -> list[str]:
        return []

    # Forms (``targets/forms``) only the vendor's own estimate can decide, by name; tried where it gives cycles.
    vendor_forms: tuple[str, ...] = ()
    # Whether the vendor's compiler must run a sample to compile (QNN) rather than take shapes alone (rknn).
    vendor_needs_inputs: bool = False
    # The vendor package whose version labels its figures ("rknn-toolkit2 2.5.0 estimate").
    vendor_package: str | None = None

    # ---- the pipeline: the default (``PlatformAdapter``) plus the partition and the vendor's own checks ----
    def stages(self, target: TargetSpec) -> tuple[str, ...]:
        default = super().stages(target)
        after_memory = default.index("memory") + 1
        # Subgraph Mapper: accelerator partitions vs CPU fallback, kernels against SRAM.
        return (*default[:after_memory], "mapper", *default[after_memory:])

    def verifiers(self, target: TargetSpec) -> tuple[str, ...]:
        return (
            *super().verifiers(target),
            "vendor_exploration",  # forms scored by the vendor's own estimate, the vendor alone beside
            "toolchain",  # the vendor's own build and simulator of what ships
            "vendor_accuracy",  # the vendor-quantised model judged by the accuracy target
        )

    def vendor_cost(self, entry: dict, versions: dict) -> VendorCost | None:
        """The vendor's own figure for one compiled model (one driver entry); None where it gives none."""
        return None

    def vendor_estimate_options(self, target: TargetSpec, report: dict) -> dict:
        """Driver options for the exploration's estimate-only builds (the vendor alone's and each candidate's):
        by default the job's own (``toolchain_options``)."""
        return self.toolchain_options(target, report)

    # Driver options of the vendor alone's build of the original (the vendor's own preparation of a model).
    vendor_alone_options: dict = {}

    def calibrated_options(self, bucket: BucketModel, samples: list[dict]) -> dict:
        """Driver options for one bucket that only its calibration samples can decide (the final build, where
        the request carries them); laid under what exploration chose for the bucket. None by default."""
        return {}

    def vendor_precisions(self, target: TargetSpec, report: dict) -> dict[str, dict]:
        """Under an int8/mixed request, each precision the vendor's compiler makes: name -> driver options (the
        first a plain int8 build, what the vendor alone makes; ``"dtype": "float16"`` marks the float end)."""
        return {}

    # ---- legality ---------------------------------------------------------------------------------
    def fallback_reason(self, node: ir.Node, target: TargetSpec) -> str | None:
        """Why ``node`` must run on the CPU beside the accelerator, in plain words; None if it runs there."""
        key = op_key(node.op_type, node.domain)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            return None
        if key not in self.supported_op_keys(target):
            return f"{key} is not in the {target.name} op table"
        if target.static_shapes:
            for value in (*node.inputs, *node.outputs):
                if value is not None and value.shape is not None and not value.shape.is_static():
                    dims = [d for d in value.shape if not isinstance(d, int)]
                    return (
                        f"dynamic dim {str(dims[0])!r} of {value.name!r}: {target.name} needs static shapes "
                        "(give shape_buckets)"
                    )
        for limits in (target.op_constraints.get("*"), target.op_constraints.get(key)):
            if not limits or limits.get("over_limit") == "split":
                continue
            broken = violations(node, limits)
            if broken:
                source = f" ({limits['source']})" if limits.get("source") else ""
                return f"{key}: {'; '.join(broken)} on {target.name}{source}"
        return self.node_reason(node, target)

    def split_note(self, node: ir.Node, target: TargetSpec) -> str | None:
        """For a node over a documented limit that the vendor compiler splits into several accelerator ops
        itself (``"over_limit": "split"`` in the spec, seen in the vendor's own placement): what it costs."""
        key = op_key(node.op_type, node.domain)
        limits = target.op_constraints.get(key)
        if not limits or limits.get("over_limit") != "split":
            return None
        broken = violations(node, limits)
        if not broken:
            return None
        source = f" ({limits['source']})" if limits.get("source") else ""
        return f"{key}: {'; '.join(broken)}{source}; stays on the accelerator, split by the vendor compiler"

    # ---- legalisation -----------------------------------------------------------------------------
    def legalize(self, model: ir.Model, target: TargetSpec, disabled: frozenset[str]) -> Legalized:
        named = name_nodes(model)
        explicit = write_default_attributes(model)
        result = self.legalize_model(model, target, disabled)
        notes = []
        if named:
            notes.append(f"{named} unnamed node(s) named, so vendor placement can be matched to ours")
        if explicit:
            notes.append(
                f"{explicit} default attribute(s) written out explicitly (vendor parsers require them)"
            )
        result.notes[:0] = notes
        return result

    # ---- the bundle -------------------------------------------------------------------------------
    def generate(self, buckets, target, report, *, workdir=None) -> dict[str, bytes]:
        files = super().generate(buckets, target, report, workdir=workdir)
        vendor = self.vendor_files(buckets, target, report)
        files.update(vendor)
        manifest = json.loads(files["manifest.json"])
        manifest["vendor_files"] = sorted(vendor)
        files["manifest.json"] = json.dumps(manifest, indent=2).encode()
        files["README.md"] = self.readme(buckets, target, report, manifest).encode()
        return files

    def manifest(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> dict:
        manifest = super().manifest(buckets, target, report)
        for entry, bucket in zip(manifest["buckets"], buckets, strict=True):
            entry["inputs"] = [_io(value) for value in bucket.model.graph.inputs]
            entry["outputs"] = [_io(value) for value in bucket.model.graph.outputs]
        manifest["pick_bucket"] = (
            "As 'runtime' says (flexdsa_runtime does it): the bucket with the fewest padded input elements among "
            "those whose every dim is >= the request's; pad the bucketed axes at their end with each input's pad "
            "value (0: an attention mask 0 there), crop the outputs back. Dims the compiler found padding changes "
            "(runtime.padding) are served only at a bucket's exact size; shapes larger than every bucket need a "
            "new compile."
        )
        manifest["static_shapes"] = target.static_shapes
        manifest["toolchain"] = report.get("toolchain", {}).get("summary")
        return manifest

    def readme(self, buckets, target: TargetSpec, report: dict, manifest: dict) -> str:
        lines = [
            f"# {report.get('model', {}).get('name') or 'model'} for {target.name}",
            "",
            target.description,
            "",
            "## What is in this bundle",
            "",
            "| file | what it is |",
            "|---|---|",
        ]
        for entry in manifest["buckets"]:
            shapes = ", ".join(f"{i['name']} {i['shape']}" for i in entry["inputs"])
            lines.append(f"| `{entry['file']}` | target-ready ONNX for bucket `{entry['name']}` ({shapes}) |")
        for name in manifest.get("vendor_files", []):
            lines.append(f"| `{name}` | vendor conversion script/config |")
        for name in (report.get("toolchain") or {}).get("artifacts", []):
            what = (
                "how the vendor toolchain built the file beside it (switches, precision, float16 layers, the sha256 of "
                "its calibration and judged samples): what the rebuild scripts and `flexdsa_runtime verify` repeat"
                if name.endswith(".build.json") else "compiled by the vendor toolchain here"
            )  # fmt: skip
            lines.append(f"| `{name}` | {what} |")
        lines += [
            "| `manifest.json` | the deploy contract: every file per bucket with its role, how to load it and its "
            "sha256; how to pick, pad and crop at run time (`flexdsa_runtime` reads it) |",
            "| `report.json` | what was done, the partition, estimates, validation |",
            "| `fusion_plan.json` | every fusion candidate and why it was taken or refused |",
            "",
        ]
        partition = report.get("partition", {})
        for bucket, part in partition.items():
            lines.append(
                f"Bucket `{bucket}`: {part['accelerator_nodes']} of {part['nodes']} nodes on the accelerator "
                f"({_pct(part.get('accelerator_flop_share'))} of FLOPs), {len(part['fallback'])} on the CPU, "
                f"{part['transitions']} transition(s)."
            )
        toolchain = report.get("toolchain") or {}
        lines += ["", "## Deploying it", ""]
        if toolchain.get("ran"):
            lines.append(f"The vendor toolchain ({toolchain['name']}) ran on this bundle here: {toolchain['summary']}.")
        elif target.toolchain:
            lines.append(
                f"The vendor toolchain did not run here ({toolchain.get('detail', 'not ready')}). Run "
                f"`flexdsa toolchains install {target.toolchain}` and optimise again, or finish on your side with "
                "the steps below."
            )
        else:
            lines.append(
                "The vendor compiler does not install on this machine: the bundle was checked against the sourced "
                "op table, its scripts for syntax, and every model numerically in ONNX Runtime. Compile it on "
                "your side:"
            )
        lines.append("")
        for number, step in enumerate(self.deploy_steps(buckets, target, report), 1):
            lines.append(f"{number}. {step}")
        # No generic "converter reference" command here: the target's sample line carries some other model's
        # shapes and normalisation; the steps above run this bundle's own scripts, written for its buckets.
        return "\n".join(lines) + "\n"


def _pct(share: float | None) -> str:
    return "n/a" if share is None else f"{share * 100:.1f}%"


def _io(value: ir.Value) -> dict:
    return {
        "name": value.name,
        "shape": [d if isinstance(d, int) else str(d) for d in value.shape] if value.shape is not None else None,
        "dtype": value.dtype.numpy().name if value.dtype is not None else None,
    }


def is_constant(value: ir.Value | None) -> bool:
    """A missing input, an initializer, or a Constant node's output: known when the model is compiled."""
    if value is None or value.const_value is not None:
        return True
    producer = value.producer()
    return producer is not None and producer.op_type == "Constant"


def runtime_input_of(node: ir.Node, dtypes: frozenset) -> ir.Value | None:
    """The first input of one of ``dtypes`` computed at run time (not a constant): e.g. token ids or a mask
    that an int8/float16 accelerator cannot compute on."""
    for value in node.inputs:
        if value is None or value.dtype not in dtypes or is_constant(value):
            continue
        return value
    return None


def name_nodes(model: ir.Model) -> int:
    """Give every unnamed node a unique name (``<op>_<n>``); returns how many were named."""
    taken = {node.name for node in model.graph if node.name}
    named = 0
    for index, node in enumerate(model.graph):
        if node.name:
            continue
        candidate = f"{node.op_type}_{index}"
        while candidate in taken:
            candidate += "_"
        node.name = candidate
        taken.add(candidate)
        named += 1
    return named


def write_default_attributes(model: ir.Model) -> int:
    written = 0
    for node in model.graph:
        if node.domain not in ("", "ai.onnx"):
            continue
        for name, value in _EXPLICIT_DEFAULTS.get(node.op_type, {}).items():
            if name in node.attributes:
                continue
            node.attributes[name] = ir.Attr(name, _attr_type(value), value)
            written += 1
    return written


def _attr_type(value) -> ir.AttributeType:
    if isinstance(value, float):
        return ir.AttributeType.FLOAT
    if isinstance(value, int):
        return ir.AttributeType.INT
    return ir.AttributeType.STRING


# A custom target spec may name ``"adapter": "accelerator"``: the generic behaviour, no vendor files.
ADAPTER = AcceleratorAdapter()
