"""Stage 3, the generic passes: semantics-preserving, target-independent clean-ups.

``generic_passes(options)`` is the list the optimizer runs to a fixed point with ``run_passes``, in this
order (each line says why it is there):
"""

from __future__ import annotations

import onnx_ir as ir

from flexdsa_core.options import OptimizeOptions
from flexdsa_core.passes.algebraic import AlgebraicSimplificationPass
from flexdsa_core.passes.cleanup import CommonSubexpressionEliminationPass, DeadCodeEliminationPass
from flexdsa_core.passes.folding import ConstantFoldingPass, ShapeFoldingPass
from flexdsa_core.passes.manager import PassFailedError, PassRecord, run_passes
from flexdsa_core.passes.no_op import NoOpRemovalPass
from flexdsa_core.passes.partial_shapes import PartialShapeFoldingPass

__all__ = [
    "GENERIC_PASS_NAMES",
    "PassFailedError",
    "PassRecord",
    "generic_passes",
    "run_passes",
]


def _all_passes(options: OptimizeOptions) -> list[ir.passes.PassBase]:
    return [
        # Shapes first: folding Shape/Gather/Concat chains turns dynamic Reshapes into static ones,
        # which the no-op and algebraic rules below can then reason about.
        ShapeFoldingPass(),
        # What stays partly symbolic (a dynamic batch beside static dims): Reshape targets to 0/-1 constants,
        # shapes rebuilt from Shape slices; onnxscript's folder above handles only fully static shapes.
        PartialShapeFoldingPass(),
        # Constant sub-graphs (weights pre-processing, exporter leftovers) become initializers, capped.
        ConstantFoldingPass(options.max_fold_bytes),
        # Nodes that compute their input (Identity, inference Dropout, x*1...) are bypassed.
        NoOpRemovalPass(),
        # Chains that collapse (Transpose∘Transpose, (x*a)*b...) get shorter; may expose more no-ops.
        AlgebraicSimplificationPass(),
        # Duplicate computations left by export or by the rewrites above are merged.
        CommonSubexpressionEliminationPass(),
        # Whatever nothing reads any more goes: nodes, initializers, functions, opset imports.
        DeadCodeEliminationPass(),
    ]


GENERIC_PASS_NAMES: tuple[str, ...] = tuple(p.name for p in _all_passes(OptimizeOptions()))


def generic_passes(options: OptimizeOptions) -> list[ir.passes.PassBase]:
    """The generic passes, in order, less those named in ``options.disabled_rules``."""
    disabled = set(options.disabled_rules)
    return [pass_ for pass_ in _all_passes(options) if pass_.name not in disabled]
