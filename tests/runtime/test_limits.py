"""A request past the model's own limit (a 16-row position table: seq <= 16) is refused as such, naming the
limit, on every backend and before any is called; one past the largest bucket but within the limit is told to
re-specialise. The limit is found when the bundle is compiled and travels in its manifest."""

from __future__ import annotations

import numpy as np
import pytest

from flexdsa_runtime import Runtime, ShapeRefused
from tests.runtime.conftest import assert_close, original_outputs
from tests.runtime.tiny_models import POSITIONED, model_bytes


def _feeds(seq: int) -> dict:
    return {"x": np.random.default_rng(seq).standard_normal((1, seq, 4)).astype(np.float32)}


@pytest.mark.parametrize(
    ("target", "options"),
    [("cpu-ort", {}), ("rockchip-rk3588", {"shape_buckets": {"batch": [1], "seq": [8, 16]}})],
    ids=["cpu-ort (seq dynamic)", "rk3588 (seq buckets up to the limit)"],
)
def test_past_the_models_limit_is_refused_naming_it(make_bundle, target, options):
    folder = make_bundle(model_bytes(POSITIONED), target, **options)
    with Runtime.open(folder, preload=False) as runtime:
        assert runtime.bundle.runtime["limits"] == {"seq": 16}
        with pytest.raises(ShapeRefused) as refused:
            runtime.run(_feeds(17))
        assert runtime.backend_names() == {}  # refused before any backend was loaded or called
        message = str(refused.value)
        assert "seq = 17 (this model takes at most 16)" in message and "Re-specialise" not in message
        assert refused.value.details["limits"] == {"seq": 16}
        assert_close(original_outputs(model_bytes(POSITIONED), _feeds(16)), runtime.run(_feeds(16)))


def test_past_the_largest_bucket_within_the_limit_is_told_to_re_specialise(make_bundle):
    folder = make_bundle(model_bytes(POSITIONED), "rockchip-rk3588", shape_buckets={"batch": [1], "seq": [8]})
    with Runtime.open(folder, preload=False) as runtime:
        with pytest.raises(ShapeRefused) as refused:
            runtime.run(_feeds(12))
        assert "largest bucket 8; the model takes up to 16" in str(refused.value)
        assert "Re-specialise" in str(refused.value)
