"""The activations a Conv or Gemm can absorb, and their parameters read off the activation node.

Shared by ``conv_act`` (com.microsoft::FusedConv) and ``gemm_act`` (com.microsoft::FusedGemm).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from flexdsa_core._libraries import get_singleton_value

# Clip with a missing bound clamps at the float range.
_FLOAT_MAX = float(np.finfo(np.float32).max)
_DEFAULTS = {"LeakyRelu": {"alpha": 0.01}, "HardSigmoid": {"alpha": 0.2, "beta": 0.5}}


@dataclass(frozen=True)
class Activation:
    """An activation and its float parameters in ONNX Runtime's order: LeakyRelu [alpha],
    HardSigmoid [alpha, beta], Clip [min, max]; none for Relu, Sigmoid, Tanh."""

    op_type: str
    params: tuple[float, ...] = ()


def activation_pattern(op, op_type: str, x):
    """The pattern ``op_type(x)``, its output bound as ``act_out`` (Clip's bounds are inputs)."""
    return getattr(op, op_type)(x, _allow_other_inputs=True, _outputs=["act_out"])


def read_activation(node: ir.Node) -> Activation | str:
    """The node's activation, or a sentence saying why it cannot be fused."""
    if node.op_type in _DEFAULTS:
        params = tuple(
            node.attributes.get_float(name, default) for name, default in _DEFAULTS[node.op_type].items()
        )
        return Activation(node.op_type, params)
    if node.op_type != "Clip":
        return Activation(node.op_type)
    bounds = []
    for index, name, default in ((1, "min", -_FLOAT_MAX), (2, "max", _FLOAT_MAX)):
        bound = node.inputs[index] if len(node.inputs) > index else None
        if bound is None:
            bounds.append(node.attributes.get_float(name, default))
            continue
        value = get_singleton_value(bound)
        if value is None:
            return f"Clip '{node.name}' {name} bound '{bound.name}' is not a constant scalar."
        bounds.append(float(value))
    return Activation("Clip", tuple(bounds))
