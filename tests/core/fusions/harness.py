"""The one shape of a fusion-rule test: ONNX text in, apply only that rule, assert the
op-type list, run the ONNX checker, and compare numerics with ONNX Runtime against the unfused graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from flexdsa_core.fusions import discover_rules


def rule(name: str):
    for candidate in discover_rules():
        if candidate.name == name:
            return candidate
    raise KeyError(f"no fusion rule named {name!r}")


def parse(text: str) -> onnx.ModelProto:
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model)
    return model


def _random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    initializer_names = {init.name for init in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializer_names:
            continue
        tensor_type = value.type.tensor_type
        shape = [d.dim_value if d.dim_value > 0 else 2 for d in tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if np.issubdtype(dtype, np.integer):
            feeds[value.name] = rng.integers(0, 8, size=shape).astype(dtype)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def apply_rule(name: str, model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    ir_model = ir.serde.deserialize_model(model)
    count = rule(name).apply(ir_model)
    return ir.serde.serialize_model(ir_model), count


def op_types(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


def assert_fuses(name: str, text: str, expected_ops: list[str], *, atol=1e-5, rtol=1e-4, feeds=None):
    """The rule fires, the graph becomes exactly ``expected_ops``, is valid, and computes the same."""
    original = parse(text)
    fused, count = apply_rule(name, original)
    assert count >= 1, f"rule {name} did not fire"
    assert op_types(fused) == expected_ops
    onnx.checker.check_model(fused)
    feeds = feeds or _random_inputs(original)
    for want, got in zip(run(original, feeds), run(fused, feeds), strict=True):
        np.testing.assert_allclose(got, want, atol=atol, rtol=rtol)
    return fused


def assert_not_fused(name: str, text: str):
    """The rule must not fire: the graph comes back with the same ops."""
    original = parse(text)
    fused, count = apply_rule(name, original)
    assert count == 0, f"rule {name} fired where it must not"
    assert op_types(fused) == op_types(original)
