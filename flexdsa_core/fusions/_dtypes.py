"""Element types the fused standard ops are written for here.

ONNX defines Gemm, PRelu and GlobalAveragePool on integers too in some opsets, but runtimes (ONNX
Runtime's CPU provider among them) implement them for floating point only, while the unfused
MatMul/Add/Max run on integers; so integer graphs are left as they are.
"""

from __future__ import annotations

import onnx_ir as ir

FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


def float_type_refusal(value: ir.Value, op_type: str) -> str | None:
    """A sentence when ``value`` is not known to be floating point, else None."""
    dtype = value.type.dtype if value.type is not None else None
    if dtype in FLOAT_TYPES:
        return None
    return f"'{value.name}' has element type {dtype}; {op_type} is only emitted for floating point."
