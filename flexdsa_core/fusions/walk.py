"""The one walk of a fusion rule's onnxscript ``RewriteRule``s over a graph: the Fusion Switcher's in production, and
``FusionRule.apply``'s in the rule tests, so that a rule is tested the way it runs.

It walks the graph (and control-flow subgraphs) node by node as onnxscript's ``RewriteRuleSet`` does, but
builds each match's replacement first (``RewriteRule.try_rewrite``) and hands it to ``decide``; only a
match ``decide`` takes is applied, its new nodes tagged with the fusion rule's name (``RULE_TAG``), and a
refused replacement is detached. At one site the rule's variants are tried in turn until one is taken;
a site where none is gives one decision, the first variant's. Failed ``check``s reach ``tracer``.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import onnx_ir as ir
import onnxscript.optimizer
from onnxscript.rewriter import RULE_NAME_TAG, MatchStatus, RewriteRule

from flexdsa_core._libraries import rule_op_types, rule_root_op_type

# Node metadata naming the fusion rule that produced the node.
RULE_TAG = "flexdsa.fusion_rule"


class Decision(Protocol):
    taken: bool


# decide(rewrite_rule, replacement) -> a decision; the replacement is onnxscript's ReplacementSubgraph.
Decide = Callable[[RewriteRule, object], Decision]


class ReasonTracer:
    """Duck-typed onnxscript matching tracer: keeps the sentences of failed checks, counted. These are
    the refusals ``fusion_plan.json`` lists under a rule."""

    def __init__(self) -> None:
        self.reasons: collections.Counter[str] = collections.Counter()

    def log(self, rule, container, node, match_result, status) -> None:
        if status in (MatchStatus.CONDITION_FAILED, MatchStatus.REPLACEMENT_FAILED):
            self.reasons[match_result.reason or f"{rule}: check failed without a reason"] += 1


def drive(
    model: ir.Model,
    rewrite_rules: Sequence[RewriteRule],
    decide: Decide,
    *,
    rule_name: str,
    opset_imports: Iterable[tuple[str, int]] = (),
    tracer: ReasonTracer | None = None,
) -> list[Decision]:
    """Drive ``rewrite_rules`` over ``model`` in place; one decision per matched site, in graph order.
    The opsets the rule needs are imported, and dropped again when no match was taken."""
    opset_imports = tuple(opset_imports)
    added_domains = [d for d, _ in opset_imports if d not in model.opset_imports]
    for domain, version in opset_imports:
        model.opset_imports.setdefault(domain, version)
    decisions: list[Decision] = []
    # The op types the model holds, everywhere (a match may reach a subgraph's outer scope); what a taken
    # rewrite adds joins them (``_drive_graph``), so a variant can match what an earlier rewrite of this walk made.
    present = {node.op_type for node in ir.traversal.RecursiveGraphIterator(model.graph)}
    _drive_graph(model, model.graph, list(rewrite_rules), decide, rule_name, tracer, decisions, present)
    if not any(v.taken for v in decisions):
        for domain in added_domains:
            model.opset_imports.pop(domain, None)
    return decisions


def _drive_graph(model, graph, rewrite_rules, decide, rule_name, tracer, decisions, present) -> None:
    for rewrite_rule in rewrite_rules:
        if rewrite_rule.graph_pre_visitor:
            rewrite_rule.graph_pre_visitor()
    # A variant whose pattern ends at another op type cannot match a node, nor one whose pattern holds an op
    # type the model does not: neither is tried (most of the matching time on a transformer went to tries of
    # the first kind, 200 variants over every node; on a CNN, to transformer variants ending at Add or Mul).
    roots = [rule_root_op_type(rule) for rule in rewrite_rules]
    needs = [rule_op_types(rule) for rule in rewrite_rules]
    for node in graph:
        refused: Decision | None = None
        for rewrite_rule, root, need in zip(rewrite_rules, roots, needs, strict=True):
            if (root is not None and root != node.op_type) or not need <= present:
                continue
            delta = rewrite_rule.try_rewrite(model, graph, node, tracer=tracer)
            if delta is None:
                continue
            decision = decide(rewrite_rule, delta)
            if decision.taken:
                _apply(graph, rewrite_rule, node, delta, rule_name)
                present.update(new.op_type for new in delta.new_nodes)
                decisions.append(decision)
                refused = None
                break
            _discard(delta)
            refused = refused or decision
        if refused is not None:
            decisions.append(refused)
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                _drive_graph(model, attr.value, rewrite_rules, decide, rule_name, tracer, decisions, present)
            elif attr.type == ir.AttributeType.GRAPHS:
                for subgraph in attr.value:
                    _drive_graph(model, subgraph, rewrite_rules, decide, rule_name, tracer, decisions, present)
    for rewrite_rule in rewrite_rules:
        if rewrite_rule.graph_post_visitor:
            rewrite_rule.graph_post_visitor()


def removed_nodes(rewrite_rule: RewriteRule, delta) -> list[ir.Node]:
    """The matched nodes that go away: all of them when the rule removes its match, otherwise those left
    with no consumer once the match's outputs are rerouted to the replacement."""
    matched = _in_dataflow_order(delta.match.nodes)
    if rewrite_rule.remove_nodes:
        return matched
    rerouted = set(delta.match.outputs)
    dead: set[ir.Node] = set()
    changed = True
    while changed:
        changed = False
        for node in matched:
            if node in dead:
                continue
            if all(
                value in rerouted
                or (not value.is_graph_output() and all(u.node in dead for u in value.uses()))
                for value in node.outputs
            ):
                dead.add(node)
                changed = True
    return [n for n in matched if n in dead]


