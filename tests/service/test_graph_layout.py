"""The dashboard's graph picture (``service.dashboard.graph_layout``): layers from onnx-ir's topological order, the
placement rule, what is drawn and what is not, on graphs written as ONNX text, and on a real model."""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import onnx.parser
import onnx_ir as ir
import pytest

from service.dashboard.graph_layout import (
    BOX_H,
    BOX_W,
    GAP_X,
    GAP_Y,
    GRAPH_MAX_NODES,
    PAD,
    layer_nodes,
    place,
    render_graph,
)

MODELS = Path(__file__).resolve().parent.parent / "models"

# x -> Relu r1 -> a ; a -> Relu r2 -> b ; Add(b, a) ; Shape(x) only feeds the Reshape at the bottom.
DIAMOND = """
<ir_version: 9, opset_import: ["" : 17]>
g (float[2, 4] x) => (float[8] z) {
    [r1] a = Relu (x)
    [r2] b = Relu (a)
    [add] y = Add (b, a)
    [sh] s = Shape (x)
    [rs] z = Reshape (y, s)
}
"""


def _layers_by_name(text: str) -> list[list[str]]:
    graph = ir.from_proto(onnx.parser.parse_model(text)).graph
    nodes = list(graph)
    layers, _ = layer_nodes(graph, nodes)
    return [sorted(nodes[i].name for i in layer) for layer in layers]


def test_a_node_sits_one_layer_below_its_deepest_producer():
    # The Shape, fed only by a graph input, is drawn just above its user, not crowding layer 0.
    assert _layers_by_name(DIAMOND) == [["r1"], ["r2"], ["add", "sh"], ["rs"]]


def test_an_unsorted_file_lays_out_as_its_sorted_twin():
    lines = DIAMOND.strip().splitlines()
    body = lines[2:-1]
    shuffled = "\n".join([*lines[:2], body[4], body[2], body[1], body[3], body[0], lines[-1]])
    assert onnx.parser.parse_model(shuffled).graph.node[0].name == "rs"  # really out of order
    assert _layers_by_name(shuffled) == _layers_by_name(DIAMOND)
    old, new = render_graph(_bytes(DIAMOND)), render_graph(_bytes(shuffled))
    assert _boxes(old["svg"]) == _boxes(new["svg"])


def test_a_cycle_still_draws_in_file_order():
    cycle = """
    <ir_version: 9, opset_import: ["" : 17]>
    g (float[1] x) => (float[1] y) {
        [first] a = Add (x, b)
        [second] b = Relu (a)
        [third] y = Relu (a)
    }
    """
    # onnx-ir refuses to sort it; the back edge second -> first does not push 'first' down.
    assert _layers_by_name(cycle) == [["first"], ["second", "third"]]
    view = render_graph(_bytes(cycle))
    assert view["nodes"] == 3 and len(_boxes(view["svg"])) == 3


def test_constants_are_not_drawn_and_classes_mark_shape_and_fused_ops():
    text = """
    <ir_version: 9, opset_import: ["" : 17, "com.microsoft" : 1]>
    g (float[2, 4] x) => (float[8] z) {
        c = Constant <value = float[1] {2.0}> ()
        [mul] m = Mul (x, c)
        [gelu] g = com.microsoft.FastGelu (m)
        s = Constant <value = int64[1] {8}> ()
        [rs] z = Reshape (g, s)
    }
    """
    view = render_graph(_bytes(text))
    assert view["nodes"] == 3
    assert view["note"].startswith("3 nodes; 2 Constant nodes not drawn.")
    boxes = re.findall(r'<g class="([^"]+)"><title>([^<]*)</title>', str(view["svg"]))
    assert boxes == [
        ("op", "Mul mul\nin: x, c\nout: m"),
        ("op fused", "com.microsoft::FastGelu gelu\nin: m\nout: g"),
        ("op shape", "Reshape rs\nin: g, s\nout: z"),
    ]


def test_too_many_nodes_are_not_drawn():
    body = "\n".join(f"    v{i + 1} = Relu (v{i})" for i in range(GRAPH_MAX_NODES + 1))
    text = f'<ir_version: 9, opset_import: ["" : 17]>\ng (float[1] v0) => (float[1] v{GRAPH_MAX_NODES + 1}) {{\n{body}\n}}'
    view = render_graph(_bytes(text))
    assert view["svg"] is None and view["nodes"] == GRAPH_MAX_NODES + 1
    assert "too many to draw" in view["note"]


@pytest.mark.models
def test_bert_boxes_keep_the_placement_rule():
    proto = onnx.load(MODELS / "bert.onnx")
    graph = ir.from_proto(proto).graph
    nodes = [n for n in graph if n.op_type != "Constant"]
    layers, preds = layer_nodes(graph, nodes)
    positions = place(layers, preds)
    step = BOX_W + GAP_X
    assert sorted(i for layer in layers for i in layer) == list(range(len(nodes)))
    at_wish = 0
    for depth, layer in enumerate(layers):
        row = sorted(layer, key=lambda i: positions[i][0])
        for left, i in zip([None, *row], row):
            x, y = positions[i]
            assert y == PAD + depth * (BOX_H + GAP_Y)
            assert all(positions[p][1] < y for p in preds[i])  # producers are drawn above
            if left is not None:
                assert x - positions[left][0] >= step  # boxes never overlap
            if preds[i]:
                # At the mean x of its producers, or pushed right just enough to clear its left neighbour.
                wanted = sum(positions[p][0] for p in preds[i]) / len(preds[i])
                assert x == wanted or (x > wanted and x == positions[left][0] + step)
                at_wish += x == wanted
    assert at_wish > len(nodes) // 2  # most edges are short


def _bytes(text: str) -> bytes:
    return onnx.parser.parse_model(text).SerializeToString()


def _boxes(svg) -> list[tuple[str, str, str]]:
    """(tooltip, x, y) of every box, in drawing order."""
    found = re.findall(r'<title>(.*?)</title><rect x="(\d+)" y="(\d+)"', str(svg), re.S)
    return sorted(found)
