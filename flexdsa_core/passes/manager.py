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
    total = sum(1 for _ in ir.traversal.RecursiveGraphIterator(model.graph))
    for function in model.functions.values():
        total += sum(1 for _ in ir.traversal.RecursiveGraphIterator(function))
    return total


def run_passes(
    model: ir.Model, passes: Sequence[ir.passes.PassBase], *, max_iterations: int = 8
) -> list[PassRecord]:
    """Apply ``passes`` in order, sweep after sweep, until a sweep changes nothing.

    In-place passes edit ``model``; a functional pass's result is copied back into ``model`` so the caller
    always holds the optimised graph. Returns the records in execution order.
    """
    records: list[PassRecord] = []
    for iteration in range(max_iterations):
        sweep_modified = False
        for pass_ in passes:
            name = pass_name(pass_)
            nodes_before = count_nodes(model)
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
            records.append(
                PassRecord(name, iteration, nodes_before, count_nodes(model), seconds, bool(result.modified))
            )
            sweep_modified = sweep_modified or bool(result.modified)
        if not sweep_modified:
            break
    return records


def _adopt(model: ir.Model, new_model: ir.Model) -> None:
    """Make ``model`` hold the graph, functions and opsets of ``new_model`` (for functional passes)."""
    model.graph = new_model.graph
    model.functions.clear()
    model.functions.update(new_model.functions)
    model.ir_version = new_model.ir_version