def _in_dataflow_order(nodes: Iterable[ir.Node]) -> list[ir.Node]:
    """Producers before consumers (a match lists its nodes from the pattern's output backwards)."""
    remaining = list(nodes)
    ordered: list[ir.Node] = []
    while remaining:
        pending = set(remaining)
        ready = [n for n in remaining if not any(v is not None and v.producer() in pending for v in n.inputs)]
        ready = ready or remaining[:1]  # a cycle cannot happen in a valid graph; never loop forever
        ordered.extend(ready)
        remaining = [n for n in remaining if n not in set(ready)]
    return ordered


def _apply(graph: ir.Graph, rewrite_rule: RewriteRule, node: ir.Node, delta, rule_name: str) -> None:
    """What ``RewriteRuleSet`` does with an accepted match; new nodes are tagged with the fusion rule's name
    (``RULE_TAG``) so that the delivered model can be checked against the plan."""
    removed = removed_nodes(rewrite_rule, delta)
    carry_output_types(delta)
    for initializer in delta.new_initializers:
        if initializer.name not in graph.initializers:
            graph.initializers[initializer.name] = initializer
    onnxscript.optimizer.basic_constant_propagation(delta.new_nodes)
    for new_node in delta.new_nodes:
        if rewrite_rule.name:
            new_node.metadata_props[RULE_NAME_TAG] = rewrite_rule.name
        new_node.metadata_props[RULE_TAG] = rule_name
    ir.convenience.replace_nodes_and_values(
        graph,
        node,
        removed if rewrite_rule.remove_nodes else [],
        delta.new_nodes,
        delta.match.outputs,
        delta.new_outputs,
    )


def carry_output_types(delta) -> None:
    """The replacement's outputs take the matched outputs' type and shape (where the rewrite set none)."""
    producers = set(delta.new_nodes)
    for old, new in zip(delta.match.outputs, delta.new_outputs, strict=False):
        if new.producer() in producers:
            if new.type is None:
                new.type = old.type
            if new.shape is None:
                new.shape = old.shape


def _discard(delta) -> None:
    """Detach a refused replacement: its nodes were built against live values and would stay listed as
    their users (later stages, e.g. the memory planner, would then see consumers outside the graph)."""
    for node in delta.new_nodes:
        for index in range(len(node.inputs)):
            node.replace_input_with(index, None)
