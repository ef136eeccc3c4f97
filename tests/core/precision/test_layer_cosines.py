"""Per-layer cosines of a quantised model's tensors to the fp32 model's (``precision.layer_cosines``): exact
where the graphs agree, below 1 from the layer where they part, and carried into ``precision.layers``."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.precision.layer_cosines import layer_cosines
from tests.core.test_precision import NOT_A_CLASSIFIER, _mlp_calibration, _sensitive_mlp


def test_cosine_is_exact_upstream_and_drops_where_the_weights_differ(tmp_path):
    fp32 = onnx.load_from_string(_sensitive_mlp())
    changed = onnx.ModelProto()
    changed.CopyFrom(fp32)
    for index, init in enumerate(changed.graph.initializer):
        if init.name == "w2":  # the 'widen' layer computes something else from here on
            noisy = numpy_helper.to_array(init).copy()
            noisy[:, 0] *= -1  # the channel that dominates the output flips
            changed.graph.initializer[index].CopyFrom(numpy_helper.from_array(noisy, "w2"))
    onnx.save(fp32, tmp_path / "fp32.onnx")
    onnx.save(changed, tmp_path / "changed.onnx")
    samples = [{"x": np.random.default_rng(i).standard_normal((2, 16)).astype(np.float32)} for i in range(3)]

    found = layer_cosines(tmp_path / "fp32.onnx", tmp_path / "changed.onnx", ["first", "relu", "widen", "nope"], samples)

    assert set(found) == {"first", "relu", "widen"}  # a layer neither graph has is left out
    assert found["first"]["cosine"] == 1.0 and found["relu"]["worst_sample_cosine"] == 1.0
    assert found["widen"]["cosine"] < 0.999
    assert found["widen"]["worst_sample_cosine"] < 0.999
    assert found["widen"]["tensor"] == "wide"


def test_mixed_reports_each_layers_cosine_on_the_held_out_samples():
    result = FlexDSAOptimizer("cpu-ort").optimize(
        _sensitive_mlp(), OptimizeOptions(precision="mixed", accuracy=NOT_A_CLASSIFIER, measure_latency=False),
        calibration=_mlp_calibration(),
    )  # fmt: skip
    precision = result.report["precision"]
    meta = precision["layer_cosines"]
    assert meta["model"] == precision["shipped"] and meta["on"] == "held-out samples" and meta["samples"] > 0
    table = {row["layer"]: row for row in precision["layers"]}
    assert meta["layers"] == sum("cosine" in row for row in table.values()) > 0
    assert table["first"]["precision"] == "int8"
    assert 0.9 < table["first"]["cosine"] < 1.0  # int8 rounding shows, and is small
    for row in table.values():
        assert 0.9 < row["worst_sample_cosine"] <= 1.0 and 0.9 < row["cosine"] <= 1.0
