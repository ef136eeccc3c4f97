"""Run passes to a fixed point and record what each one did.

Every pass is an ``onnx_ir.passes.PassBase`` (``call(model) -> PassResult(model, modified)``). The manager
repeats the whole list until one sweep modifies nothing (or ``max_iterations`` sweeps ran), and keeps one
``PassRecord`` per pass per sweep: node counts before and after, wall time, whether it changed the graph.
A pass that raises is re-raised as ``PassFailedError`` naming the pass and the sweep, so a caller never
sees an anonymous traceback from deep inside a rewrite.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import onnx_ir as ir

from flexdsa_core.errors import FlexDSAError


class PassFailedError(FlexDSAError):
    """A generic pass failed on this model: a compiler bug, or a model the pass cannot handle."""

    code = "pass_failed"
    http_status = 500


@dataclass(frozen=True)
class PassRecord:
    name: str
    iteration: int
    nodes_before: int
    nodes_after: int
    seconds: float
    modified: bool

    def as_dict(self) -> dict:
        record = asdict(self)
        record["seconds"] = round(self.seconds, 6)
        return record


def pass_name(pass_: ir.passes.PassBase) -> str:
    """The stable snake_case name of a pass (its ``name`` attribute), else its class name."""
    return getattr(pass_, "name", None) or type(pass_).__name__


def count_nodes(model: ir.Model) -> int:
    """Nodes in the main graph, its subgraphs and the model-local functions."""
    return _count(model.graph) + sum(_count(function) for function in model.functions.values())


def _count(graph: ir.Graph | ir.Function) -> int:
    # Counted per graph, descending only into the attributes that hold subgraphs: a generator over every node
    # (``RecursiveGraphIterator``) took a sixth of the passes' time on a 200-node CNN, counted twice per pass.
    total = len(graph)
    for node in graph:
        for attr in node.attributes.values():
            if attr.type == ir.AttributeType.GRAPH:
                total += _count(attr.value)
            elif attr.type == ir.AttributeType.GRAPHS:
                total += sum(_count(sub) for sub in attr.value)
    return total


def run_passes(
    model: ir.Model, passes: Sequence[ir.passes.PassBase], *, max_iterations: int = 8
) -> list[PassRecord]:
    """Apply ``passes`` in order, sweep after sweep, until every pass has run once on the graph as it stands
    without changing it (a fixed point): a sweep stops at the pass that last changed the graph, since the ones
    after it already saw the graph as it is.

    In-place passes edit ``model``; a functional pass's result is copied back into ``model`` so the caller
    always holds the optimised graph. Returns the records in execution order.
    """
    records: list[PassRecord] = []
    nodes_after = count_nodes(model)
    unchanged_runs = 0  # passes run in a row, up to now, that left the graph as they found it
    for iteration in range(max_iterations):
        for pass_ in passes:
            if unchanged_runs >= len(passes):
                return records
            name = pass_name(pass_)
            nodes_before = nodes_after  # what the pass before left (a pass edits the graph only when it runs)
            start = time.perf_counter()
            try:
                result = pass_(model)
            except FlexDSAError:
                raise
            except Exception as err:
                raise PassFailedError(
                    f"The generic pass '{name}' failed in sweep {iteration + 1}: {type(err).__name__}: {err}. "
                    f"Switch it off with disabled_rules=['{name}'] and report the model to the Flex-DSA team.",
                    details={"pass": name, "iteration": iteration},
                ) from err
            seconds = time.perf_counter() - start
            if result.model is not model:
                _adopt(model, result.model)
            nodes_after = count_nodes(model) if result.modified or result.model is not model else nodes_before
            records.append(PassRecord(name, iteration, nodes_before, nodes_after, seconds, bool(result.modified)))
            unchanged_runs = 0 if result.modified else unchanged_runs + 1
    return records


def _adopt(model: ir.Model, new_model: ir.Model) -> None:
    """Make ``model`` hold the graph, functions and opsets of ``new_model`` (for functional passes)."""
    model.graph = new_model.graph
    model.functions.clear()
    model.functions.update(new_model.functions)
    model.ir_version = new_model.ir_version
