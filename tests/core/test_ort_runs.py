"""Validation compares every output with per-dtype tolerances, and builds inputs a real model accepts."""

import numpy as np
import onnx

from flexdsa_core.ort_runs import _check_output, compare, make_inputs

IDENTITY = onnx.parser.parse_model(
    """
    <ir_version: 9, opset_import: ["" : 17]>
    g (float[batch, 4] x) => (float[batch, 4] y) { y = Relu(x) }
    """
)
SHIFTED = onnx.parser.parse_model(
    """
    <ir_version: 9, opset_import: ["" : 17]>
    g (float[batch, 4] x) => (float[batch, 4] y) {
        c = Constant <value = float {0.01}> ()
        r = Relu(x)
        y = Add(r, c)
    }
    """
)


def test_float_outputs_within_tolerance_pass_and_beyond_fail():
    want = np.ones((2, 3), np.float32)
    assert _check_output("y", want, want + 1e-6, {}).ok
    bad = _check_output("y", want, want + 0.1, {})
    assert not bad.ok and abs(bad.max_abs - 0.1) < 1e-6


def test_integer_outputs_must_match_exactly_and_shapes_must_agree():
    want = np.arange(6, dtype=np.int64).reshape(2, 3)
    off_by_one = want.copy()
    off_by_one[0, 0] += 1
    assert "1 of 6 values differ" in _check_output("ids", want, off_by_one, {}).detail
    assert "shape" in _check_output("ids", want, want.reshape(3, 2), {}).detail


def test_nan_where_the_original_has_none_fails():
    want = np.zeros(3, np.float32)
    got = want.copy()
    got[1] = np.nan
    assert not _check_output("y", want, got, {}).ok


def test_compare_names_the_output_that_differs():
    feeds = make_inputs(IDENTITY, seed=3)
    same = compare(IDENTITY.SerializeToString(), IDENTITY.SerializeToString(), feeds)
    assert same.ok and same.input_shapes == {"x": [2, 4]}
    differs = compare(IDENTITY.SerializeToString(), SHIFTED.SerializeToString(), feeds)
    assert not differs.ok and "output 'y'" in differs.describe_failure()
    loose = compare(
        IDENTITY.SerializeToString(), SHIFTED.SerializeToString(), feeds, tolerances={"float32": (0.02, 0)}
    )
    assert loose.ok


def test_token_ids_stay_inside_the_embedding_table():
    model = onnx.parser.parse_model(
        """
        <ir_version: 9, opset_import: ["" : 17]>
        g (int64[batch, seq] input_ids) => (float[batch, seq, 2] y)
        <float[5, 2] table = {0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0}> {
            y = Gather(table, input_ids)
        }
        """
    )
    ids = make_inputs(model, seed=0, dims={"seq": 64})["input_ids"]
    assert ids.shape == (2, 64) and ids.min() >= 0 and ids.max() < 5
