"""``bench.exports``' floors: ONNX Runtime's two sessions of the original, held and once run as the never-slower
check runs them. Running allocates what holding does not (activations, arenas, working buffers), so the run
floor of a model is at least its floor."""

from __future__ import annotations

from bench.exports import baseline_rss, empty_model, ort_floor, ort_run_floor


def test_the_run_floor_runs_the_model_and_sits_above_the_held_floor(tmp_path):
    model = empty_model(tmp_path / "relu.onnx")
    held = ort_floor(model)
    ran = ort_run_floor(model, {"x": [64, 8]})
    assert held is not None and ran is not None
    assert ran >= held["two_sessions_peak_rss_bytes"] > baseline_rss() - 64 * 2**20


def test_a_model_onnx_runtime_cannot_load_has_no_run_floor(tmp_path):
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    assert ort_run_floor(broken, {"x": [1, 8]}) is None
