"""LayerNorm written out in primitives → one ``LayerNormalization`` (ONNX opset 17).

    y = (x - mean(x)) / sqrt(mean((x - mean(x))^2) + eps) * scale + bias      (means over the last axis)

Exporters below opset 17 write LayerNorm this way. ONNX Runtime runs ``LayerNormalization`` at any opset,
but the ONNX checker knows it only from opset 17, so when the model imports opset 13-16 the rule raises
the import to 17 (see ``_opset_upgrade``: safe unless the model holds an op whose meaning changed) and
refuses, with the reason, below 13. Two rewrites: the normalisation times ``scale`` becomes
``LayerNormalization(x, scale)``, then a following ``+ bias`` folds into its third input. A LayerNorm
without scale (``elementwise_affine=False``) becomes ``LayerNormalization(x, ones)``; that variant leaves
a normalisation followed by a Mul with a 1-D operand to the scaled one.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from flexdsa_core._libraries import get_singleton_value
from flexdsa_core.fusions._norm_checks import last_axis_refusal, node_label, vector_refusal
from flexdsa_core.fusions._norm_fusion import NormFusion
from flexdsa_core.fusions.base import make_rule

LAYER_NORM_OPSET = 17
_FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})


class LayerNormFusion(NormFusion):
    """Mul(Div(Sub(x, ReduceMean(x)), Sqrt(Add(ReduceMean(Pow(Sub(..), 2)), eps))), scale) → LayerNormalization(x, scale)"""

    def __init__(self, affine: bool = True, root: str = "div"):
        # affine=False: a LayerNorm without scale (elementwise_affine=False) ends at the Div (root="div")
        # or at Mul(deviation, 1/std) (root="mul"); it gets a scale of ones.
        super().__init__(
            "LayerNormFusion" if affine else f"LayerNormFusion_no_affine_{root}",
            scaled=affine, root=root, opset=LAYER_NORM_OPSET, op_type="LayerNormalization",
        )  # fmt: skip

    def pattern(self, op, x, scale, epsilon):
        mean = op.ReduceMean(x, _allow_other_inputs=True, _outputs=["mean"])
        deviation = op.Sub(x, mean)
        squared = pattern.OrValue([op.Pow(deviation, 2.0), op.Mul(deviation, deviation)])
        variance = op.ReduceMean(squared, _allow_other_inputs=True, _outputs=["variance"])
        std_dev = op.Sqrt(op.Add(variance, epsilon))
        inverse = pattern.OrValue([op.Reciprocal(std_dev), op.Div(1.0, std_dev)])
        if not self._scaled:
            return op.Div(deviation, std_dev) if self._root == "div" else op.Mul(deviation, inverse)
        normalized = pattern.OrValue([op.Div(deviation, std_dev), op.Mul(deviation, inverse)])
        return op.Mul(normalized, scale)

    def check(self, context, x, scale, epsilon, mean, variance, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if x.dtype not in _FLOAT_TYPES:
            return result.fail(
                f"Input '{x.name}' is {x.dtype}, not a float type LayerNormalization takes.", x
            )
        for reduce in (mean, variance):
            if (reason := last_axis_refusal(reduce.producer(), x)) is not None:
                return result.fail(reason, reduce)
        if get_singleton_value(epsilon) is None:
            return result.fail(f"Epsilon '{epsilon.name}' is not a constant scalar.", epsilon)
        if (refusal := self.scale_refusal(context, scale, x)) is not None:
            return result.fail(*refusal)
        return result

    def rewrite(self, op, x, scale, epsilon, **_):
        stash_type = ir.DataType.DOUBLE if x.dtype == ir.DataType.DOUBLE else ir.DataType.FLOAT
        return op.LayerNormalization(
            x,
            self.fused_scale(op, scale),
            axis=-1,
            epsilon=float(get_singleton_value(epsilon)),
            stash_type=stash_type,
        )


class LayerNormBiasFusion(pattern.RewriteRuleClassBase):
    """Add(LayerNormalization(x, scale), bias) → LayerNormalization(x, scale, bias)"""

    def pattern(self, op, x, scale, bias):
        return op.Add(op.LayerNormalization(x, scale, _outputs=["normalized"]), bias)

    def check(self, context, x, bias, normalized, **_) -> pattern.MatchResult:
        result = pattern.MatchResult()
        axis = normalized.producer().attributes.get_int("axis", -1)
        rank = x.shape.rank() if x.shape is not None else None
        if axis != -1 and (rank is None or axis != rank - 1):
            return result.fail(f"{node_label(normalized.producer())} normalises axis {axis}, not the last.")
        if (reason := vector_refusal("bias", bias, x)) is not None:
            return result.fail(reason, bias)
        return result

    def rewrite(self, op, x, scale, bias, normalized, **_):
        return op.LayerNormalization(x, scale, bias, **normalized.producer().attributes)


RULES = [
    make_rule(
        "layer_norm",
        "LayerNorm written as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add → one LayerNormalization",
        ["LayerNormalization"],
        [
            *LayerNormFusion.rule().commute(),
            *LayerNormFusion.rule(affine=False, root="div").commute(),
            *LayerNormFusion.rule(affine=False, root="mul").commute(),
            *LayerNormBiasFusion.rule().commute(),
        ],
    )
]
