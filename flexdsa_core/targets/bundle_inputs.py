"""What vendor scripts need to know about a bucket's model: its runtime inputs, their dims, and the
precision the request asked for (the vendor flag that follows from it is each adapter's business)."""

from __future__ import annotations

import onnx_ir as ir


def runtime_inputs(model: ir.Model) -> list[ir.Value]:
    """Graph inputs a caller feeds (initializers listed as inputs by old exporters are not)."""
    return [value for value in model.graph.inputs if not value.is_initializer()]


def input_dims(value: ir.Value) -> list[int | str]:
    """Fixed dims as ints, symbolic ones by name."""
    if value.shape is None:
        return []
    return [d if isinstance(d, int) else str(d) for d in value.shape]


def requested_precision(report: dict) -> str:
    """The request's ``precision`` option as recorded in the report ("fp32" when none was given)."""
    options = (report.get("reproducibility") or {}).get("options") or {}
    return options.get("precision") or "fp32"
