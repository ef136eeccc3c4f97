"""Means over every spatial axis → ``GlobalAveragePool``.

``ReduceMean(x, axes=[2, 3])``, or ``ReduceMean`` over H followed by ``ReduceMean`` over W (either order),
on an NCHW ``x`` becomes ``GlobalAveragePool(x)``; with ``keepdims=0`` on both the result is ``[N, C]``,
so ``Flatten(axis=1)`` follows. ``axes`` may be an attribute or (opset 18+) a constant input, and may be
negative. NCDHW (rank 5, axes 2, 3, 4) works the same way. Refused: other axes, a mix of kept and
dropped axes, an unknown rank, and rank 3, where a mean over the last axis is far more often a
transformer's feature mean ([B, S, D], LayerNorm's) than a 1-D spatial pool.
"""

from __future__ import annotations

from typing import ClassVar

import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from flexdsa_core._libraries import get_numpy_value
from flexdsa_core.fusions._dtypes import FLOAT_TYPES, dtype_refusal
from flexdsa_core.fusions.base import make_rule


def _reduction(node: ir.Node, rank: int) -> tuple[list[int], bool] | str:
    """The ReduceMean's axes (non-negative) and keepdims, or a sentence saying why they are unknown."""
    axes_input = node.inputs[1] if len(node.inputs) > 1 else None
    if axes_input is not None:
        values = get_numpy_value(axes_input)
        if values is None:
            return f"ReduceMean '{node.name}' axes '{axes_input.name}' are not constant."
        axes = [int(a) for a in values.reshape(-1)]
    else:
        axes = list(node.attributes.get_ints("axes", []))
    if not axes:
        return f"ReduceMean '{node.name}' names no axes."
    if any(not -rank <= a < rank for a in axes):
        return f"ReduceMean '{node.name}' axes {axes} are out of range for rank {rank}."
    return sorted({a % rank for a in axes}), bool(node.attributes.get_int("keepdims", 1))


class _GlobalAveragePoolBase(RewriteRuleClassBase):
    two_steps: ClassVar[bool] = False

    def pattern(self, op, x):
        reduced = op.ReduceMean(x, _allow_other_inputs=True, _outputs=["first"])
        if self.two_steps:
            reduced = op.ReduceMean(reduced, _allow_other_inputs=True, _outputs=["second"])
        return reduced

    def check(self, context, x, first, second=None) -> MatchResult:
        result = MatchResult()
        if x.shape is None or x.shape.rank() < 4:
            return result.fail(
                f"'{x.name}' is not known to have rank 4 or more (N, C, two or more spatial axes)."
            )
        refusal = dtype_refusal("GlobalAveragePool", FLOAT_TYPES, x)
        if refusal:
            return result.fail(refusal)
        rank = x.shape.rank()
        step = _reduction(first.producer(), rank)
        if isinstance(step, str):
            return result.fail(step)
        reduced, keep = set(step[0]), step[1]
        if second is not None:
            kept_axes = list(range(rank)) if keep else [a for a in range(rank) if a not in reduced]
            next_step = _reduction(second.producer(), len(kept_axes))
            if isinstance(next_step, str):
                return result.fail(next_step)
            if next_step[1] != keep:
                return result.fail("The two ReduceMeans mix keepdims=1 and keepdims=0.")
            reduced |= {kept_axes[a] for a in next_step[0]}
        spatial = set(range(2, rank))
        if reduced != spatial:
            return result.fail(
                f"ReduceMean over axes {sorted(reduced)}, not the spatial axes {sorted(spatial)}."
            )
        self._keepdims = keep
        return result

    def rewrite(self, op, x, **_):
        pooled = op.GlobalAveragePool(x)
        return pooled if self._keepdims else op.Flatten(pooled, axis=1)


class ReduceMeanSpatial(_GlobalAveragePoolBase):
    """ReduceMean(x, axes=[2, 3]) → GlobalAveragePool(x)"""


class ReduceMeanTwice(_GlobalAveragePoolBase):
    """ReduceMean(ReduceMean(x, axes=[2]), axes=[3]) → GlobalAveragePool(x)"""

    two_steps = True


RULES = [
    make_rule(
        "reduce_mean_gap",
        "ReduceMean over all spatial axes (in one or two steps) into GlobalAveragePool.",
        ["GlobalAveragePool", "Flatten"],
        [ReduceMeanTwice.rule(), ReduceMeanSpatial.rule()],
        # a norm's ReduceMeans are the norm's
        after=(
            "layer_norm",
            "rms_norm",
            "skip_layer_norm",
            "skip_rms_norm",
            "attention",
            "multihead_attention",
        ),
    ),
]
