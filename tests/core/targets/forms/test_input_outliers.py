"""``input_outlier_split``: a projection whose input carries a channel far above the rest (a post-norm encoder's
LayerNorm output) takes that channel as equal pieces beside the bulk, with the original's outputs (ONNX Runtime,
fp32 up to rounding), and what reaches the int8 projection no longer spans the outlier; projections of one input
share the pieces; projections with no such channel and narrow inputs are left alone, each with its reason."""

import numpy as np
import onnx
import onnx_ir as ir

from flexdsa_core.targets.forms import discover_forms, observe
from tests.core.fusions.harness import run

FORM = discover_forms()["input_outlier_split"]
WIDTH, OUT, ROWS = 96, 64, 8


def _norm_projection(outlier: float = 20.0, width: int = WIDTH) -> ir.Model:
    """x → LayerNormalization (channel 7 scaled ``outlier``x by its gamma) → MatMul(W) + b, and a second
    projection (no outlier on its input) → Add."""
    rng = np.random.default_rng(0)
    gamma = np.ones(width, np.float32)
    gamma[7] = outlier
    helper = onnx.helper
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["n"], name="norm", axis=-1),
        helper.make_node("MatMul", ["n", "w"], ["p"], name="up/MatMul"),
        helper.make_node("Add", ["p", "b"], ["y"], name="up/Add"),
        helper.make_node("MatMul", ["y", "w2"], ["q"], name="next/MatMul"),
        helper.make_node("Add", ["b2", "q"], ["out"], name="next/Add"),
    ]
    constants = {"gamma": gamma, "beta": np.zeros(width, np.float32),
                 "w": rng.standard_normal((width, OUT)).astype(np.float32) * 0.2,
                 "b": rng.standard_normal(OUT).astype(np.float32) * 0.1,
                 "w2": rng.standard_normal((OUT, OUT)).astype(np.float32) * 0.2,
                 "b2": rng.standard_normal(OUT).astype(np.float32) * 0.1}  # fmt: skip
    graph = helper.make_graph(
        nodes, "norm_projection", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, ROWS, width])],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [1, ROWS, OUT])],
        [onnx.numpy_helper.from_array(v, k) for k, v in constants.items()],
    )  # fmt: skip
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(proto)
    return ir.from_proto(onnx.shape_inference.infer_shapes(proto))


def _samples(count=8, seed=0, width=WIDTH):
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((1, ROWS, width)).astype(np.float32)} for _ in range(count)]


def test_an_outlier_input_channel_is_split_into_pieces_and_the_outputs_hold():
    before = _norm_projection()
    model = before.clone()
    applied = FORM.apply(model, _samples())
    assert list(applied.sites) == ["up/Add"], applied.refused
    measured = applied.measured["channels"]["up/Add"]
    # Channel 7 stands ~20x above the median: cut into as many pieces as it takes to stay within the bulk's peak.
    assert list(measured["channels"]) == [7] and measured["channels"][7] >= 4
    ratio = measured["peak_over_median"] / measured["bulk_peak_over_median"]  # both rounded to 0.1 here
    assert ratio - 1.5 <= measured["channels"][7] <= ratio + 1.5
    assert applied.measured["channels"]["next/Add"]["channels"] == {}  # its input has no outlier: kept
    # The mask and the picking are the form's float16 nodes; the projection itself stays int8.
    assert sorted(applied.float16) == [f"up/Add/input_split/float16_{role}" for role in ("mask", "pick")]
    onnx.checker.check_model(ir.to_proto(model))
    weights = {v.name: v.const_value.numpy() for v in model.graph.initializers.values()}
    widened = weights["up/Add/weight"]
    assert widened.shape == (WIDTH + measured["channels"][7], OUT)  # the weights' values are kept, row 7 repeated
    np.testing.assert_array_equal(widened[WIDTH:], np.repeat(widened[7:8], measured["channels"][7], axis=0))
    for sample in _samples(seed=1):
        want, got = run(ir.to_proto(before), sample)[0], run(ir.to_proto(model), sample)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # What the int8 projection reads (the bulk beside the pieces) no longer spans the outlier channel.
    concat = [n.outputs[0].name for n in model.graph if n.name.endswith("/input_split/concat")]
    peak = max(float(np.abs(o[concat[0]]).max()) for o in observe(model, concat, _samples()))
    original = max(float(np.abs(o["n"]).max()) for o in observe(before, ["n"], _samples()))
    assert peak * 3 < original


