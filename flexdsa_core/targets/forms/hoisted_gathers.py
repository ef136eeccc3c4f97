"""``Gather(y, c_i) ∘ op(·, K_i)`` for several channels ``c_i`` → ``Gather(op(y, K), c_i)``: element-wise steps
that a decode applies to each channel of a tensor apart, applied once to the whole tensor before the channels
are picked.

A detector's decode often picks the channels of one head output one by one and gives each its own affine map
(MTCNN's P-Net with its decode: box offset ``k`` → ``offset · 12 + grid_k``, four channels, four Gathers, four
Muls, four Adds). When each channel's chain is the same sequence of element-wise ops (Add, Sub, Mul, Div) with a
constant other operand, the chains are one chain over the whole tensor with the constants stacked along the
picked axis::

    K[..., c_i, ...] = K_i (broadcast to the picked channel's shape)     (channels picked by no Gather: 1 for
    op(Gather(y, c_i), K_i) = Gather(op(y, K), c_i)                        Mul/Div, 0 for Add/Sub; unread)

exact: each element goes through the same fp32 operation with the same operand. Why it can pay: rknn-toolkit2
rewrites a Conv whose output is picked channel by channel into one Conv per picked channel
(``seperate_conv_split`` in its log), and each of those re-reads the whole input (P-Net: four 1×1 convs at
16,512 cycles each in int8, bound by memory, where one Conv with four outputs costs the same as one of them).
With the element-wise steps between the Conv and the picking, the toolkit keeps one Conv. Whether it pays is
the vendor's estimate to say (``vendor_runs.explore``).

Offered where at least two Gathers pick distinct constant channels of one tensor along one axis, each followed by
at least one such step (the common steps are hoisted; a chain's value read by anything else, or a graph output,
ends it), and the stacked constants stay under ``MAX_STACKED_BYTES`` each.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as ir_passes

from flexdsa_core.targets.forms import VendorForm, name_nodes

STEPS = ("Add", "Sub", "Mul", "Div")
NEUTRAL = {"Add": 0.0, "Sub": 0.0, "Mul": 1.0, "Div": 1.0}
MAX_STACKED_BYTES = 4 << 20
VARIANT = "stacked"


@dataclass
class _Site:
    source: ir.Value
    axis: int
    gathers: list[tuple[int, ir.Node]]  # (channel, Gather)
    chains: list[list[ir.Node]]  # per Gather, its common steps
    steps: list[tuple[str, int]]  # (op type, the chain's operand position) per common step


def _scalar_index(node: ir.Node) -> int | None:
    index = node.inputs[1] if len(node.inputs) > 1 else None
    if index is None or index.const_value is None:
        return None
    value = index.const_value.numpy()
    return int(value) if value.ndim == 0 and np.issubdtype(value.dtype, np.integer) else None


def _step(node: ir.Node, value: ir.Value) -> tuple[tuple[str, int], np.ndarray] | None:
    """(op type, which input ``value`` is) and the constant operand, where ``node`` is such a step on ``value``."""
    if node.op_type not in STEPS or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
        return None
    position = 0 if node.inputs[0] is value else 1
    other = node.inputs[1 - position]
    if node.inputs[position] is not value or other is None or other.const_value is None:
        return None
    return (node.op_type, position), other.const_value.numpy()


def _chain(gather: ir.Node, graph_outputs: set[int]) -> list[tuple[ir.Node, tuple[str, int], np.ndarray]]:
    found, value = [], gather.outputs[0]
    while id(value) not in graph_outputs and len(value.uses()) == 1:
        node = value.uses()[0].node
        step = _step(node, value)
        if step is None or id(node.outputs[0]) in graph_outputs:
            break
        found.append((node, *step))
        value = node.outputs[0]
    return found


def _sites(model: ir.Model) -> dict[str, _Site]:
    graph_outputs = {id(v) for v in model.graph.outputs}
    sites: dict[str, _Site] = {}
    values = [v for node in model.graph for v in node.outputs]
    for source in values:
        if source.shape is None or not source.shape.is_static() or source.producer() is None:
            continue
        by_axis: dict[int, list[tuple[int, ir.Node]]] = {}
        for use in source.uses():
            node = use.node
            if node.op_type != "Gather" or node.domain not in ("", "ai.onnx") or use.idx != 0:
                continue
            channel = _scalar_index(node)
            if channel is None:
                continue
            axis = node.attributes.get_int("axis", 0) % source.shape.rank()
            by_axis.setdefault(axis, []).append((channel % int(source.shape[axis]), node))
        for axis, gathers in by_axis.items():
            if len(gathers) < 2 or len({c for c, _ in gathers}) != len(gathers):
                continue
            chains = [_chain(node, graph_outputs) for _, node in gathers]
            common = 0
            while all(len(chain) > common for chain in chains) and len({chain[common][1] for chain in chains}) == 1:
                common += 1
            if common == 0:
                continue
            site = source.producer().name
            if site in sites:
                continue
            sites[site] = _Site(source, axis, gathers, [[step[0] for step in chain[:common]] for chain in chains],
                                [chains[0][k][1] for k in range(common)])  # fmt: skip
    return sites


def _stacked(site: _Site, k: int) -> np.ndarray | None:
    """The step's constants stacked along the picked axis, at the source's shape; None past the size limit."""
    shape = [int(d) for d in site.source.shape]
    op_type = site.steps[k][0]
    constants = [chain[k].inputs[1 - site.steps[k][1]].const_value.numpy() for chain in site.chains]
    dtype = np.result_type(*constants)
    if int(np.prod(shape)) * dtype.itemsize > MAX_STACKED_BYTES:
        return None
    picked = shape[: site.axis] + shape[site.axis + 1 :]
    stacked = np.full(shape, NEUTRAL[op_type], dtype)
    for (channel, _), constant in zip(site.gathers, constants, strict=True):
        try:
            part = np.broadcast_to(constant, picked)
        except ValueError:
            return None
        if part.shape != tuple(picked):
            return None
        index = [slice(None)] * len(shape)
        index[site.axis] = channel
        stacked[tuple(index)] = part
    return stacked


def _constant(name: str, array: np.ndarray) -> ir.Value:
    return ir.Value(name=name, const_value=ir.tensor(array, name=name), shape=ir.Shape(array.shape),
                    type=ir.TensorType(ir.DataType.from_numpy(array.dtype)))  # fmt: skip


def _node_after(graph: ir.Graph, after: ir.Node, op_type: str, inputs: list, name: str, like: ir.Value,
                attributes=()) -> ir.Node:  # fmt: skip
    """A new node ``name`` placed after ``after``, its output shaped and typed as ``like``."""
    node = ir.Node("", op_type, inputs, attributes=attributes, name=name, outputs=[ir.Value(name=f"{name}_output")])
    node.outputs[0].shape, node.outputs[0].type = like.shape, like.type
    graph.insert_after(after, node)
    return node


class HoistedGathers(VendorForm):
    """A ``VendorForm`` found and applied on the IR directly (a pattern over a variable number of Gathers), with
    one variant."""

    def sites(self, model: ir.Model) -> dict[str, list[str]]:
        name_nodes(model)
        found = _sites(model)
        return {site: [VARIANT] for site, found_site in found.items()
                if all(_stacked(found_site, k) is not None for k in range(len(found_site.steps)))}  # fmt: skip

    def replaced(self, model: ir.Model, site: str) -> set[str]:
        name_nodes(model)
        found = _sites(model).get(site)
        if found is None:
            return {site}
        return {site, *(node.name for _, node in found.gathers), *(node.name for chain in found.chains for node in chain)}

    def apply(self, model: ir.Model, choices: dict[str, str]) -> list[str]:
        name_nodes(model)
        taken = []
        for site, found in _sites(model).items():
            if choices.get(site) != VARIANT:
                continue
            stacks = [_stacked(found, k) for k in range(len(found.steps))]
            if any(stack is None for stack in stacks):
                continue
            graph, value, after = model.graph, found.source, found.source.producer()
            prefix = f"{site}{self.site_suffix}"
            for k, ((op_type, position), stack) in enumerate(zip(found.steps, stacks, strict=True)):
                constant = _constant(f"{prefix}/stacked_{k}", stack)
                graph.register_initializer(constant)
                inputs = [value, constant] if position == 0 else [constant, value]
                after = _node_after(graph, after, op_type, inputs, f"{prefix}/{op_type.lower()}_{k}", like=found.source)
                value = after.outputs[0]
            for (channel, _), chain in zip(found.gathers, found.chains, strict=True):
                index = _constant(f"{prefix}/channel_{channel}", np.array(channel, np.int64))
                graph.register_initializer(index)
                last = chain[-1].outputs[0]
                after = _node_after(graph, after, "Gather", [value, index], f"{prefix}/gather_{channel}", like=last,
                                    attributes=[ir.AttrInt64("axis", found.axis)])  # fmt: skip
                last.replace_all_uses_with(after.outputs[0])
            taken.append(site)
        if taken:
            ir_passes.RemoveUnusedNodesPass()(model)
        return taken


FORM = HoistedGathers(
    name="hoisted_channel_gathers",
    summary="Per-channel Gathers each followed by the same element-wise steps → the steps once on the whole "
    "tensor (constants stacked), then the Gathers",
    variants={VARIANT: None},
    site_suffix="/hoisted_gathers",
)
