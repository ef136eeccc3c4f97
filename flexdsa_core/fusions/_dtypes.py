"""Element types the fused ops are emitted for.

ONNX defines Gemm, PRelu and GlobalAveragePool on integers too in some opsets, but runtimes (ONNX
Runtime's CPU provider among them) implement them for floating point only, while the unfused
MatMul/Add/Max run on integers; so integer graphs are left as they are. ONNX Runtime's contrib kernels
are narrower still: FusedConv and FusedGemm take float32, FusedMatMul float32 and double.
"""

from __future__ import annotations

import onnx_ir as ir

FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})
FLOAT32 = frozenset({ir.DataType.FLOAT})
FLOAT32_OR_DOUBLE = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE})


def dtype_refusal(op_type: str, allowed: frozenset[ir.DataType], *values: ir.Value | None) -> str | None:
    """A sentence unless the element type of ``values`` (the first one that has a known type; the
    operands of one op share it) is in ``allowed``."""
    for value in values:
        if value is not None and value.type is not None:
            if value.type.dtype in allowed:
                return None
            return f"'{value.name}' has element type {value.type.dtype}, which {op_type} is not emitted for."
    names = ", ".join(f"'{v.name}'" for v in values if v is not None)
    return f"The element type of {names} is unknown."
