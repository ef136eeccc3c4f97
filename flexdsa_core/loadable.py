"""Never emit a graph ONNX Runtime refuses: the load check after each compile, and what a refusal carries.

``load_refusal(model)`` builds an ONNX Runtime session of a compiled bucket (``ORT_DISABLE_ALL``, weights read
from memory: no copy, nothing run) and returns ONNX Runtime's reason when it refuses, else None. It is the
cheap check that catches what no numerical comparison can (a Concat of int32 and int64 pieces, a type or
rank error a rewrite introduced): it costs one session build per bucket per compile.

``UnloadableGraph`` is raised by the pipeline when a stage fails with an error that is not the user's
(``FlexDSAError``: refused options, a budget) or when the finished bucket does not load. It carries the
compilation as far as it went (``comp.applied``: the rewrites to bisect over), the stage and the reason;
the optimizer bisects those rewrites like a numerical mismatch, switches the culprit off, records it in
``report.json`` → ``rollbacks`` with ``reason: "invalid_graph"``, and goes on without it.
"""

from __future__ import annotations

import re

import onnx_ir as ir
import onnxruntime as ort

from flexdsa_core.in_memory import InMemoryModel

__all__ = ["InternalGraphError", "UnloadableGraph", "load_refusal", "plain_reason"]


class InternalGraphError(RuntimeError):
    """No set of switched-off rewrites gives a graph ONNX Runtime loads: a bug of ours, not the user's."""


class UnloadableGraph(Exception):
    """A compile whose output ONNX Runtime cannot load (or a stage that failed building it)."""

    def __init__(self, comp, stage: str, reason: str, error: BaseException | None = None) -> None:
        super().__init__(f"{stage}: {reason}")
        self.comp = comp
        self.stage = stage
        self.reason = reason
        self.error = error


def load_refusal(model: ir.Model) -> str | None:
    """ONNX Runtime's reason for refusing to load ``model`` (first line, its prefix dropped), or None. A model
    whose weights live in external files is not checked here (validation loads it from its file)."""
    from flexdsa_core.ingest import needs_external_data

    if needs_external_data(model):
        return None
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.log_severity_level = 4
    try:
        InMemoryModel.from_ir(model, finished=False).session(options)
    except Exception as error:  # noqa: BLE001 - any refusal is the answer
        return plain_reason(error)
    return None


def plain_reason(error: BaseException) -> str:
    """The first line of an error, without ONNX Runtime's ``[ONNXRuntimeError] : 1 : FAIL :`` prefix."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : [A-Z_]+ : ", "", text)[:400]
