"""Fold an inference BatchNormalization into the Conv, ConvTranspose or Gemm that feeds it.

With the producer computing ``Y = W * X + B`` and BatchNormalization computing
``Y_bn = gamma * (Y - mean) / sqrt(var + epsilon) + beta``, let ``s = gamma / sqrt(var + epsilon)``
(one factor per output channel). Then ``Y_bn = W' * X + B'`` with

    W' = W * s                       (s broadcast along the output-channel axis of W)
    B' = (B - mean) * s + beta       (B = 0 when the producer has no bias; Gemm's ``beta`` folded into B)

The pattern, the weight scaling per producer and the constant/sharing checks are onnxscript's
``_fuse_batchnorm`` rules. Added here: BatchNormalization must be in inference mode with its running
statistics unused, and the folded tensors get fresh names (see ``_naming``).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult

from flexdsa_core._libraries import (
    FuseBatchNormIntoConv,
    FuseBatchNormIntoConvTranspose,
    FuseBatchNormIntoGemm,
)
from flexdsa_core.fusions._naming import fresh_name
from flexdsa_core.fusions.base import make_rule


class _InferenceBatchNormFold:
    """Mixin over onnxscript's fold: the extra checks, and the rewrite with fresh initializer names."""

    def check(self, context, x, inbound_out, batchnorm_out) -> MatchResult:
        result = MatchResult()
        batchnorm = batchnorm_out.producer()
        training = batchnorm.attributes.get("training_mode")
        if training is not None and training.as_int() != 0:
            return result.fail(f"BatchNormalization '{batchnorm.name}' runs in training mode.")
        if any(out.uses() or out.is_graph_output() for out in batchnorm.outputs[1:]):
            return result.fail(f"BatchNormalization '{batchnorm.name}' running statistics are used.")
        inbound = inbound_out.producer()
        if len(inbound.inputs) > 2 and inbound.inputs[2] is None:
            return result.fail(f"{inbound.op_type} '{inbound.name}' has an empty bias input.")
        base = super().check(context, x, inbound_out, batchnorm_out)
        if not base:
            return base
        weight = inbound.inputs[1]
        bias = inbound.inputs[2] if len(inbound.inputs) > 2 else None
        graph = context.graph_or_function
        self._names = (
            fresh_name(graph, f"{weight.name}_bn"),
            fresh_name(graph, f"{bias.name if bias is not None else weight.name + '_bias'}_bn"),
        )
        return result

    def rewrite(self, op, x, inbound_out, batchnorm_out):
        batchnorm, inbound = batchnorm_out.producer(), inbound_out.producer()
        gamma, beta, mean, var = (value.const_value.numpy() for value in batchnorm.inputs[1:5])
        scale = gamma / np.sqrt(var + batchnorm.attributes.get_float("epsilon", 1e-5))
        weights = inbound.inputs[1].const_value.numpy()
        fused_weights = self._scale_weights(weights, scale, inbound.attributes).astype(weights.dtype)

        attributes = dict(inbound.attributes)
        gemm_beta = attributes.pop("beta").as_float() if "beta" in attributes else 1.0
        bias_input = inbound.inputs[2] if len(inbound.inputs) > 2 else None
        bias = bias_input.const_value.numpy() if bias_input is not None else np.zeros_like(mean)
        fused_bias = ((gemm_beta * bias - mean) * scale + beta).astype(weights.dtype)

        weight_name, bias_name = self._names
        return op.op(
            self.op_type,
            x,
            op.initializer(ir.tensor(fused_weights), name=weight_name),
            op.initializer(ir.tensor(fused_bias), name=bias_name),
            **attributes,
        )


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
    ),
    make_rule(
        "conv_transpose_bn_fold",
        "Fold an inference BatchNormalization into the preceding ConvTranspose's weights and bias.",
        ["ConvTranspose"],
        [ConvTransposeBatchNormFold.rule()],
    ),
    make_rule(
        "gemm_bn_fold",
        "Fold an inference BatchNormalization into the preceding Gemm's weights and bias.",
        ["Gemm"],
        [GemmBatchNormFold.rule()],
    ),
]
