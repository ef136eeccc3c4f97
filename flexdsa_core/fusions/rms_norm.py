"""RMSNorm written out in primitives → one ``RMSNormalization`` (ONNX opset 23).

    y = x / sqrt(mean(x^2) + eps) * scale      (mean over the last axis; x may be cast up first and back after)

ONNX Runtime also runs its ``SimplifiedLayerNormalization``, measured here as fast as ``RMSNormalization``
(within noise at [1,128,768] and [1,512,4096]), but it is not an ONNX op, so a model holding it fails the
ONNX checker; ``RMSNormalization`` passes it. The rule raises an opset 18-22 import to 23 (see
``_opset_upgrade``) and refuses, with the reason, below 18.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern

from flexdsa_core._libraries import get_singleton_value
from flexdsa_core.fusions._norm_checks import last_axis_refusal
from flexdsa_core.fusions._norm_fusion import NormFusion
from flexdsa_core.fusions.base import make_rule

RMS_NORM_OPSET = 23
_FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})
_STASH_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE})


class RmsNormFusion(NormFusion):
    """Mul(Mul(x, Reciprocal(Sqrt(Add(ReduceMean(Pow(x, 2)), eps)))), scale) → RMSNormalization(x, scale)"""

    def __init__(self, scaled: bool = True, root: str = "mul"):
        # scaled=False: an RMSNorm whose scale is gone (all ones, removed as x * 1) or absent ends at
        # Mul(x, 1/rms) (root="mul") or Div(x, rms) (root="div"); it gets a scale of ones.
        super().__init__(
            "RmsNormFusion" if scaled else f"RmsNormFusion_unscaled_{root}",
            scaled=scaled, root=root, opset=RMS_NORM_OPSET, op_type="RMSNormalization",
        )  # fmt: skip

    def pattern(self, op, x, scale, epsilon, compute_type, output_type):
        x_compute = pattern.OrValue(
            [op.Cast(x, to=compute_type, _outputs=["cast_in"]), x], tag_var="cast_in_tag", tag_values=[1, 0]
        )
        squared = pattern.OrValue([op.Pow(x_compute, 2.0), op.Mul(x_compute, x_compute)])
        mean_square = op.ReduceMean(squared, _allow_other_inputs=True, _outputs=["mean_square"])
        rms = op.Sqrt(op.Add(mean_square, epsilon))
        # torch.rsqrt exports as Div(1, Sqrt(.)); others write Reciprocal(Sqrt(.)) or divide by the root.
        inverse = pattern.OrValue([op.Reciprocal(rms), op.Div(1.0, rms)])
        if not self._scaled:
            return op.Mul(x_compute, inverse) if self._root == "mul" else op.Div(x_compute, rms)
        normalized = pattern.OrValue([op.Mul(x_compute, inverse), op.Div(x_compute, rms)])
        normalized = pattern.OrValue(
            [op.Cast(normalized, to=output_type), normalized], tag_var="cast_out_tag", tag_values=[1, 0]
        )
        return op.Mul(normalized, scale)

    def check(
        self,
        context,
        x,
        scale,
        epsilon,
        mean_square,
        cast_in_tag,
        cast_out_tag=0,
        compute_type=None,
        output_type=None,
        **_,
    ) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if x.dtype not in _FLOAT_TYPES:
            return result.fail(f"Input '{x.name}' is {x.dtype}, not a float type RMSNormalization takes.", x)
        if (reason := last_axis_refusal(mean_square.producer(), x)) is not None:
            return result.fail(reason, mean_square)
        if get_singleton_value(epsilon) is None:
            return result.fail(f"Epsilon '{epsilon.name}' is not a constant scalar.", epsilon)
        # RMSNormalization computes in stash_type and returns the input's dtype: the optional casts around
        # the computation must come back to it (a same-type Cast, as exporters write, is no cast at all).
        compute = ir.DataType(compute_type.as_int()) if cast_in_tag else x.dtype
        output = ir.DataType(output_type.as_int()) if cast_out_tag else compute
        if output != x.dtype:
            return result.fail(
                f"The normalised result is {output}, not the input's {x.dtype} as RMSNormalization keeps."
            )
        self._stash_type = compute
        if self._stash_type not in _STASH_TYPES:
            return result.fail(f"The normalisation is computed in {self._stash_type}, not float or double.")
        if (refusal := self.scale_refusal(context, scale, x)) is not None:
            return result.fail(*refusal)
        return result

    def rewrite(self, op, x, scale, epsilon, **_):
        return op.RMSNormalization(
            x,
            self.fused_scale(op, scale),
            axis=-1,
            epsilon=float(get_singleton_value(epsilon)),
            stash_type=self._stash_type,
        )


RULES = [
    make_rule(
        "rms_norm",
        "RMSNorm written as Pow/ReduceMean/Add/Sqrt/Reciprocal/Mul/Mul → one RMSNormalization",
        ["RMSNormalization"],
        [
            *RmsNormFusion.rule().commute(),
            *RmsNormFusion.rule(scaled=False, root="mul").commute(),
            *RmsNormFusion.rule(scaled=False, root="div").commute(),
        ],
    )
]
