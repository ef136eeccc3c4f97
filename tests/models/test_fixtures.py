"""The committed model fixtures are present, valid, run in ONNX Runtime at more than one shape, and still
show the decomposed patterns the fusion rules are tested against (a re-export that fused them away
would make the model tests pass vacuously)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from tests.models import FIXTURES, fixture

pytestmark = pytest.mark.models

# fixture -> ops that must be present (the unfused patterns) / must be absent (fused forms)
PATTERN_OPS = {
    "bert": ({"Erf", "ReduceMean", "Sqrt", "Softmax", "Pow"}, {"LayerNormalization"}),
    "gpt2": ({"Tanh", "ReduceMean", "Where", "Softmax", "Split"}, {"LayerNormalization"}),
    "llama": ({"Sigmoid", "ReduceMean", "Neg", "Softmax", "Expand"}, {"SimplifiedLayerNormalization"}),
    "vit": ({"Conv", "Erf", "ReduceMean", "Concat", "Softmax"}, {"LayerNormalization"}),
    "resnet": ({"Conv", "BatchNormalization", "Relu", "MaxPool", "GlobalAveragePool"}, set()),
    "mobilenetv2": ({"Conv", "BatchNormalization", "Clip"}, set()),
}
SHAPES = [{"batch": 1, "seq": 16}, {"batch": 2, "seq": 7}]


def _feeds(sess: ort.InferenceSession, dims: dict[str, int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    feeds = {}
    for meta in sess.get_inputs():
        shape = [d if isinstance(d, int) else dims[d] for d in meta.shape]
        if meta.type == "tensor(int64)":
            feeds[meta.name] = (np.ones if "mask" in meta.name else np.zeros)(shape, np.int64)
            if meta.name == "input_ids":
                feeds[meta.name] = rng.integers(0, 100, shape, dtype=np.int64)
        else:
            feeds[meta.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def test_every_fixture_is_listed_and_committed():
    assert set(FIXTURES) == set(PATTERN_OPS)
    for name in FIXTURES:
        assert fixture(name).stat().st_size < 1_000_000, f"{name} fixture grew past 1 MB"


def test_unknown_fixture_names_the_known_ones():
    with pytest.raises(KeyError, match="bert"):
        fixture("no-such-model")


@pytest.mark.parametrize("name", sorted(PATTERN_OPS))
def test_fixture_is_valid_and_keeps_its_patterns(name):
    model = onnx.load(fixture(name))
    onnx.checker.check_model(model, full_check=True)
    ops = Counter(node.op_type for node in model.graph.node)
    present, absent = PATTERN_OPS[name]
    assert present <= set(ops), f"{name} lost {present - set(ops)}"
    assert not absent & set(ops), f"{name} has fused ops {absent & set(ops)}"


@pytest.mark.parametrize("name", sorted(PATTERN_OPS))
def test_fixture_runs_at_two_shapes(name):
    sess = ort.InferenceSession(str(fixture(name)), providers=["CPUExecutionProvider"])
    for dims in SHAPES:
        outputs = sess.run(None, _feeds(sess, dims))
        assert outputs[0].shape[0] == dims["batch"]
        assert all(np.isfinite(out).all() for out in outputs)
