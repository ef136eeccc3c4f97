"""The common adapter of the edge accelerators: legality per node, bundles, and the vendor toolchain run.

A vendor file subclasses ``AcceleratorAdapter`` and overrides only what its toolchain needs:

* ``node_reason(node, target)``: a constraint the op table cannot express (e.g. RKNN's Conv kernel <= 31),
  as a plain sentence, or None. The op table, dtypes, static shapes and the spec's ``op_constraints``
  are checked here already (``fallback_reason``).
* ``legalize_model(model, target, disabled)``: vendor rewrites, each named (so the bisection and
  ``disabled_rules`` can switch it off); the base adds explicit default attributes first.
* ``vendor_files(buckets, target, report)``: the conversion script/config for the bundle, by file name.
* ``deploy_steps(buckets, target, report)``: the README's numbered steps for the person deploying it.
* ``toolchain_options(target, report)``: extra ``options`` for the vendor driver's request.
"""

from __future__ import annotations

import onnx_ir as ir

from flexdsa_core.targets.base import BucketModel, Legalized, PlatformAdapter
from flexdsa_core.targets.spec import TargetSpec


class AcceleratorAdapter(PlatformAdapter):
    vendor = "generic"

    # ---- hooks a vendor file overrides ----------------------------------------------------------
    def node_reason(self, node: ir.Node, target: TargetSpec) -> str | None:
        """Why this (op-table-supported) node cannot run on the accelerator, or None."""
        return None

    def legalize_model(self, model: ir.Model, target: TargetSpec, disabled: frozenset[str]) -> Legalized:
        return Legalized(model)

    def vendor_files(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> dict[str, bytes]:
        return {}

    def deploy_steps(self, buckets: list[BucketModel], target: TargetSpec, report: dict) -> list[str]:
        return []

    def toolchain_options(self, target: TargetSpec, report: dict) -> dict:
        return {}
