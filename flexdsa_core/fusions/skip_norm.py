"""A residual Add feeding a normalisation → ONNX Runtime's skip-normalisation ops:

    LayerNormalization(x + skip [+ bias], gamma, beta) → com.microsoft::SkipLayerNormalization
    RMSNormalization(x + skip [+ bias], gamma)         → com.microsoft::SkipSimplifiedLayerNormalization

Both run after ``layer_norm`` / ``rms_norm`` have made the normalisation op. When the sum also feeds the
next residual (the usual transformer block), the fused op's fourth output carries it, so the Add still
disappears. The patterns, operand orders and shape checks (x and skip [B, S, D], gamma/beta/bias [D]) are
onnxscript's ``ort_fusions.skip_normalization``; the RMS variant here matches ``RMSNormalization`` (what
``rms_norm`` emits) instead of ORT's ``SimplifiedLayerNormalization``.

Cost note: with ONNX Runtime 1.31 on this project's machines the CPU SkipLayerNormalization measured 4-6x
slower than Add + LayerNormalization at [1, 128, 768]; the rule exists so that the Fusion Switcher can take
it where measured costs say so (and for targets whose fused op is faster), not because it always pays.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript.rewriter import pattern
from onnxscript.rewriter.ort_fusions import skip_normalization as ort_skip

from flexdsa_core.fusions.base import make_rule

_FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE})


def _dtype_refusal(input: ir.Value, skip: ir.Value) -> str | None:
    if input.dtype not in _FLOAT_TYPES or skip.dtype != input.dtype:
        return f"Input '{input.name}' ({input.dtype}) and skip '{skip.name}' ({skip.dtype}) are not one float type."
    return None


class _BiasOrder:
    """Where the bias sits in its Add (``Add(t, bias)`` or, as TorchScript writes Linear, ``Add(bias, t)``):
    rule variants, because ``RewriteRule.commute()`` fails on these patterns' OrValue in onnxscript 0.7."""

    def __init__(
        self, name: str, has_bias: bool = False, bias_pre_add: bool = False, bias_first: bool = False
    ):
        super().__init__(name, has_bias=has_bias, bias_pre_add=bias_pre_add)
        self._bias_first = bias_first

    def skip_sum(self, op, input, skip, bias):
        def add_bias(value):
            return op.Add(bias, value) if self._bias_first else op.Add(value, bias)

        if self._has_bias and self._bias_pre_add:
            input = add_bias(input)
        skip_sum = pattern.OrValue([op.Add(skip, input), op.Add(input, skip)], name="skip_sum")
        return add_bias(skip_sum) if self._has_bias and not self._bias_pre_add else skip_sum

    def check(self, op, input, skip, **kwargs) -> pattern.MatchResult:
        result = super().check(op, input=input, skip=skip, **kwargs)
        if result and (reason := _dtype_refusal(input, skip)) is not None:
            return result.fail(reason, input)
        return result


class SkipLayerNormFusion(_BiasOrder, ort_skip.SkipLayerNormFusion):
    """LayerNormalization(Add(x, skip) [+ bias], gamma, beta) → com.microsoft::SkipLayerNormalization(x, skip, gamma, beta[, bias])"""

    def pattern(self, op, input, skip, gamma, beta, bias):
        skip_sum = self.skip_sum(op, input, skip, bias)
        normalized = op.LayerNormalization(
            skip_sum, gamma, beta, axis=-1, _allow_other_attributes=True, _outputs=["layer_norm"]
        )
        return normalized, skip_sum


class SkipRmsNormFusion(_BiasOrder, ort_skip.SkipRmsNormFusion):
    """RMSNormalization(Add(x, skip) [+ bias], gamma) → com.microsoft::SkipSimplifiedLayerNormalization(x, skip, gamma[, bias])"""

    def pattern(self, op, input, skip, gamma, bias, epsilon, stash_type):
        skip_sum = self.skip_sum(op, input, skip, bias)
        normalized = op.RMSNormalization(
            skip_sum, gamma, axis=-1, _allow_other_attributes=True, _outputs=["simplified_layer_norm"]
        )
        return normalized, skip_sum


def _variants(rule_class, prefix: str) -> list:
    # Bias forms first: a plain x + skip would otherwise match inside (x + bias) + skip.
    biased = [
        rule_class.rule(
            f"{prefix}{where}{'_bias_first' if first else ''}",
            has_bias=True,
            bias_pre_add=pre,
            bias_first=first,
        )
        for where, pre in (("PreBias", True), ("Bias", False))
        for first in (False, True)
    ]
    return [*biased, rule_class.rule(prefix, has_bias=False)]


RULES = [
    make_rule(
        "skip_layer_norm",
        "LayerNormalization(x + skip [+ bias]) → com.microsoft::SkipLayerNormalization (4th output = the sum)",
        ["com.microsoft::SkipLayerNormalization"],
        _variants(SkipLayerNormFusion, "SkipLayerNorm"),
        opset_imports={"com.microsoft": 1},
        # takes layer_norm's LayerNormalization; the Gemm rules claim their bias Adds first
        after=("layer_norm", "matmul_add_gemm", "transpose_matmul_gemm", "gemm_act"),
    ),
    make_rule(
        "skip_rms_norm",
        "RMSNormalization(x + skip [+ bias]) → com.microsoft::SkipSimplifiedLayerNormalization (4th output = the sum)",
        ["com.microsoft::SkipSimplifiedLayerNormalization"],
        _variants(SkipRmsNormFusion, "SkipRmsNorm"),
        opset_imports={"com.microsoft": 1},
        # takes rms_norm's RMSNormalization; the Gemm rules claim their bias Adds first
        after=("rms_norm", "matmul_add_gemm", "transpose_matmul_gemm", "gemm_act"),
    ),
]
