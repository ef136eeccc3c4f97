"""The platform adapter contract: declared capabilities (the ``TargetSpec``) plus the few methods that differ.

``PlatformAdapter`` does the common work; a vendor's adapter subclasses it, overrides only what its toolchain
needs, and its vendor package exports it as ``ADAPTER``. Adapters are found by discovery (the folder a spec lies
in, ``TargetSpec.adapter``), so adding a platform is adding one folder ``targets/<vendor>/`` holding its spec,
its adapter and, where one installs, its toolchain (see ``flexdsa_core.vendors``). A vendor package kept outside
``targets/`` (a plug-in, a test's toy target) is registered with ``targets.register_vendor("package.name")``
and then found the same way.

An adapter also owns its target's pipeline: ``stages`` (the per-bucket stages, by the names
``pipeline.stage`` registers) and ``verifiers`` (the checks of the verified run, by the names
``verify.verifier`` registers). ``FlexDSAOptimizer`` runs what they list, in order, and knows no target.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import onnx_ir as ir

from flexdsa_core.rewrites import Legalisation, ordered
from flexdsa_core.targets.int8_format import Int8Format
from flexdsa_core.targets.spec import TargetSpec, op_key


@dataclass
class BucketModel:
    """One optimised model, for one shape bucket (``name`` 'dynamic' when shapes stayed symbolic)."""

    name: str
    model: ir.Model
    input_shapes: dict[str, list[int | str]] = field(default_factory=dict)
    # A hardware-independent variant shipped beside ``model`` when the adapter tuned it for this machine.
    portable: ir.Model | None = None
    # The value of each symbolic dim the model still has, as the cost model costed it: the one shape its
    # memory is planned, its outputs validated and its latency timed at (``report.json`` -> ``shapes.at``).
    at: dict[str, int] = field(default_factory=dict)


@dataclass
class Legalized:
    """What the adapter did to one bucket's model before code generation."""

    model: ir.Model
    applied: list[str] = field(default_factory=list)  # named rewrites, so the bisection can switch them off
    notes: list[str] = field(default_factory=list)
    portable: ir.Model | None = None
    # The rewrites switched off for this compile (the request's, the bisection's): a legalisation may have to
    # keep a runtime from making one of them again.
    disabled: frozenset[str] = frozenset()


