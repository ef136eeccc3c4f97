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


def mixed_sections(report: dict) -> dict[str, dict]:
    """Under ``precision: mixed``, each shape bucket's section of the report's precision plan (its
    ``float_layers`` and ``float_layer_tensors``), by bucket name; empty for any other precision. The
    toolchain run here and the bundle's own scripts read the float layers from the same place."""
    plan = report.get("precision") or {}
    if (plan.get("requested") or requested_precision(report)) != "mixed":
        return {}
    sections = plan.get("buckets") or {plan.get("bucket"): plan}
    return {name: section for name, section in sections.items() if name is not None}


def float_layer_tensors(section: dict) -> list[str]:
    """The tensors at both ends of a section's float layers, sorted, each once."""
    return sorted({t for pair in (section.get("float_layer_tensors") or {}).values() for t in pair})
