"""The dashboard's graph view: an ONNX model drawn as a layered SVG, no JavaScript and no layout library.

``render_graph(model_bytes)`` answers ``{"svg": Markup | None, "nodes": n, "note": str}``. Constant nodes
are not drawn (they would double the picture and say nothing), and above ``GRAPH_MAX_NODES`` nothing is
drawn at all: such an SVG would be unreadable and slow to build.

The layout, in three steps:

1. Layers. Nodes are taken in onnx-ir's topological order (``Graph.sort()``, stable, so a file that is
   already sorted keeps its order and one that is not still lays out), and each sits one layer below the
   deepest node feeding it: ``layer(n) = 1 + max(layer(p) for p in producers(n))``, 0 for a node fed only by
   graph inputs, initializers or Constants. Such a node (a Shape, an embedding's Gather) would crowd layer 0,
   so it is drawn just above its first user: ``layer(n) = max(0, min(layer(u) for u in users(n)) - 1)``.
   A graph with a cycle (invalid ONNX, which onnx-ir refuses to sort) keeps the file's order, and an edge
   pointing back in that order does not push its node down, so the page still shows something.
2. Places. Layer ``d`` is drawn at ``y = PAD + d·(BOX_H + GAP_Y)``. Within a layer each node wants the mean
   x of its producers (a node with none wants its slot, ``PAD + slot·(BOX_W + GAP_X)``); nodes are taken in
   order of that wish and each is pushed right just enough to clear the one before it:
   ``x = max(wanted, x_previous + BOX_W + GAP_X)``. That keeps most edges short without a real crossing
   minimisation.
3. Drawing. Every edge is a cubic Bézier from the bottom middle of the producer's box to the top middle of
   the user's, both control points half-way down; boxes are classed ``op``, ``op shape`` (ops that only
   compute shapes or move data, drawn pale so the compute stands out) or ``op fused`` (any custom domain:
   what the optimiser fused), and, given the Subgraph Mapper's placement, ``on-accelerator`` or ``on-cpu``
   (drawn green or orange: where each node runs). A box's tooltip names its op, node name, inputs and
   outputs, and its device.
"""

from __future__ import annotations

import html

import onnx
import onnx_ir as ir
from markupsafe import Markup

GRAPH_MAX_NODES = 1500
BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 128, 24, 14, 30, 12
# Ops that only compute shapes or move data: drawn pale, so the compute ops stand out.
SHAPE_OPS = frozenset(
    "Shape Gather Unsqueeze Squeeze Concat Reshape Slice Cast Expand Range ConstantOfShape Flatten "
    "Identity Transpose Split Where Equal Size".split()
)
LABEL_MAX_CHARS = 18


def render_graph(data: bytes, placement: dict[str, str] | None = None) -> dict:
    """``{"svg": Markup | None, "nodes": n, "note": str}`` for the serialized ONNX model ``data``; with
    ``placement`` (node name -> ``accelerator`` | ``cpu``, the Subgraph Mapper's), each box is classed
    ``on-accelerator`` or ``on-cpu`` too."""
    proto = onnx.load_model_from_string(data)
    # Counted on the proto, so that an oversized graph is refused before it is converted.
    drawn = sum(1 for node in proto.graph.node if node.op_type != "Constant")
    if drawn > GRAPH_MAX_NODES:
        return {"svg": None, "nodes": drawn, "note": f"{drawn} nodes: too many to draw here."}
    graph = ir.from_proto(proto).graph
    nodes = [node for node in graph if node.op_type != "Constant"]
    hidden = len(graph) - len(nodes)
    layers, preds = layer_nodes(graph, nodes)
    svg = draw(nodes, layers, preds, place(layers, preds), placement)
    note = f"{len(nodes)} nodes" + (f"; {hidden} Constant nodes not drawn" if hidden else "")
    note += ". Hover a box for its name, inputs and outputs."
    return {"svg": svg, "nodes": len(nodes), "note": note}


