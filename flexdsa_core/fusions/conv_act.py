"""Conv with its per-channel bias Add and its activation folded into one node.

``conv_add_bias``: ``Add(Conv(x, W[, B]), b)`` with ``b`` a constant broadcasting along the output
channels only (``[C, 1, 1]``, ``[1, C, 1, 1]`` or one element for a 2-D Conv; a ``[C]`` vector would
broadcast along the width) becomes ``Conv(x, W, B + b)``.

``conv_bias_act``: ``Act(Conv(x, W[, B]))``, optionally with such an Add between them, becomes
``com.microsoft::FusedConv(x, W, B + b, activation=Act, activation_params=...)`` for Relu, Sigmoid,
Tanh, LeakyRelu, Clip (ReLU6 is Clip(0, 6)) and HardSigmoid. ONNX Runtime's CPU kernel is float32 only.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from flexdsa_core._libraries import get_numpy_value
from flexdsa_core.fusions._activation import Activation, activation_pattern, read_activation
from flexdsa_core.fusions._dtypes import FLOAT32, dtype_refusal
from flexdsa_core.fusions._naming import fresh_name
from flexdsa_core.fusions.base import make_rule

ACTIVATIONS = ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "Clip", "HardSigmoid")


def _per_channel(bias: np.ndarray, rank: int, channels: int) -> np.ndarray | None:
    """``bias`` as a ``[channels]`` vector when it broadcasts along axis 1 only of a rank-``rank`` tensor."""
    if bias.ndim > rank:
        return None
    shape = (1,) * (rank - bias.ndim) + bias.shape
    if any(size != 1 for axis, size in enumerate(shape) if axis != 1) or shape[1] not in (1, channels):
        return None
    return np.broadcast_to(bias.reshape(-1), (channels,)).copy()


class _ConvFusionBase(RewriteRuleClassBase):
    """Shared checks and rewrite; subclasses say whether a bias Add and an activation are in the pattern."""

    with_bias_add: ClassVar[bool] = False
    activation: str | None = None

    def pattern(self, op, x, add_bias):
        out = op.Conv(x, _allow_other_inputs=True, _outputs=["conv_out"])
        if self.with_bias_add:
            out = op.Add(out, add_bias)
        if self.activation is not None:
            out = activation_pattern(op, self.activation, out)
        return out

    def check(self, context, x, conv_out, add_bias=None, act_out=None, **_) -> MatchResult:
        result = MatchResult()
        conv = conv_out.producer()
        weight = conv.inputs[1]
        refusal = self.activation is not None and dtype_refusal("FusedConv", FLOAT32, x, weight)
        if refusal:
            return result.fail(refusal)
        if weight.shape is None or not weight.shape.is_static():
            return result.fail(f"Conv weight '{weight.name}' has no static shape.")
        if self.with_bias_add:
            bias = get_numpy_value(add_bias)
            if bias is None:
                return result.fail(f"Added bias '{add_bias.name}' is not a constant.")
            if _per_channel(bias, weight.shape.rank(), weight.shape[0]) is None:
                return result.fail(f"Added bias '{add_bias.name}' of shape {bias.shape} is not per-channel.")
            old_bias = conv.inputs[2] if len(conv.inputs) > 2 else None
            if old_bias is not None and get_numpy_value(old_bias) is None:
                return result.fail(f"Conv bias '{old_bias.name}' is not a constant, so the Add cannot fold.")
            base = old_bias.name if old_bias is not None else f"{weight.name}_bias"
            self._bias_name = fresh_name(context.graph_or_function, f"{base}_folded")
        if act_out is not None:
            activation = read_activation(act_out.producer())
            if isinstance(activation, str):
                return result.fail(activation)
        return result

    def rewrite(self, op, x, conv_out, add_bias=None, act_out=None, **_):
        conv = conv_out.producer()
        inputs = list(conv.inputs)
        if self.with_bias_add:
            weight = conv.inputs[1]
            added = _per_channel(get_numpy_value(add_bias), weight.shape.rank(), weight.shape[0])
            old_input = inputs[2] if len(inputs) > 2 else None
            old_bias = get_numpy_value(old_input) if old_input is not None else 0
            fused_bias = (added + old_bias).astype(added.dtype)
            inputs = [*inputs[:2], op.initializer(ir.tensor(fused_bias), name=self._bias_name)]
        attributes = {name: attr for name, attr in conv.attributes.items()}
        if self.activation is None:
            return op.Conv(*inputs, **attributes)
        activation: Activation = read_activation(act_out.producer())
        if activation.params:
            attributes["activation_params"] = list(activation.params)
        return op.FusedConv(*inputs, activation=activation.op_type, _domain="com.microsoft", **attributes)


class ConvAddBias(_ConvFusionBase):
    """Add(Conv(x, W, B), b) → Conv(x, W, B + b)"""

    with_bias_add = True


class _ConvActivationBase(_ConvFusionBase):
    def __init__(self, activation: str):
        super().__init__(name=f"{type(self).__name__}[{activation}]")
        self.activation = activation


class ConvActivation(_ConvActivationBase):
    """Act(Conv(x, W, B)) → FusedConv(x, W, B, activation=Act)"""


class ConvBiasAddActivation(_ConvActivationBase):
    """Act(Add(Conv(x, W, B), b)) → FusedConv(x, W, B + b, activation=Act)"""

    with_bias_add = True


RULES = [
    make_rule(
        "conv_add_bias",
        "Fold a constant per-channel Add after a Conv into the Conv's bias.",
        ["Conv"],
        ConvAddBias.rule().commute(),
        # the BatchNorm folds first: a folded Conv's bias takes the Add after it
        after=("conv_bn_fold", "conv_transpose_bn_fold", "gemm_bn_fold", "pad_conv"),
    ),
    make_rule(
        "conv_bias_act",
        "Conv (+ per-channel bias Add) + activation into com.microsoft::FusedConv.",
        ["com.microsoft::FusedConv"],
        [
            *(r for act in ACTIVATIONS for r in ConvBiasAddActivation.rule(act).commute()),
            *(ConvActivation.rule(act) for act in ACTIVATIONS),
        ],
        opset_imports={"com.microsoft": 1},
        # a Conv with its BatchNorm and bias Add folded is what FusedConv takes
        after=("conv_bn_fold", "conv_add_bias", "pad_conv"),
    ),
]
