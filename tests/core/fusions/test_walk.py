"""The walk of a fusion rule's variants (``fusions/walk.py``): which variants it tries where."""

from __future__ import annotations

from dataclasses import dataclass

import onnx
import onnx_ir as ir
from onnxscript.rewriter import RewriteRule

from flexdsa_core.fusions import walk


@dataclass
class _Taken:
    taken: bool = True


def _model() -> ir.Model:
    return ir.serde.deserialize_model(onnx.parser.parse_model(
        """
        <ir_version: 9, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] z)
        {
            y = Neg (x)
            z = Relu (y)
        }
        """
    ))  # fmt: skip


def test_a_variant_is_tried_only_where_the_model_holds_every_op_it_needs(monkeypatch):
    """A variant whose pattern holds an op type the model lacks (``Sigmoid``) is never tried, even at a node of
    its root's type; one whose op type an earlier rewrite of the same walk made (``Abs``) is tried after it,
    and matches."""
    neg_to_abs = RewriteRule(lambda op, x: op.Neg(x), lambda op, x: op.Abs(x), name="neg_to_abs")
    relu_of_abs = RewriteRule(lambda op, x: op.Relu(op.Abs(x)), lambda op, x: op.Abs(x), name="relu_of_abs")
    relu_of_sigmoid = RewriteRule(lambda op, x: op.Relu(op.Sigmoid(x)), lambda op, x: op.Sigmoid(x), name="sig")
    tried: list[str] = []
    plain = RewriteRule.try_rewrite

    def counted(self, *args, **kwargs):
        tried.append(self.name)
        return plain(self, *args, **kwargs)

    monkeypatch.setattr(RewriteRule, "try_rewrite", counted)
    model = _model()
    decisions = walk.drive(model, [neg_to_abs, relu_of_sigmoid, relu_of_abs], lambda rule, delta: _Taken(),
                           rule_name="test")  # fmt: skip
    assert tried == ["neg_to_abs", "relu_of_abs"]  # Neg, then Relu; never the Sigmoid variant
    assert len(decisions) == 2
    assert [node.op_type for node in model.graph] == ["Abs"]