class PlatformAdapter:
    """Common behaviour; subclasses set ``vendor`` and override what their toolchain needs.

    Registration: the package that exports the adapter as ``ADAPTER`` beside its spec(s) ``*.json`` is a folder
    of ``targets/`` (found by discovery), or a package kept elsewhere added with
    ``flexdsa_core.targets.register_vendor("its.package")``. Its pipeline is ``stages`` and ``verifiers``
    below; a stage or verifier of its own is registered (``pipeline.stage``, ``verify.verifier``) by a module
    outside ``targets/`` that is imported before the optimizer is made (targets never import the stages)."""

    vendor = "generic"
    # Execution provider options its compiled models were made with, for the manifest's artifacts (QNN: the HTP).
    provider_options: dict[str, str] = {}
    # The ONNX Runtime QDQ that stands in for the vendor's quantiser when layers are ranked here (``Int8Format``);
    # None: nobody here knows how to quantise for the target (cpu-ort's is this machine's: ``precision.formats``).
    int8_format: Int8Format | None = None
    # How the vendor's own artifacts are loaded on the target, for the manifest: per file role (``rknn``,
    # ``qnn-context``, ``qdq-onnx``, ...: ``vendor_runs.deploy_manifest.file_role``) the runtime that loads it and
    # how, in one sentence. A role not listed loads as the manifest's own table says (a QDQ model: as any ONNX model).
    artifact_loads: dict[str, tuple[str | None, str]] = {}

    def supported_op_keys(self, target: TargetSpec) -> frozenset[str]:
        """Ops the target runs. The spec's list, unless it says '*' (then the adapter must override)."""
        if target.supported_ops == ["*"]:
            raise NotImplementedError(f"target {target.name!r} lists no ops and its adapter reports none")
        return frozenset(target.supported_ops)

    def supports(self, target: TargetSpec, op_type: str, domain: str = "") -> bool:
        return op_key(op_type, domain) in self.supported_op_keys(target)

    # The adapter's own rewrites (``rewrites.Legalisation``), declared like fusion rules: users (and the
    # bisection) switch them off by name like any rule, and ``registry.Registry`` lists them.
    legalisations: tuple[Legalisation, ...] = ()

    @property
    def rewrites(self) -> tuple[str, ...]:
        """The names of ``legalisations``, in the order they apply."""
        return tuple(rewrite.name for rewrite in ordered(self.legalisations))

    def legalize(self, model: ir.Model, target: TargetSpec, disabled: frozenset[str]) -> Legalized:
        """Rewrite what the target's toolchain would mishandle: the declared legalisations, in order."""
        return self.apply_legalisations(Legalized(model, disabled=disabled), target, disabled)

    def apply_legalisations(self, result: Legalized, target: TargetSpec, disabled: frozenset[str]) -> Legalized:
        """Apply each declared legalisation not in ``disabled`` to ``result``; one that changed the model is
        recorded in ``result.applied``. Those without ``apply`` are honoured by an adapter step of their own."""
        for rewrite in ordered(self.legalisations):
            if rewrite.apply is not None and rewrite.name not in disabled and rewrite.apply(result, target):
                result.applied.append(rewrite.name)
        return result

    # ---- the target's pipeline ---------------------------------------------------------------------
    def stages(self, target: TargetSpec) -> tuple[str, ...]:
        """The per-bucket pipeline, in order, by stage name (``flexdsa_core.pipeline``). The default, for a
        target whose output runs here; an accelerator adds the Subgraph Mapper (``AcceleratorAdapter``)."""
        return (
            "shapes",  # Shape Tracker: fix this bucket's dims and fold the shape arithmetic they decide
            # Whole-graph estimate before the rewrites, where costs are estimated (a calibrated target measures)
            *(() if target.calibrated else ("estimate",)),
            "passes",  # generic passes to a fixed point: folding, CSE, dead code, no-ops, algebra
            "fusion",  # Fusion Switcher: legal fusions, each taken only where the cost model says it pays
            "legalize",  # this adapter's legalisations: ops the target lacks rewritten (or left to CPU fallback)
            "memory",  # memory plan: lifetimes -> static arena, reported against the naive sum of all tensors
            "record",  # what the report needs: the delivery check of every taken fusion, the estimates after
        )

    def verifiers(self, target: TargetSpec) -> tuple[str, ...]:
        """The verified run's checks, in order, by verifier name (``flexdsa_core.verify``); each answers a
        ``Verdict`` with its evidence, and those that can undo a rewrite share the one rollback. The default;
        an accelerator adds the vendor's own exploration, build and simulator (``AcceleratorAdapter``)."""
        return (
            "validation",  # every bucket against the original; on a mismatch, roll back the rewrite
            "padding",  # whether the runtime may pad a request up to its bucket
            # Timed against the original here: where this machine is the target (calibrated), a rewrite that
            # costs time is rolled back; elsewhere the timing only checks the graph (not the part's latency).
            "never_slower" if target.calibrated else "timed_here",
            "precision",  # int8/mixed/fp16 judged on held-out samples, never slower than fp32
        )

    def generate(
        self, buckets: list[BucketModel], target: TargetSpec, report: dict, *, workdir: Path | None = None
    ) -> dict[str, bytes | Path]:
        """Artifacts by file name. The default: one ONNX per bucket plus ``manifest.json``. Models too big
        for one protobuf are written under ``workdir`` with their external data, and given as paths."""
        files: dict[str, bytes | Path] = {}
        for bucket in buckets:
            # Where there is a workdir, each model goes to a file piece by piece and its serialisation is never
            # held whole (the bundle's packaging was the job's peak: BERT-base +415 MiB, PP-OCRv4 rec +10 MiB).
            portable = {}
            if bucket.portable is not None:
                portable_name = self.model_filename(bucket).replace(".onnx", ".portable.onnx")
                portable = _model_files(bucket.portable, portable_name, workdir)
            files.update(_model_files(bucket.model, self.model_filename(bucket), workdir))
            files.update(portable)
        files["manifest.json"] = json.dumps(self.manifest(buckets, target, report), indent=2).encode()
        return files

    def model_filename(self, bucket: BucketModel) -> str:
        return "model.onnx" if bucket.name in ("dynamic", "static") else f"model.{bucket.name}.onnx"

    def manifest(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> dict:
        return {
            "target": target.name,
            "target_version": target.version,
            "buckets": [
                {"name": b.name, "file": self.model_filename(b), "input_shapes": b.input_shapes}
                for b in buckets
            ],
            # How run-time shapes map to buckets (the Shape Tracker's manifest).
            "shapes": report.get("shapes", {}).get("manifest"),
            # Which vendor tool finishes the bundle, and what it does: never a generic command line, whose
            # shapes and normalisation belong to some other model (the bundle's scripts carry this model's).
            "converter": {"tool": target.converter.tool, "notes": target.converter.notes} if target.converter else None,
        }


def _model_files(model: ir.Model, name: str, workdir: Path | None) -> dict[str, bytes | Path]:
    """``model``'s file(s) by name: the bytes already made for it in the optimizer's scope where there are some;
    otherwise written under ``workdir`` (when given) and given as a path, never held whole in memory."""
    from flexdsa_core.ingest import needs_external_data, save_model
    from flexdsa_core.serialized import kept_bytes, model_bytes, write

    if not needs_external_data(model):
        if workdir is None or kept_bytes(model) is not None:
            return {name: model_bytes(model)}  # the bytes validation made, where it made some
        path = Path(tempfile.mkdtemp(prefix="flexdsa-artifacts-", dir=workdir)) / name
        write(model, path)
        return {name: path}
    folder = Path(tempfile.mkdtemp(prefix="flexdsa-artifacts-", dir=workdir))
    return {path.name: path for path in save_model(model, folder / name)}
