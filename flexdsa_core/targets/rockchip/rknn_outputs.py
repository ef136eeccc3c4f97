"""Outputs the runtime serves instead of the compiled model: a graph output that is a graph input passed through
(directly, or by Identity/Cast), or computed from an input's shape alone (Shape, then Cast/Identity).

rknn-toolkit2 2.5.0 dies with SIGFPE while building a model that passes an int64 input it also consumes through
to an output (a published sentence encoder returns ``input_ids`` and ``attention_mask`` beside its embedding;
seen on it and on a 6-node model, ``tests/core/targets/test_rockchip_exact.py``), alone and on every form of
ours. Loaded with only its other outputs (``load_onnx(outputs=...)``) it builds; the outputs left out need no
accelerator: the runtime makes them from the request's own inputs.

Each served output is ``{"output", "input", "dtype", "steps"}``; ``steps`` apply in order to the input:
``{"op": "Identity"}``, ``{"op": "Cast", "to": "<numpy dtype>"}``, ``{"op": "Shape", "start", "end"}``. The
bundle's manifest lists them per bucket (``served_by_runtime``); ``flexdsa_runtime`` computes them the same way.
Standard library at import (numpy where outputs are computed, ``serve``): imported by the toolchain's driver and
shipped in the bundle beside ``convert_rknn.py``, which both leave the same outputs out.
"""

from __future__ import annotations

# ONNX TensorProto data types -> numpy dtype names (those a Cast of an input can give).
_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
           10: "float16", 11: "float64", 12: "uint32", 13: "uint64"}  # fmt: skip


def runtime_served(graph) -> list[dict]:
    """The outputs of ``graph`` (an ONNX GraphProto) the runtime can serve from the inputs alone, in output
    order; none when every output is one (the vendor's model must keep something to compute)."""
    initializers = {init.name for init in graph.initializer}
    inputs = {value.name: value for value in graph.input if value.name not in initializers}
    producer = {out: node for node in graph.node for out in node.output}
    served = []
    for value in graph.output:
        found = _chain(value.name, inputs, producer)
        if found is not None:
            source, steps = found
            dtype = _dtype(inputs[source], steps)
            served.append({"output": value.name, "input": source, "dtype": dtype, "steps": steps})
    return [] if len(served) == len(graph.output) else served


def kept_outputs(graph, served: list[dict]) -> list[str]:
    """The outputs the vendor's model keeps: every output of ``graph`` not in ``served``."""
    gone = {entry["output"] for entry in served}
    return [value.name for value in graph.output if value.name not in gone]


def serve(served: list[dict], inputs: dict) -> dict:
    """Each served output computed from ``inputs`` (input name -> array), as the runtime does."""
    import numpy as np

    found = {}
    for entry in served:
        value = np.asarray(inputs[entry["input"]])
        for step in entry["steps"]:
            if step["op"] == "Cast":
                value = value.astype(step["to"])
            elif step["op"] == "Shape":
                value = np.array(value.shape[step.get("start") or 0 : step.get("end")], dtype=np.int64)
        found[entry["output"]] = (
            value.astype(entry["dtype"]) if entry.get("dtype") else value
        )  # the model's dtype
    return found


def _chain(name: str, inputs: dict, producer: dict) -> tuple[str, list[dict]] | None:
    """(graph input, steps from it to ``name``) where ``name`` is reached from one input by Identity, Cast and
    at most one Shape only; else None."""
    steps: list[dict] = []
    while name not in inputs:
        node = producer.get(name)
        data = [v for v in node.input if v] if node is not None else []
        if node is None or node.domain not in ("", "ai.onnx") or len(data) != 1:
            return None
        attributes = {a.name: a for a in node.attribute}
        if node.op_type == "Identity":
            steps.append({"op": "Identity"})
        elif node.op_type == "Cast" and attributes["to"].i in _DTYPES:
            steps.append({"op": "Cast", "to": _DTYPES[attributes["to"].i]})
        elif node.op_type == "Shape":
            start = attributes["start"].i if "start" in attributes else 0
            end = attributes["end"].i if "end" in attributes else None
            steps.append({"op": "Shape", "start": start, "end": end})
        else:
            return None
        name = data[0]
    steps.reverse()
    if sum(step["op"] == "Shape" for step in steps) > 1:
        return None
    return name, steps


def _dtype(value, steps: list[dict]) -> str:
    dtype = _DTYPES.get(value.type.tensor_type.elem_type, "float32")
    for step in steps:
        dtype = step["to"] if step["op"] == "Cast" else "int64" if step["op"] == "Shape" else dtype
    return dtype
