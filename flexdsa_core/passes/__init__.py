"""Stage 3, the generic passes: semantics-preserving, target-independent clean-ups.

``GENERIC_PASSES`` declares each pass as a rewrite (name, ``after``, how to make it); ``generic_passes(options)``
is the list the optimizer runs to a fixed point with ``run_passes``, in their ``after`` order.
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
from flexdsa_core.rewrites import PassRewrite, ordered

__all__ = [
    "GENERIC_PASSES",
    "GENERIC_PASS_NAMES",
    "PassFailedError",
    "PassRecord",
    "generic_passes",
    "run_passes",
]


# Each generic pass, declared as a rewrite (``rewrites.PassRewrite``): its name is the onnx_ir pass's, and
# ``after`` gives the one order they run in (each line says why it is there).
GENERIC_PASSES: tuple[PassRewrite, ...] = ordered((
    # Shapes first: folding Shape/Gather/Concat chains turns dynamic Reshapes into static ones,
    # which the no-op and algebraic rules below can then reason about.
    PassRewrite(name="shape_folding", summary="Shape computations of known shapes folded to constants.",
                make=lambda options: ShapeFoldingPass()),
    # What stays partly symbolic (a dynamic batch beside static dims): Reshape targets to 0/-1 constants,
    # shapes rebuilt from Shape slices; onnxscript's folder above handles only fully static shapes.
    PassRewrite(name="partial_shape_folding", after=("shape_folding",),
                summary="Partly symbolic shapes: Reshape targets to 0/-1 constants, shapes from Shape slices.",
                make=lambda options: PartialShapeFoldingPass()),
    # Constant sub-graphs (weights pre-processing, exporter leftovers) become initializers, capped.
    PassRewrite(name="constant_folding", after=("partial_shape_folding",),
                summary="Constant sub-graphs become initializers (up to max_fold_bytes each).",
                make=lambda options: ConstantFoldingPass(options.max_fold_bytes)),
    # Nodes that compute their input (Identity, inference Dropout, x*1...) are bypassed.
    PassRewrite(name="no_op_removal", after=("constant_folding",),
                summary="Nodes that compute their input (Identity, inference Dropout, x*1...) bypassed.",
                make=lambda options: NoOpRemovalPass()),
    # Chains that collapse (Transpose∘Transpose, (x*a)*b...) get shorter; may expose more no-ops.
    PassRewrite(name="algebraic_simplification", after=("no_op_removal",),
                summary="Chains that collapse (Transpose∘Transpose, (x*a)*b...) shortened.",
                make=lambda options: AlgebraicSimplificationPass()),
    # Duplicate computations left by export or by the rewrites above are merged.
    PassRewrite(name="cse", after=("algebraic_simplification",),
                summary="Duplicate computations merged.", make=lambda options: CommonSubexpressionEliminationPass()),
    # Whatever nothing reads any more goes: nodes, initializers, functions, opset imports.
    PassRewrite(name="dead_code", after=("cse",),
                summary="What nothing reads removed: nodes, initializers, functions, opset imports.",
                make=lambda options: DeadCodeEliminationPass()),
))  # fmt: skip


def _all_passes(options: OptimizeOptions) -> list[ir.passes.PassBase]:
    return [declared.make(options) for declared in GENERIC_PASSES]


GENERIC_PASS_NAMES: tuple[str, ...] = tuple(p.name for p in GENERIC_PASSES)


def generic_passes(options: OptimizeOptions) -> list[ir.passes.PassBase]:
    """The generic passes, in order, less those named in ``options.disabled_rules``."""
    disabled = set(options.disabled_rules)
    return [pass_ for pass_ in _all_passes(options) if pass_.name not in disabled]
