"""The one shape of a generic-pass test: ONNX text in, apply only that pass (to a fixed point), assert the
op-type list, run the ONNX checker, and compare numerics with ONNX Runtime against the original."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from flexdsa_core.options import OptimizeOptions
from flexdsa_core.passes import generic_passes, run_passes


def parse(text: str, *, infer_shapes: bool = True) -> onnx.ModelProto:
    """The model from ONNX text, with shapes inferred as stage 2 (the Shape Tracker) leaves them."""
    model = onnx.parser.parse_model(text)
    onnx.checker.check_model(model, full_check=True)
    if infer_shapes:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    return model


def the_pass(name: str, **options):
    for candidate in generic_passes(OptimizeOptions(**options)):
        if candidate.name == name:
            return candidate
    raise KeyError(name)


def apply_pass(name: str, model: onnx.ModelProto, **options) -> tuple[onnx.ModelProto, bool]:
    ir_model = ir.serde.deserialize_model(model)
    records = run_passes(ir_model, [the_pass(name, **options)])
    return ir.serde.serialize_model(ir_model), any(record.modified for record in records)


def op_types(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    initializers = {init.name for init in model.graph.initializer}
    feeds = {}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        shape = [d.dim_value if d.dim_value > 0 else 3 for d in tensor_type.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        if dtype == np.bool_:
            feeds[value.name] = rng.integers(0, 2, size=shape).astype(bool)
        elif np.issubdtype(dtype, np.integer):
            feeds[value.name] = rng.integers(
                -8 if np.issubdtype(dtype, np.signedinteger) else 0, 8, size=shape
            ).astype(dtype)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(None, feeds), strict=True))


def assert_same_outputs(
    original: onnx.ModelProto, optimized: onnx.ModelProto, *, atol=0.0, rtol=0.0, feeds=None
):
    assert [o.name for o in optimized.graph.output] == [o.name for o in original.graph.output]
    feeds = feeds or random_inputs(original)
    want, got = run(original, feeds), run(optimized, feeds)
    for name, value in want.items():
        assert got[name].shape == value.shape, name
        assert got[name].dtype == value.dtype, name
        np.testing.assert_allclose(got[name], value, atol=atol, rtol=rtol, err_msg=name)


def assert_rewrites(name: str, text: str, expected_ops: list[str], *, atol=0.0, rtol=0.0, **options):
    """The pass changes the graph to exactly ``expected_ops``; valid; same outputs (names, values)."""
    original = parse(text)
    optimized, modified = apply_pass(name, original, **options)
    assert modified, f"pass {name} did not modify the graph"
    assert op_types(optimized) == expected_ops, op_types(optimized)
    onnx.checker.check_model(optimized, full_check=True)
    assert_same_outputs(original, optimized, atol=atol, rtol=rtol)
    return optimized


def assert_unchanged(name: str, text: str, **options):
    """The pass must not fire: same ops, same outputs."""
    original = parse(text)
    optimized, modified = apply_pass(name, original, **options)
    assert op_types(optimized) == op_types(original)
    assert not modified, f"pass {name} reported a change where it must not fire"
    onnx.checker.check_model(optimized, full_check=True)
    assert_same_outputs(original, optimized)
    return optimized
