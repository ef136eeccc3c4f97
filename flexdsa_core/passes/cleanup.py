"""``cse`` and ``dead_code``: onnx_ir's common-subexpression elimination and unused-code removal, under
the stable names users switch them off by."""

from __future__ import annotations

import onnx_ir as ir
import onnx_ir.passes.common as common_passes


class CommonSubexpressionEliminationPass(common_passes.CommonSubexpressionEliminationPass):
    """Two nodes with the same op, attributes and inputs → one (graph outputs keep their names)."""

    name = "cse"


class DeadCodeEliminationPass(ir.passes.InPlacePass):
    """Nodes and initializers nothing reads, functions nothing calls, opsets nothing uses → removed."""

    name = "dead_code"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for pass_ in (
            common_passes.RemoveUnusedNodesPass(),
            common_passes.RemoveUnusedFunctionsPass(),
            common_passes.RemoveUnusedOpsetsPass(),
        ):
            modified = pass_(model).modified or modified
        return ir.passes.PassResult(model, modified)
