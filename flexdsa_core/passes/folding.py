"""``constant_folding`` and ``shape_folding``: onnxscript's constant folder, fenced for large models.

Both wrap ``onnxscript.optimizer.fold_constants`` (node-by-node evaluation with incremental shape
inference, which also folds ``Shape``/``Size``/``Gather``-on-shape partially) and differ in what they let
it evaluate:

* ``constant_folding`` folds any node whose constant inputs and (inferred) outputs each stay within
  ``max_fold_bytes``. The sizes are read from shapes before any data is touched, so a >2 GB external-data
  weight is never loaded, and an op that can blow up (Expand, Tile, ConstantOfShape...) with an unknown
  output shape is never evaluated.
* ``shape_folding`` folds only shape arithmetic: small integer tensors in, small integer tensors out. Once
  the input shapes are static, ``Shape → Gather → Unsqueeze → Concat → Reshape`` becomes a Reshape by a
  constant.

The producers a fold leaves unused are removed in the same pass, and ``constant_folding`` also turns
Constant nodes into initializers.
"""

from __future__ import annotations

import math

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import onnxscript.optimizer

from flexdsa_core._libraries import KnownShapesFoldConstantsPass

# Ops whose output can be much larger than their inputs: evaluate only when the output shape is known.
_EXPANDING_OPS = frozenset(
    {"Expand", "Tile", "ConstantOfShape", "Range", "Resize", "Upsample", "Pad", "OneHot", "MatMul", "Gemm",
     "Einsum", "ConvTranspose", "EyeLike", "RandomNormalLike", "RandomUniformLike"}
)  # fmt: skip
_SHAPE_ELEMENTS = 1024  # a shape computation never needs more integers than this
_INTEGER_TYPES = frozenset(
    {ir.DataType.INT64, ir.DataType.INT32, ir.DataType.INT16, ir.DataType.INT8,
     ir.DataType.UINT64, ir.DataType.UINT32, ir.DataType.UINT16, ir.DataType.UINT8, ir.DataType.BOOL}
)  # fmt: skip


def _static_elements(value: ir.Value) -> int | None:
    if value.shape is None or not all(isinstance(dim, int) for dim in value.shape.dims):
        return None
    return math.prod(value.shape.dims)


def _tensor_bytes(value: ir.Value) -> int | None:
    elements = _static_elements(value)
    if elements is None or value.dtype is None:
        return None
    return math.ceil(elements * value.dtype.itemsize)


class _FencedFoldPass(ir.passes.InPlacePass):
    name = ""

    def __init__(self, **fold_options) -> None:
        self._fold_options = fold_options  # onnxscript.optimizer.fold_constants' keyword arguments

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        options = dict(self._fold_options)
        if options.pop("onnx_shape_inference", False):
            # The Shape Tracker inferred the graph before this runs, and the passes sweep it up to 8 times: only
            # a node with an output of unknown shape is inferred again (same graph, about half the time).
            modified = KnownShapesFoldConstantsPass(shape_inference=True, **options)(model).modified
        else:
            modified = onnxscript.optimizer.fold_constants(model, **options).modified
        if modified:
            common_passes.RemoveUnusedNodesPass()(model)
        return ir.passes.PassResult(model, modified)


class ConstantFoldingPass(_FencedFoldPass):
    """Nodes whose inputs are all constant → initializers, within ``max_fold_bytes``; Constant nodes
    (exporter leftovers, coefficients made by other rewrites) → initializers too, since a target holds
    weights, not Constant ops."""

    name = "constant_folding"

    def __init__(self, max_fold_bytes: int) -> None:
        self.max_fold_bytes = max_fold_bytes
        super().__init__(
            onnx_shape_inference=True,
            input_size_limit=max(max_fold_bytes, 1),
            output_size_limit=max(max_fold_bytes, 1),
            should_fold=self._should_fold,
        )

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = super().call(model).modified
        lifted = common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)(model)
        return ir.passes.PassResult(model, modified or lifted.modified)

    def _should_fold(self, node: ir.Node) -> bool | None:
        """False when folding could load or create a tensor above the cap; None defers to onnxscript."""
        for value in node.inputs:
            tensor = value.const_value if value is not None else None
            if tensor is not None and tensor.nbytes > self.max_fold_bytes:
                return False
        for output in node.outputs:
            size = _tensor_bytes(output)
            if size is None and node.op_type in _EXPANDING_OPS:
                return False
            if size is not None and size > self.max_fold_bytes:
                return False
        return None


class ShapeFoldingPass(_FencedFoldPass):
    """Shape computations (small integer tensors) → constants, once input shapes are known."""

    name = "shape_folding"

    def __init__(self) -> None:
        super().__init__(
            onnx_shape_inference=True,
            input_size_limit=_SHAPE_ELEMENTS,
            output_size_limit=_SHAPE_ELEMENTS,
            should_fold=self._should_fold,
        )

    @staticmethod
    def _should_fold(node: ir.Node) -> bool:
        for value in node.inputs:
            if value is None:
                continue
            if value.dtype not in _INTEGER_TYPES or value.const_value is None:
                return False
            if value.const_value.size > _SHAPE_ELEMENTS:
                return False
        for output in node.outputs:
            elements = _static_elements(output)
            if output.dtype not in _INTEGER_TYPES or elements is None or elements > _SHAPE_ELEMENTS:
                return False
        return True
