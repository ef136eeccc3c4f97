"""One decision for every dim no bucket sizes (``shape_plan``): the cost model, the memory planner and
validation take the same value for the same dim, and step down the same ladder where a model refuses it."""

from __future__ import annotations

import onnx
import onnx_ir as ir
import pytest

from flexdsa_core.cost_model import CostModel
from flexdsa_core.dims import is_batch_dim
from flexdsa_core.memory_planner import plan_memory
from flexdsa_core.shape_plan import (
    CANDIDATES,
    LOWERED,
    REPRESENTATIVE_BATCH,
    REPRESENTATIVE_DIM,
    lowered,
    open_dim_value,
)
from flexdsa_core.targets import load_target

# Names the cost model's own batch regex and ``dims.is_batch_dim`` once read differently (``BS``: batch to the
# regex only; ``num_batches``: batch to ``is_batch_dim`` only), beside plain ones.
NAMES = ("batch_size", "N", "BS", "num_batches", "seq", "height")


@pytest.mark.parametrize(
    ("name", "axis", "value"),
    [
        ("batch", None, REPRESENTATIVE_BATCH),
        ("N", 2, REPRESENTATIVE_BATCH),  # the name decides wherever it sits
        ("seq", 0, REPRESENTATIVE_DIM),
        ("unk__7", 0, REPRESENTATIVE_BATCH),  # anonymous on axis 0: a batch
        ("unk__7", 1, REPRESENTATIVE_DIM),
        (None, 0, REPRESENTATIVE_BATCH),
        ("x_dim0", None, REPRESENTATIVE_DIM),  # anonymous, and where it sits unknown: not a batch
    ],
)
def test_an_open_dim_takes_one_value(name, axis, value):
    assert open_dim_value(name, axis) == value


def test_a_lowered_size_stands_for_every_dim_but_the_batch():
    assert open_dim_value("seq", 1, size=32) == 32
    assert open_dim_value("batch", 0, size=32) == REPRESENTATIVE_BATCH


def test_lowering_holds_every_dim_but_the_batch_to_the_ceiling():
    assert lowered({"batch": 4, "seq": 128, "width": 16}, 32) == {"batch": 4, "seq": 32, "width": 16}
    assert LOWERED == tuple(sorted(LOWERED, reverse=True)) and max(LOWERED) < REPRESENTATIVE_DIM
    assert CANDIDATES["other"][: len(LOWERED) + 1] == (REPRESENTATIVE_DIM, *LOWERED)


def _model(names: tuple[str, ...]) -> ir.Model:
    dims = ", ".join(names)
    text = f"""
    <ir_version: 10, opset_import: ["" : 21]>
    g (float[{dims}] x) => (float[{dims}] y) {{
        a = Relu(x)
        y = Neg(a)
    }}
    """
    proto = onnx.shape_inference.infer_shapes(onnx.parser.parse_model(text), strict_mode=True)
    return ir.from_proto(proto)


def test_the_cost_model_and_the_memory_plan_size_unplanned_dims_alike():
    model = _model(NAMES)
    costed = CostModel(load_target("cpu-ort"), calibrate=False).input_dims(model)
    planned = plan_memory(model)
    assert costed == planned.dims == {name: open_dim_value(name) for name in NAMES}
    assert planned.assumed_dims == sorted(NAMES)
    assert {name for name, value in costed.items() if value == REPRESENTATIVE_BATCH} == {
        name for name in NAMES if is_batch_dim(name)
    }
