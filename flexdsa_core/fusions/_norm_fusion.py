"""``NormFusion``: what the LayerNormalization and RMSNormalization rules share, the fused op's scale (the
match's, or one made of ones) and the opset import the fused op needs."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from flexdsa_core.fusions._norm_checks import ones_scale, vector_refusal
from flexdsa_core.fusions._opset_upgrade import OpsetUpgrade


class NormFusion(pattern.RewriteRuleClassBase):
    """A normalisation rule's common part: with ``scaled``, the match's scale must be a vector over the
    normalised axis; without, a scale of ones is made (``ones_scale``). The fused op ``op_type`` needs opset
    ``opset`` imported (``OpsetUpgrade``: refused where raising it would change the model's meaning)."""

    def __init__(self, name: str, *, scaled: bool, root: str, opset: int, op_type: str) -> None:
        super().__init__(name)
        self._scaled = scaled
        self._root = root
        self._upgrade = OpsetUpgrade(opset, op_type)
        self._ones: tuple[str, np.ndarray] | str | None = None

    def scale_refusal(self, context, scale: ir.Value, x: ir.Value) -> tuple[str, ir.Value | None] | None:
        """Why the match cannot become the fused op as far as its scale and the opset go (and the value at
        fault), or None. Checked last, after the rule's own checks."""
        if self._scaled and (reason := vector_refusal("scale", scale, x)) is not None:
            return reason, scale
        if not self._scaled:
            self._ones = ones_scale(context, x)
            if isinstance(self._ones, str):
                return self._ones, None
        if (reason := self._upgrade.refusal(context)) is not None:
            return reason, None
        return None

    def fused_scale(self, op, scale):
        """The fused op's scale: the match's, or the ones the check made; the opset upgrade is now due."""
        self._upgrade.mark_rewritten()
        if self._scaled:
            return scale
        name, ones = self._ones
        return op.initializer(ir.tensor(ones), name=name)

    def cleanup(self):
        self._upgrade.finish()
