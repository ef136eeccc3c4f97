"""Fresh names for the initializers a rewrite creates.

A rewrite that reused an existing initializer's name would depend on how its driver registers new
initializers: ``RewriteRuleSet`` replaces the old one, the Fusion Switcher keeps it and drops the new
one. A fresh name means the same in both; the old initializer, now unused, goes with the dead-code pass.
``check`` sees the graph and ``rewrite`` does not, so ``check`` picks the name and ``rewrite`` uses it.
"""

from __future__ import annotations

import onnx_ir as ir


def fresh_name(graph: ir.Graph | ir.Function, base: str) -> str:
    """``base``, or ``base_1``, ``base_2``... whichever no value in ``graph`` is named yet."""
    taken = set(getattr(graph, "initializers", {}))
    taken.update(value.name for value in graph.inputs)
    taken.update(output.name for node in graph for output in node.outputs)
    name, suffix = base, 0
    while name in taken:
        suffix += 1
        name = f"{base}_{suffix}"
    return name
