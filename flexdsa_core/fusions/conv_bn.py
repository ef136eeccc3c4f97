"""Fold an inference BatchNormalization into the Conv, ConvTranspose or Gemm that feeds it.

With the producer computing ``Y = W * X + B`` and BatchNormalization computing
``Y_bn = gamma * (Y - mean) / sqrt(var + epsilon) + beta``, let ``s = gamma / sqrt(var + epsilon)``
(one factor per output channel). Then ``Y_bn = W' * X + B'`` with

    W' = W * s            (s broadcast along the output-channel axis of W)
    B' = (B - mean) * s + beta      (B = 0 when the producer has no bias; Gemm's ``beta`` attribute folded in)

The arithmetic is onnxscript's ``_fuse_batchnorm`` rules; the checks here add what the fold also needs to
be safe: BatchNormalization in inference mode with a single output, and a free name for a new bias.
"""

from __future__ import annotations

from onnxscript.rewriter._basics import MatchResult
from onnxscript.rewriter.rules.common._fuse_batchnorm import (
    FuseBatchNormIntoConv,
    FuseBatchNormIntoConvTranspose,
    FuseBatchNormIntoGemm,
)

from flexdsa_core.fusions.base import make_rule


class _InferenceBatchNormFold:
    """Mixin: the checks every BatchNormalization fold adds to onnxscript's."""

    def check(self, context, x, inbound_out, batchnorm_out) -> MatchResult:
        result = MatchResult()
        batchnorm = batchnorm_out.producer()
        inbound = inbound_out.producer()
        training = batchnorm.attributes.get("training_mode")
        if training is not None and training.as_int() != 0:
            return result.fail(f"BatchNormalization '{batchnorm.name}' runs in training mode.")
        if len(batchnorm.outputs) > 1 and any(out.uses() for out in batchnorm.outputs[1:]):
            return result.fail(f"BatchNormalization '{batchnorm.name}' running statistics are used.")
        base = super().check(context, x, inbound_out, batchnorm_out)
        if not base:
            return base
        if len(inbound.inputs) < 3 or inbound.inputs[2] is None:
            # The fold creates a bias named after the weight; refuse rather than overwrite a live one.
            bias_name = f"{inbound.inputs[1].name}_bias"
            existing = context.graph_or_function.initializers.get(bias_name)
            if existing is not None and existing.uses():
                return result.fail(f"Initializer '{bias_name}' already exists and is used elsewhere.")
        return result


class ConvBatchNormFold(_InferenceBatchNormFold, FuseBatchNormIntoConv):
    """BatchNormalization(Conv(x, W, B)) → Conv(x, W', B')"""


class ConvTransposeBatchNormFold(_InferenceBatchNormFold, FuseBatchNormIntoConvTranspose):
    """BatchNormalization(ConvTranspose(x, W, B)) → ConvTranspose(x, W', B')"""


class GemmBatchNormFold(_InferenceBatchNormFold, FuseBatchNormIntoGemm):
    """BatchNormalization(Gemm(x, W, C)) → Gemm(x, W', C')"""


RULES = [
    make_rule(
        "conv_bn_fold",
        "Fold an inference BatchNormalization into the preceding Conv's weights and bias.",
        ["Conv"],
        [ConvBatchNormFold.rule()],
        order=10,
    ),
    make_rule(
        "conv_transpose_bn_fold",
        "Fold an inference BatchNormalization into the preceding ConvTranspose's weights and bias.",
        ["ConvTranspose"],
        [ConvTransposeBatchNormFold.rule()],
        order=10,
    ),
    make_rule(
        "gemm_bn_fold",
        "Fold an inference BatchNormalization into the preceding Gemm's weights and bias.",
        ["Gemm"],
        [GemmBatchNormFold.rule()],
        order=10,
    ),
]
