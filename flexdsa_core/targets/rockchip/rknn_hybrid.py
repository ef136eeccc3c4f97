"""How rknn-toolkit2 names our tensors, for its hybrid quantisation: read from its quantisation config and mapped
from the ONNX names (``map_hybrid``), or chosen as layers of the toolkit's own graph (``layer_pairs``). Standard
library only: imported by the toolchain's driver (in the toolkit's environment) and shipped in the bundle beside
``convert_rknn.py``, which imports it too, so both map names with one definition.

A hybrid pair ``[start, end]`` keeps float16 every layer on every path from tensor ``start`` to tensor ``end``
(the layer writing ``start`` stays quantised). So one layer alone is kept float16 by the pairs from its inputs
that reach it by no other path: a residual Add's pair from the stream it adds to would also take in every
layer of the block between (seen: a pair from a norm's output to the next residual Add made the whole
attention block float16, the convolutions included, doubling the toolkit's cycles).
"""

from __future__ import annotations

import re
from pathlib import Path


def quantized_tensors(cfg_path: str) -> set[str]:
    """Tensor names under ``quantize_parameters:`` in the toolkit's quantisation config (YAML)."""
    names, inside = set(), False
    for line in Path(cfg_path).read_text().splitlines():
        if line.startswith("quantize_parameters:"):
            inside = True
            continue
        if inside and line and not line.startswith(" "):
            break
        match = re.match(r"^    (\S[^:]*):\s*$", line)
        if inside and match:
            names.add(match.group(1))
    return names


def map_hybrid(pairs: list[list[str]], known: set[str], graph) -> tuple[list[list[str]], list[list[str]]]:
    """Our [input, output] tensor pairs as the toolkit names them: the same name, or the shortest of its
    ``<name>_...`` renames ('wide' -> 'wide_mm'); a tensor the toolkit fused away is replaced by the nearest
    one upstream (an input: its producer's input) or downstream (an output: its consumer's output)."""
    producer = {out: node for node in graph.node for out in node.output}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for value in node.input:
            consumers.setdefault(value, []).append(node)

    def named(tensor: str) -> str | None:
        if tensor in known:
            return tensor
        renamed = sorted((k for k in known if k.startswith(tensor + "_")), key=len)
        return renamed[0] if renamed else None

    def walk(tensor: str, upstream: bool) -> str | None:
        for _ in range(len(graph.node) + 1):
            found = named(tensor)
            if found is not None:
                return found
            if upstream:
                node = producer.get(tensor)
                tensor = node.input[0] if node is not None and node.input else None
            else:
                nodes = consumers.get(tensor) or []
                tensor = nodes[0].output[0] if len(nodes) == 1 and nodes[0].output else None
            if tensor is None:
                return None
        return None

    mapped, unmapped = [], []
    for start, end in pairs:
        first, last = walk(start, True), walk(end, False)
        if first is None or last is None or first == last:
            unmapped.append([start, end])
        else:
            mapped.append([first, last])
    return mapped, unmapped


# Separators the toolkit puts between an ONNX node's name and what it adds when it rewrites the node
# (``/fc/MatMul#2``, ``/ffn/act4_2gelu``, ``/down/MatMul#2_ConvAdd``).
_SEPARATORS = "#_:.-"


def layer_pairs(graph, known: set[str], *, tensors=(), nodes=(), ops=()) -> list[list[str]]:
    """Hybrid pairs keeping float16 exactly the chosen layers of the toolkit's graph (``graph``: its
    ``check3_fuse_ops.onnx``, tensors named as in its quantisation config, ``known``): a layer whose output is in
    ``tensors``, whose name is one of ``nodes`` (an ONNX node's name, as the toolkit keeps it or with its suffix),
    or whose op type is in ``ops``. One pair per input of a chosen layer that is a quantised tensor reaching it
    by no other path (module docstring)."""
    consumers: dict[str, list] = {}
    for node in graph.node:
        for value in node.input:
            consumers.setdefault(value, []).append(node)
    # A pair starts at a computed tensor: the toolkit refuses a constant one ("The input name ... is not exists").
    computed = {out for node in graph.node if node.op_type != "Constant" for out in node.output}
    computed |= {value.name for value in graph.input} - {init.name for init in graph.initializer}
    tensors, nodes, ops = set(tensors), set(nodes), set(ops)

    def chosen(node) -> bool:
        if node.op_type in ops or any(out in tensors for out in node.output):
            return True
        name = node.name
        return name in nodes or any(
            name.startswith(base) and name[len(base)] in _SEPARATORS
            for base in nodes
            if len(name) > len(base)
        )

    def reaches(start, goal) -> bool:
        stack, seen = [start], set()
        while stack:
            node = stack.pop()
            if node is goal:
                return True
            if id(node) in seen:
                continue
            seen.add(id(node))
            for out in node.output:
                stack.extend(consumers.get(out, []))
        return False

    pairs = []
    for node in graph.node:
        if not node.output or not chosen(node):
            continue
        for value in dict.fromkeys(v for v in node.input if v in known and v in computed):
            if not any(other is not node and reaches(other, node) for other in consumers.get(value, [])):
                pairs.append([value, node.output[0]])
    return pairs
