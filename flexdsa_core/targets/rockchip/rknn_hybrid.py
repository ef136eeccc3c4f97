"""How rknn-toolkit2 names our tensors, for its hybrid quantisation: read from its quantisation config and mapped
from the ONNX names. Standard library only: imported by the toolchain's driver (in the toolkit's environment)
and shipped in the bundle beside ``convert_rknn.py``, which imports it too, so both map names with one
definition.
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