def layer_nodes(graph: ir.Graph, nodes: list[ir.Node]) -> tuple[list[list[int]], list[list[int]]]:
    """``(layers, preds)``: the indices into ``nodes`` on each layer, and each node's drawn producers.

    ``graph`` is sorted in place (it is the caller's throwaway copy).
    """
    index = {node: i for i, node in enumerate(nodes)}
    preds = [
        sorted({index[p] for p in node.predecessors() if p in index and p is not node}) for node in nodes
    ]
    try:
        graph.sort()
        order = [index[node] for node in graph if node in index]
    except ValueError:  # a cycle: see the module docstring
        order = list(range(len(nodes)))
    depth = [0] * len(nodes)
    done: set[int] = set()
    for i in order:
        depth[i] = max((depth[p] + 1 for p in preds[i] if p in done), default=0)
        done.add(i)
    users: list[list[int]] = [[] for _ in nodes]
    for i, producers in enumerate(preds):
        for p in producers:
            users[p].append(i)
    for i in order:
        if not preds[i] and users[i]:
            depth[i] = max(0, min(depth[u] for u in users[i]) - 1)
    layers: list[list[int]] = [[] for _ in range(max(depth, default=-1) + 1)]
    for i in order:
        layers[depth[i]].append(i)
    return layers, preds


def place(layers: list[list[int]], preds: list[list[int]]) -> dict[int, tuple[float, float]]:
    """Each node's top-left corner: as near as it can get to the mean x of its producers, pushed right to
    avoid overlap."""
    positions: dict[int, tuple[float, float]] = {}
    step = BOX_W + GAP_X
    for depth, layer in enumerate(layers):
        wanted = {}
        for slot, i in enumerate(layer):
            xs = [positions[p][0] for p in preds[i] if p in positions]
            wanted[i] = sum(xs) / len(xs) if xs else PAD + slot * step
        x = PAD - step
        for i in sorted(layer, key=lambda i: wanted[i]):
            x = max(wanted[i], x + step)
            positions[i] = (x, PAD + depth * (BOX_H + GAP_Y))
    return positions


def _box_class(node: ir.Node, placement: dict[str, str] | None = None) -> str:
    kind = "op fused" if node.domain not in ("", "ai.onnx") else ("op shape" if node.op_type in SHAPE_OPS else "op")
    device = (placement or {}).get(node.name or "")
    if device == "accelerator":
        return f"{kind} on-accelerator"
    return f"{kind} on-cpu" if device == "cpu" else kind


def _names(values) -> str:
    return ", ".join(value.name or "" if value is not None else "" for value in values)


def draw(nodes: list[ir.Node], layers, preds, positions, placement: dict[str, str] | None = None) -> Markup:
    width = max((x for x, _ in positions.values()), default=0) + BOX_W + PAD
    height = len(layers) * (BOX_H + GAP_Y) - GAP_Y + 2 * PAD
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" role="img">'
    ]
    for i, producers in enumerate(preds):
        x2, y2 = positions[i][0] + BOX_W / 2, positions[i][1]
        for j in producers:
            x1, y1 = positions[j][0] + BOX_W / 2, positions[j][1] + BOX_H
            bend = (y2 - y1) / 2
            parts.append(
                f'<path class="edge" d="M{x1:.0f},{y1:.0f} C{x1:.0f},{y1 + bend:.0f} {x2:.0f},{y2 - bend:.0f} {x2:.0f},{y2:.0f}"/>'
            )
    for i, node in enumerate(nodes):
        x, y = positions[i]
        op = node.op_type
        label = op if len(op) <= LABEL_MAX_CHARS else op[: LABEL_MAX_CHARS - 1] + "…"
        device = (placement or {}).get(node.name or "")
        tip = (
            f"{node.domain + '::' if node.domain else ''}{node.op_type} {node.name or ''}\n"
            f"in: {_names(node.inputs)}\nout: {_names(node.outputs)}" + (f"\non: {device}" if device else "")
        )
        parts.append(
            f'<g class="{_box_class(node, placement)}"><title>{html.escape(tip)}</title>'
            f'<rect x="{x:.0f}" y="{y:.0f}" width="{BOX_W}" height="{BOX_H}" rx="4"/>'
            f'<text x="{x + BOX_W / 2:.0f}" y="{y + BOX_H / 2 + 4:.0f}">{html.escape(label)}</text></g>'
        )
    parts.append("</svg>")
    return Markup("".join(parts))
