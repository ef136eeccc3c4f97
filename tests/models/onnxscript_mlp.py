"""A transformer MLP block written in onnxscript (``@script``, opset 18), for ``real_exports.onnxscript_mlp``.

Its own module, without ``from __future__ import annotations``: onnxscript reads the type annotations
(``FLOAT["batch_size", "sequence_length", 32]``) as values from the module's globals.
"""

import numpy as np
import onnx
from onnxscript import FLOAT, script
from onnxscript import opset18 as op

# ruff: noqa: F821 - the quoted dim names in the annotations are onnxscript shapes, not forward references


@script()
def mlp(
    hidden_states: FLOAT["batch_size", "sequence_length", 32],
    ln_w: FLOAT[32],
    ln_b: FLOAT[32],
    w1: FLOAT[32, 64],
    b1: FLOAT[64],
    w2: FLOAT[64, 32],
) -> FLOAT["batch_size", "sequence_length", 32]:
    normed = op.LayerNormalization(hidden_states, ln_w, ln_b, axis=-1, epsilon=1e-5)
    h = op.Add(op.MatMul(normed, w1), b1)
    gelu = h * 0.5 * (op.Erf(h / 1.4142135) + 1.0)
    last_hidden_state = hidden_states + op.MatMul(gelu, w2)
    return last_hidden_state


def build() -> bytes:
    """The model with its parameters made initializers (seeded values)."""
    model = mlp.to_model_proto()
    rng = np.random.default_rng(3)
    weights = {
        "ln_w": 1 + rng.standard_normal(32) / 10,
        "ln_b": rng.standard_normal(32) / 10,
        "w1": rng.standard_normal((32, 64)) / np.sqrt(32),
        "b1": rng.standard_normal(64) / 10,
        "w2": rng.standard_normal((64, 32)) / np.sqrt(64),
    }
    kept = [value for value in model.graph.input if value.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(
        onnx.numpy_helper.from_array(array.astype(np.float32), name) for name, array in weights.items()
    )
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    return model.SerializeToString()
