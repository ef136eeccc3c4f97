"""Raising a model's ONNX opset import so that a rule may emit an op from a newer opset.

A fused op such as ``LayerNormalization`` (opset 17) or ``RMSNormalization`` (opset 23) only passes the
ONNX checker when the graph imports that opset. Moving the import from version ``v`` to ``target`` keeps
the model's meaning when no node it holds changed meaning in ``(v, target]``; the few ops that did are
listed below with the version that changed them. Two signature changes at opset 18 are adapted in place
instead, because exporters at opset 13-17 use them everywhere: a Reduce* op's ``axes`` attribute becomes
a constant input, and a Split without split sizes gets ``num_outputs``. Below opset 13 too much changed
(Softmax's axis semantics, Squeeze/Unsqueeze/ReduceSum/Split axes moved to inputs): such a model needs
the version converter first, and the rule refuses with that sentence.

A rule uses this in two steps, because ``check`` must not modify the model: ``check`` asks
``upgrade_refusal`` and remembers the model, ``rewrite`` marks the upgrade as pending, and the rule's
``cleanup`` hook (run once the graph has been rewritten) calls ``raise_default_opset``.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from flexdsa_core.fusions._norm_checks import node_label

OLDEST_UPGRADABLE = 13

# op_type -> the opset versions (above 13) at which its meaning or signature changed.
_CHANGED_AT: dict[str, tuple[int, ...]] = {
    "RoiAlign": (16,),  # default coordinate_transformation_mode became half_pixel
    "DFT": (20,),  # axis moved from an attribute to an input
    "GridSample": (20,),  # mode names changed (bilinear -> linear, bicubic -> cubic)
    "GroupNormalization": (21,),  # scale and bias became per channel instead of per group
}

# Adapted at opset 18 (see _adapt_to_18): the Reduce ops whose axes moved from an attribute to an input.
ADAPTED_AT_18 = frozenset(
    {"ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin"}
    | {"ReduceProd", "ReduceSumSquare", "Split"}
)


def default_opset(graph_or_function: ir.Graph | ir.Function, model: ir.Model) -> int | None:
    imports = (
        graph_or_function.opset_imports if isinstance(graph_or_function, ir.Function) else model.opset_imports
    )
    return imports.get("", imports.get("ai.onnx"))


def upgrade_refusal(model: ir.Model, graph_or_function: ir.Graph | ir.Function, target: int) -> str | None:
    """``None`` when the ONNX import can be raised to ``target`` without changing meaning, else why not."""
    current = default_opset(graph_or_function, model)
    if current is None:
        return "The graph imports no ONNX opset."
    if current >= target:
        return None
    if isinstance(graph_or_function, ir.Function):
        return f"Function '{graph_or_function.name}' imports ONNX opset {current} < {target}; functions are not upgraded."
    if current < OLDEST_UPGRADABLE:
        return (
            f"The model imports ONNX opset {current}; the fused op needs opset {target} and models below "
            f"opset {OLDEST_UPGRADABLE} must go through the version converter first."
        )
    for node in ir.traversal.RecursiveGraphIterator(model.graph):
        if node.domain not in ("", "ai.onnx"):
            continue
        changed = [v for v in _CHANGED_AT.get(node.op_type, ()) if current < v <= target]
        if changed:
            return (
                f"The fused op needs ONNX opset {target} but the model imports {current} and its node "
                f"{node_label(node)} changed meaning at opset {changed[0]}."
            )
        if current < 18 <= target and node.op_type in ADAPTED_AT_18 and node.graph is not model.graph:
            return f"The node {node_label(node)} inside a subgraph would need adapting to opset 18."
    return None


def _adapt_to_18(model: ir.Model) -> None:
    """Rewrite the opset-13 signatures that opset 18 changed (the graph's top level only; see refusal)."""
    graph = model.graph
    for node in list(graph):
        if node.domain not in ("", "ai.onnx") or node.op_type not in ADAPTED_AT_18:
            continue
        if node.op_type == "Split":
            has_sizes = len(node.inputs) > 1 and node.inputs[1] is not None
            if not has_sizes and "num_outputs" not in node.attributes:
                node.attributes["num_outputs"] = ir.AttrInt64("num_outputs", len(node.outputs))
            continue
        axes = node.attributes.pop("axes", None)
        if axes is None:
            continue  # no axes: reduce over all of them, as in opset 18 without the input
        name = f"{node.outputs[0].name}__axes"
        value = ir.Value(
            name=name, const_value=ir.tensor(np.array(list(axes.as_ints()), dtype=np.int64), name=name)
        )
        value.shape = ir.Shape([len(axes.as_ints())])
        value.type = ir.TensorType(ir.DataType.INT64)
        graph.register_initializer(value)
        node.resize_inputs(2)
        node.replace_input_with(1, value)


def raise_default_opset(model: ir.Model, target: int) -> None:
    """Import ONNX opset ``target`` (never lowers it); valid only after ``upgrade_refusal`` said None."""
    key = "ai.onnx" if "ai.onnx" in model.opset_imports and "" not in model.opset_imports else ""
    current = model.opset_imports.get(key, 0)
    if current < 18 <= target:
        _adapt_to_18(model)
    if current < target:
        model.opset_imports[key] = target


class OpsetUpgrade:
    """The check/rewrite/cleanup bookkeeping for a rule whose fused op ``op_type`` needs ONNX opset ``target``."""

    def __init__(self, target: int, op_type: str):
        self.target = target
        self.op_type = op_type
        self._model: ir.Model | None = None
        self._pending = False

    def refusal(self, context) -> str | None:
        self._model = context.model
        return upgrade_refusal(context.model, context.graph_or_function, self.target)

    def mark_rewritten(self) -> None:
        self._pending = True

    def finish(self) -> None:
        # A tracing (debug) run calls rewrite without changing the graph: upgrade only if the op is there.
        if self._pending and self._model is not None and self._holds_fused_op(self._model):
            raise_default_opset(self._model, self.target)
        self._pending = False

    def _holds_fused_op(self, model: ir.Model) -> bool:
        return any(
            node.op_type == self.op_type and node.domain in ("", "ai.onnx")
            for node in ir.traversal.RecursiveGraphIterator(model.graph)
        )
