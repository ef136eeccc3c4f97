"""Bundles for the runtime tests, compiled once per session by the real pipeline (``make_bundle``), and
what the tests compare with: the original model's outputs in ONNX Runtime, within the bundle's tolerances."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from flexdsa_core import FlexDSAOptimizer, RequestSpec
from flexdsa_core.precision import int8_only
from flexdsa_core.targets import load_target
from tests.core.targets._bundle_checks import TOOLCHAIN_ROOT

# The validation tolerances of float32 outputs (flexdsa_core.ort_runs.DEFAULT_TOLERANCES), which the bundle's
# report.json states per output: the runtime's outputs on an unpadded request must meet them too.
FP32 = (1e-4, 1e-3)


@pytest.fixture(scope="session")
def make_bundle(tmp_path_factory):
    """``make_bundle(model, target, toolchain=False, **options) -> folder``: the model (a path or ONNX bytes)
    optimised for ``target`` with the request ``options``; the same request is compiled once per session."""
    root = tmp_path_factory.mktemp("bundles")
    built: dict[str, Path] = {}

    def make(model, target: str, *, toolchain: bool = False, **options) -> Path:
        data = Path(model).read_bytes() if isinstance(model, (str, Path)) else model
        options = {"measure_latency": False, **options}
        if int8_only(load_target(target)):  # the DPU: quantised on seeded inputs by request (numerics only)
            options.setdefault("allow_synthetic_calibration", True)
        key = hashlib.sha256(
            data + json.dumps([target, toolchain, options], sort_keys=True).encode()
        ).hexdigest()[:16]
        if key not in built:
            request = RequestSpec.model_validate({"target": target, **options})
            optimizer = FlexDSAOptimizer(
                request.target_spec(), toolchain_root=TOOLCHAIN_ROOT if toolchain else None
            )
            result = optimizer.optimize(data, request.options())
            folder = root / key
            result.write(folder)
            built[key] = folder
        return built[key]

    return make


def original_outputs(model, feeds: dict) -> dict[str, np.ndarray]:
    source = str(model) if isinstance(model, Path) else model
    session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds), strict=True))


def assert_close(want: dict, got: dict, tolerance=FP32) -> None:
    atol, rtol = tolerance
    assert set(got) == set(want)
    for name, value in want.items():
        assert got[name].shape == value.shape, (name, got[name].shape, value.shape)
        np.testing.assert_allclose(got[name], value, atol=atol, rtol=rtol, err_msg=name)


def cosine(want: np.ndarray, got: np.ndarray) -> float:
    a, b = np.ravel(want).astype(np.float64), np.ravel(got).astype(np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def text_feeds(model_inputs: list[str], batch: int, seq: int, seed: int = 0, vocab: int = 100) -> dict:
    """Token ids, an all-ones attention mask and zero token types, as a tokenizer gives for unpadded text."""
    rng = np.random.default_rng(seed + 1000 * batch + seq)
    feeds = {}
    for name in model_inputs:
        if "mask" in name:
            feeds[name] = np.ones((batch, seq), np.int64)
        elif "type" in name:
            feeds[name] = np.zeros((batch, seq), np.int64)
        else:
            feeds[name] = rng.integers(1, vocab, (batch, seq)).astype(np.int64)
    return feeds


def input_names(model) -> list[str]:
    source = str(model) if isinstance(model, Path) else model
    return [i.name for i in ort.InferenceSession(source, providers=["CPUExecutionProvider"]).get_inputs()]
