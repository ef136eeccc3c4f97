"""User mistakes refused before any work, with one clear message: unknown rule names (one registry of
every switchable name) and shape buckets the model cannot run; the CLI says so in one line."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper, numpy_helper
from typer.testing import CliRunner

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.cli import app
from flexdsa_core.errors import InvalidOptionsError
from flexdsa_core.preflight import check_request, model_limits, switchable_names
from flexdsa_core.serialized import weightless_proto
from flexdsa_core.shape_tracker import ShapeTracker
from flexdsa_core.targets import load_target


def positions_model(positions: int = 64) -> bytes:
    """x:[batch, seq, 4] + a learned position table sliced to seq rows: runs only for seq <= positions."""
    table = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((positions, 4)).astype(np.float32), "table"
    )
    consts = [
        numpy_helper.from_array(np.array(v, np.int64), n)
        for n, v in [("one", 1), ("zero1", [0]), ("axes", [0])]
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "one"], ["seq"], axis=0),
        helper.make_node("Unsqueeze", ["seq", "axes"], ["seq1"]),
        helper.make_node("Slice", ["table", "zero1", "seq1", "axes"], ["pos"]),
        helper.make_node("Add", ["x", "pos"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "positions",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 4])],
        [table, *consts],
    )  # fmt: skip
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8
    ).SerializeToString()


def test_one_registry_lists_passes_fusions_and_target_rewrites_without_an_optimizer():
    names = switchable_names("cpu-ort")
    assert "partial_shape_folding" in names["passes"] and "dead_code" in names["passes"]
    assert "layer_norm" in names["fusions"] and "weighted_sum" in names["fusions"]
    assert names["target"] == ["hold_switched_off", "pin_residual_sum", "ort_layout"]
    assert FlexDSAOptimizer("cpu-ort").switchable_rewrites() == names


def test_unknown_rule_names_are_refused_before_any_work():
    with pytest.raises(InvalidOptionsError, match="unknown rewrites: layer_nrom") as caught:
        FlexDSAOptimizer("cpu-ort").optimize(
            positions_model(), OptimizeOptions(disabled_rules=["layer_nrom"])
        )
    assert caught.value.details == {"unknown_rules": ["layer_nrom"]}
    assert "partial_shape_folding" in caught.value.message  # the known names are listed


def test_a_bucket_the_model_cannot_run_is_refused_naming_it():
    options = OptimizeOptions(shape_buckets={"seq": [32, 128]})
    with pytest.raises(InvalidOptionsError, match=r"shape bucket 'seq128' \(seq=128\) cannot run") as caught:
        check_request(positions_model(), options, load_target("cpu-ort"))
    assert (
        caught.value.details["bucket"] == "seq128"
        and "Incompatible dimensions" in caught.value.details["reason"]
    )
    with pytest.raises(InvalidOptionsError, match="seq128"):
        FlexDSAOptimizer("cpu-ort").optimize(positions_model(), options)


def test_the_refusal_names_the_models_limit_the_same_way_on_every_target():
    # The same mistake, one message: on cpu-ort and on a static part alike, naming the position table's length.
    for target in ("cpu-ort", "rockchip-rk3588"):
        options = OptimizeOptions(shape_buckets={"seq": [512]})
        with pytest.raises(InvalidOptionsError, match=r"this model takes at most 64 positions .*seq <= 64") as caught:
            check_request(positions_model(), options, load_target(target))
        assert caught.value.details["limit"] == {"dim": "seq", "max": 64}


def test_default_buckets_adapt_to_the_model_on_a_static_part():
    # rockchip's default seq 128 is longer than this model's 64 positions: the default is capped, not refused.
    result = FlexDSAOptimizer("rockchip-rk3588").optimize(positions_model(), OptimizeOptions(measure_latency=False))
    assert [b.name for b in result.buckets] == ["batch1_seq64"]
    seq = result.report["shapes"]["plan"]["dims"]["seq"]
    assert seq["value"] == 64 and "default [128] changed" in seq["why"]
    assert result.report["validation"]["ok"]


def test_buckets_the_model_can_run_pass_and_compile():
    options = OptimizeOptions(shape_buckets={"seq": [16, 64]}, measure_latency=False)
    check_request(positions_model(), options, load_target("cpu-ort"))
    result = FlexDSAOptimizer("cpu-ort").optimize(positions_model(), options)
    assert [b.name for b in result.buckets] == ["seq16", "seq64"] and result.report["validation"]["ok"]


def test_cli_says_what_is_wrong_in_one_line(tmp_path):
    model = tmp_path / "positions.onnx"
    model.write_bytes(positions_model())
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"shape_buckets": {"seq": [128]}}))
    result = CliRunner().invoke(
        app, ["optimize", str(model), "--spec", str(spec), "-o", str(tmp_path / "out"), "-q"]
    )
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert "Traceback" not in result.output
    assert lines[0].startswith("error (invalid_options): shape bucket 'seq128' (seq=128) cannot run"), (
        result.output
    )
    assert len(" ".join(lines)) < 400


def _as_constant_node(model: bytes, name: str) -> bytes:
    """``model`` with initializer ``name`` written as a ``Constant`` node instead (as paddle2onnx writes weights)."""
    proto = onnx.load_from_string(model)
    tensor = next(t for t in proto.graph.initializer if t.name == name)
    kept = [t for t in proto.graph.initializer if t.name != name]
    proto.graph.ClearField("initializer")
    proto.graph.initializer.extend(kept)
    proto.graph.node.insert(0, helper.make_node("Constant", [], [name], value=tensor))
    return proto.SerializeToString()


@pytest.mark.parametrize("held_as", ["initializer", "Constant node"])
def test_the_limit_is_found_without_the_weights_however_they_are_held(held_as):
    """A 4,096-row position table (64 KiB) limits seq to 4,096 whether the exporter wrote it as an initializer
    or as a Constant node; the probe loads see its shape only (a graph input), never its values."""
    model = positions_model(4096)
    if held_as == "Constant node":
        model = _as_constant_node(model, "table")
    tracker = ShapeTracker(ir.from_proto(onnx.load_from_string(model)))
    tracker.infer()
    light = weightless_proto(tracker.model, constants=True)
    assert "table" in {value.name for value in light.graph.input}
    assert light.ByteSize() < 4096  # neither an initializer nor a Constant carries the table
    assert model_limits(tracker, [], {"seq": 64}) == {"seq": 4096}


def test_the_dry_loads_fold_shape_arithmetic_but_not_what_the_bound_dims_make_large(tmp_path):
    """A dry load asks about shapes: ONNX Runtime folds the shape arithmetic (``Shape`` of a bound input) and
    small constants, and leaves a ``ConstantOfShape`` over the bound dims unfolded once it would pass
    ``_FOLD_BYTES`` (at ``LIMIT_PROBE`` rows one such fill was the peak of a small model's whole job)."""
    import onnxruntime as ort

    from flexdsa_core.preflight import _FOLD_BYTES, _dry_load_options

    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["shape"]), helper.make_node("ConstantOfShape", ["shape"], ["fill"]),
         helper.make_node("Add", ["x", "fill"], ["y"])],  # fmt: skip
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", 16])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    folded = {}
    for rows in (8, 2 * _FOLD_BYTES // (16 * 4)):  # 512 bytes, then twice the limit
        bound = onnx.ModelProto()
        bound.CopyFrom(model)
        bound.graph.input[0].type.tensor_type.shape.dim[0].dim_value = rows
        options = _dry_load_options()
        options.optimized_model_filepath = str(tmp_path / f"{rows}.onnx")
        ort.InferenceSession(bound.SerializeToString(), options, providers=["CPUExecutionProvider"])
        folded[rows] = "ConstantOfShape" not in {n.op_type for n in onnx.load(options.optimized_model_filepath).graph.node}
    assert list(folded.values()) == [True, False], folded
