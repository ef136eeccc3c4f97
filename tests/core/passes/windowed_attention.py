"""A windowed-attention block (Swin-style) built with ``onnx.helper``, the way the TorchScript exporter
writes it: every Reshape target is shape arithmetic (``Shape -> Gather -> Div/Mul -> Unsqueeze -> Concat``)
over the input's dims, of which only ``batch`` is dynamic. The partial shape folding tests use it.

Per block, on ``x: [batch, H, W, C]`` (window ``w``, ``heads`` heads)::

    windows = Reshape(x, [B, H/w, w, W/w, w, C]) -> Transpose -> Reshape([B * (H/w) * (W/w), w*w, C])
    q, k, v = MatMul(windows, Wq/Wk/Wv) -> Reshape([Shape(q)[0], Shape(q)[1], heads, C/heads]) -> Transpose
    out = Softmax(q @ k^T * scale) @ v -> Transpose -> Reshape([Shape(q)[0], Shape(q)[1], C])
    y = x + Reshape(Transpose(Reshape(out, [B, H/w, W/w, w, w, C])), [B, H, W, C])
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}_{self.count}"

    def node(self, op: str, inputs: list[str], hint: str | None = None, **attrs) -> str:
        out = self.name(hint or op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.name(op), **attrs))
        return out

    def const(self, value, hint: str = "c") -> str:
        # A Constant node per use, as the TorchScript exporter writes them.
        out = self.name(hint)
        tensor = numpy_helper.from_array(np.asarray(value), out + "_value")
        self.nodes.append(helper.make_node("Constant", [], [out], name=self.name("Constant"), value=tensor))
        return out

    def weight(self, array: np.ndarray, hint: str) -> str:
        name = self.name(hint)
        self.initializers.append(numpy_helper.from_array(array.astype(np.float32), name))
        return name

    def dim(self, tensor: str, axis: int) -> str:
        """A scalar: Gather(Shape(tensor), axis)."""
        shape = self.node("Shape", [tensor])
        return self.node("Gather", [shape, self.const(np.int64(axis))], axis=0)

    def unsqueezed(self, scalar: str) -> str:
        return self.node("Unsqueeze", [scalar, self.const(np.array([0], np.int64))])

    def shape_of(self, *parts) -> str:
        """Concat of scalars (tensor names, unsqueezed) and ints (constants)."""
        pieces = [
            self.const(np.array([p], np.int64)) if isinstance(p, int) else self.unsqueezed(p) for p in parts
        ]
        return self.node("Concat", pieces, axis=0)


def windowed_attention_model(
    *,
    height: int = 16,
    width: int = 16,
    channels: int = 16,
    window: int = 4,
    heads: int = 2,
    blocks: int = 2,
    seed: int = 0,
) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    b = _Builder()
    x = "x"
    for _ in range(blocks):
        batch, h, w, c = (b.dim(x, axis) for axis in range(4))
        hw = b.node("Div", [h, b.const(np.int64(window))])
        ww = b.node("Div", [w, b.const(np.int64(window))])
        grid = b.node("Reshape", [x, b.shape_of(batch, hw, window, ww, window, c)])
        grid = b.node("Transpose", [grid], perm=[0, 1, 3, 2, 4, 5])
        windows_per_image = b.node("Mul", [hw, ww])
        all_windows = b.node("Mul", [batch, windows_per_image])
        tokens = b.node("Reshape", [grid, b.shape_of(all_windows, window * window, c)])

        projected = []
        for role in ("q", "k", "v"):
            p = b.node(
                "MatMul", [tokens, b.weight(rng.standard_normal((channels, channels)) * 0.2, "w" + role)]
            )
            rows, length = b.dim(p, 0), b.dim(p, 1)
            split = b.node("Reshape", [p, b.shape_of(rows, length, heads, channels // heads)])
            projected.append(b.node("Transpose", [split], perm=[0, 2, 1, 3]))
        q, k, v = projected
        scores = b.node("MatMul", [q, b.node("Transpose", [k], perm=[0, 1, 3, 2])])
        scores = b.node("Mul", [scores, b.const(np.float32((channels // heads) ** -0.5))])
        attended = b.node("MatMul", [b.node("Softmax", [scores], axis=-1), v])
        attended = b.node("Transpose", [attended], perm=[0, 2, 1, 3])
        rows, length = b.dim(attended, 0), b.dim(attended, 1)
        merged = b.node("Reshape", [attended, b.shape_of(rows, length, c)])

        back = b.node("Reshape", [merged, b.shape_of(batch, hw, ww, window, window, c)])
        back = b.node("Transpose", [back], perm=[0, 1, 3, 2, 4, 5])
        back = b.node("Reshape", [back, b.shape_of(batch, h, w, c)])
        x = b.node("Add", [x, back])
    b.nodes.append(helper.make_node("Identity", [x], ["y"], name="output"))
    graph = helper.make_graph(
        b.nodes,
        "windowed_attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", height, width, channels])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", height, width, channels])],
        b.initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model