def test_projections_of_one_input_share_its_pieces():
    """Two projections of the same outlier input (an attention's query and key) read one mask, one set of
    pieces and one Concat; each keeps its own widened weights."""
    model = _norm_projection()
    helper = onnx.helper
    proto = ir.to_proto(model)
    rng = np.random.default_rng(1)
    proto.graph.initializer.extend([
        onnx.numpy_helper.from_array(rng.standard_normal((WIDTH, OUT)).astype(np.float32), "wk"),
        onnx.numpy_helper.from_array(rng.standard_normal(OUT).astype(np.float32), "bk"),
    ])  # fmt: skip
    proto.graph.node.extend([
        helper.make_node("MatMul", ["n", "wk"], ["pk"], name="key/MatMul"),
        helper.make_node("Add", ["pk", "bk"], ["k"], name="key/Add"),
        helper.make_node("Add", ["out", "k"], ["both"], name="sum"),
    ])  # fmt: skip
    proto.graph.output[0].name = "both"
    before = ir.from_proto(onnx.shape_inference.infer_shapes(proto))
    model = before.clone()
    applied = FORM.apply(model, _samples())
    assert sorted(applied.sites) == ["key/Add", "up/Add"], applied.refused
    assert [n.op_type for n in model.graph if "/input_split/" in n.name].count("Concat") == 1
    assert len(applied.float16) == 2  # one mask, one picking, for both
    onnx.checker.check_model(ir.to_proto(model))
    for sample in _samples(seed=2):
        want, got = run(ir.to_proto(before), sample)[0], run(ir.to_proto(model), sample)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_without_an_outlier_nothing_is_split():
    model = _norm_projection(outlier=1.0)
    applied = FORM.apply(model, _samples())
    assert not applied.sites
    assert [n.op_type for n in model.graph].count("MatMul") == 2


def test_a_narrow_input_is_left_alone_with_its_reason():
    model = _norm_projection(width=16)
    applied = FORM.apply(model, _samples(width=16))
    assert not applied.sites
    assert any("under 64" in reason for reason in applied.refused), applied.refused


def test_a_normalised_input_that_stands_out_less_splits_its_one_largest_channel():
    """Between ``NORM_SITE_FACTOR`` and ``SITE_FACTOR`` (an attention's input in a post-norm encoder: channel 99
    of MiniLM-L6 at 4-6x), a normalisation's output gives its largest channel alone; an input that is no
    normalisation's output and stands out as little is left whole."""
    from flexdsa_core.targets.forms import input_outliers

    before = _norm_projection(outlier=5.0)
    model = before.clone()
    applied = FORM.apply(model, _samples())
    measured = applied.measured["channels"]["up/Add"]
    assert input_outliers.NORM_SITE_FACTOR <= measured["peak_over_median"] < input_outliers.SITE_FACTOR, measured
    assert list(applied.sites) == ["up/Add"] and list(measured["channels"]) == [7], applied.measured
    for sample in _samples(seed=3):
        want, got = run(ir.to_proto(before), sample)[0], run(ir.to_proto(model), sample)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # The same channel fed by a Mul instead of the norm (no normalisation's output): whole.
    proto = ir.to_proto(_norm_projection(outlier=5.0))
    norm = next(n for n in proto.graph.node if n.op_type == "LayerNormalization")
    norm.output[0] = "n_raw"
    proto.graph.node.insert(1, onnx.helper.make_node("Mul", ["n_raw", "gamma"], ["n"], name="scaled"))
    norm.input[1] = "unit_gamma"
    proto.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(WIDTH, np.float32), "unit_gamma"))
    plain = ir.from_proto(onnx.shape_inference.infer_shapes(proto))
    applied = FORM.apply(plain, _samples())
    assert not applied.sites and applied.measured["channels"]["up/Add"]["channels"] == {}, applied.measured
