"""Layers a QDQ model keeps in float stay float when ONNX Runtime loads it.

ONNX Runtime's ``WeightBiasQuantization`` transformer (ORT_ENABLE_BASIC and above) takes a float ``Conv``,
``ConvTranspose`` or ``Gemm`` whose input comes from a per-tensor ``DequantizeLinear`` and whose output
reaches a ``QuantizeLinear`` (through Relu or Clip at most), and quantises its float weight to int8 **per
tensor** and its bias to int32, so that the group fuses into a QLinear kernel. A layer the quantiser left
out of int8 on purpose, a sensitive one or one measured slower in int8, is then quantised after all, in a
coarser form than the per-channel int8 it was judged too inaccurate in. On EfficientNet-Lite0 with its 16
depthwise convolutions kept float, top-1 agreement on 85 held-out photo crops fell from 0.871 (the graph as
written, ORT_DISABLE_ALL) to 0.565 at ORT_ENABLE_ALL; per-channel weights of a depthwise layer span
orders of magnitude that one scale cannot.

``keep_float_layers_float`` gives each such layer a ``DequantizeLinear`` of its own whose scale and zero point
are the same values repeated along the channel axis (axis 1): the same numbers, but not per-tensor, so the
transformer leaves the layer alone. The int8 neighbours keep the per-tensor one and fuse as before.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["keep_float_layers_float"]

_WEIGHT_OPS = ("Conv", "ConvTranspose", "Gemm")
# Per-axis DequantizeLinear is ONNX opset 13.
_MIN_OPSET = 13


def _attribute(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((attr.i for attr in node.attribute if attr.name == name), default)


def _input_channels(node: onnx.NodeProto, weight: onnx.TensorProto) -> int | None:
    """The size of axis 1 of the layer's input: what a per-axis scale on it must have."""
    dims = list(weight.dims)
    if node.op_type == "Conv" and len(dims) >= 3:
        return dims[1] * _attribute(node, "group", 1)
    if node.op_type == "ConvTranspose" and len(dims) >= 3:
        return dims[0]
    if node.op_type == "Gemm" and len(dims) == 2 and not _attribute(node, "transA", 0):
        return dims[1] if _attribute(node, "transB", 0) else dims[0]
    return None


def keep_float_layers_float(model: onnx.ModelProto) -> int:
    """Give every float weight layer fed by a per-tensor DequantizeLinear its own per-axis one, in place;
    returns how many layers were given one."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset < _MIN_OPSET:
        return 0
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    producers = {name: node for node in graph.node for name in node.output}
    taken = {name for node in graph.node for name in (*node.input, *node.output)} | set(initializers)
    nodes: list[onnx.NodeProto] = []
    guarded = 0
    for node in graph.node:
        weight = (
            initializers.get(node.input[1]) if node.op_type in _WEIGHT_OPS and len(node.input) > 1 else None
        )
        source = producers.get(node.input[0]) if weight is not None else None
        if (
            source is None
            or source.op_type != "DequantizeLinear"
            or node.domain not in ("", "ai.onnx")
            or weight.data_type != onnx.TensorProto.FLOAT
        ):
            nodes.append(node)
            continue
        scale = initializers.get(source.input[1])
        zero = initializers.get(source.input[2]) if len(source.input) > 2 and source.input[2] else None
        channels = _input_channels(node, weight)
        zero_missing = len(source.input) > 2 and bool(source.input[2]) and zero is None
        if scale is None or int(np.prod(scale.dims)) != 1 or channels is None or zero_missing:
            nodes.append(node)
            continue
        base, suffix = f"{node.name or node.output[0]}_float_input", 0
        while any(f"{base}{tag}" in taken for tag in ("", "_scale", "_zero_point")):
            suffix += 1
            base = f"{node.name or node.output[0]}_float_input_{suffix}"
        scale_value = numpy_helper.to_array(scale).reshape(())
        inputs = [source.input[0], f"{base}_scale"]
        graph.initializer.append(numpy_helper.from_array(np.full(channels, scale_value), f"{base}_scale"))
        if zero is not None:
            zero_value = numpy_helper.to_array(zero).reshape(())
            graph.initializer.append(
                numpy_helper.from_array(np.full(channels, zero_value), f"{base}_zero_point")
            )
            inputs.append(f"{base}_zero_point")
        taken.update({base, f"{base}_scale", f"{base}_zero_point"})
        nodes.append(helper.make_node("DequantizeLinear", inputs, [base], name=base, axis=1))
        node.input[0] = base
        nodes.append(node)
        guarded += 1
    if guarded:
        read = {name for node in nodes for name in node.input} | {output.name for output in graph.output}
        # A per-tensor DequantizeLinear that only the float layer read is dropped, not left running.
        nodes = [
            n for n in nodes if n.op_type != "DequantizeLinear" or any(name in read for name in n.output)
        ]
        del graph.node[:]
        graph.node.extend(nodes)
    return guarded
