"""Small real-architecture ONNX fixtures, built from ``architectures.py`` by ``build_fixtures.py``.

``FIXTURES`` maps a fixture name to its committed file; ``fixture(name)`` returns the path or says how
to rebuild a missing one. Importing this package needs neither torch nor onnx.
"""

from __future__ import annotations

from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parent

# name -> what it exercises (kept in step with README.md and architectures.ARCHITECTURES)
DESCRIPTIONS: dict[str, str] = {
    "bert": "BERT encoder: embeddings, post-LN, erf GELU, attention with additive mask, 2 layers, hidden 64",
    "gpt2": "GPT-2 decoder: pre-LN, causal mask, tanh GELU (gelu_new), tied LM head, 2 layers, hidden 64",
    "llama": "Llama decoder: RMSNorm, rotary embedding, grouped-query attention, SiLU-gated MLP, 2 layers",
    "vit": "ViT: patch Conv, class token, pre-LN encoder, erf GELU, 2 layers, 32x32 input",
    "resnet": "ResNet: BasicBlocks with un-folded BatchNorm (eval), 4 stages, 64x64 input",
    "mobilenetv2": "MobileNetV2: inverted residuals, depthwise Conv, ReLU6 (Clip), BatchNorm, 64x64 input",
}

FIXTURES: dict[str, Path] = {name: MODELS_DIR / f"{name}.onnx" for name in DESCRIPTIONS}


def fixture(name: str) -> Path:
    """Path of the committed fixture ``name``; raises with the fix when it is unknown or missing."""
    if name not in FIXTURES:
        raise KeyError(f"unknown model fixture {name!r}; known: {', '.join(FIXTURES)}")
    path = FIXTURES[name]
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing; rebuild it with `python tests/models/build_fixtures.py {name}`"
        )
    return path


__all__ = ["DESCRIPTIONS", "FIXTURES", "MODELS_DIR", "fixture"]
