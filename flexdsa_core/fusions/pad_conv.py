"""A zero, constant-mode Pad of a Conv's spatial axes folded into the Conv's ``pads`` (exact).

Exporters of TensorFlow-style "SAME" padding write it as an explicit Pad before the Conv (EfficientNet-
PyTorch's ``Conv2dStaticSamePadding``: 17 on EfficientNet-Lite0). ONNX Runtime folds such a Pad into the
Conv when it loads a float model, but the QDQ quantiser sees the graph as we write it: each Pad got a
Quantize/Dequantize pair of its own and broke the int8 chain between two QLinearConvs. The rewrite is
onnxscript's ``fuse_pad_into_conv_rule``; it runs before the Conv fusions so that they see the Conv alone.
"""

from __future__ import annotations

from onnxscript.rewriter.rules.common import fuse_pad_into_conv_rule

from flexdsa_core.fusions.base import make_rule

RULES = [
    make_rule(
        "pad_conv",
        "A zero constant Pad of the spatial axes folded into the following Conv's pads.",
        ["Conv"],
        [fuse_pad_into_conv_rule],
    ),
]
