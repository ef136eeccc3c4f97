"""``softmax(s + K·m) → softmax(s + C·m)``: an attention mask's huge negative constant K (−10⁴, −10⁹, finfo.min,
−inf) replaced by a bounded C measured on the calibration samples, exact in fp32.

Where it sits, in the forms exporters write: ``Mul(Sub(1, Cast(mask)), K)`` (``(1 − mask)·finfo.min``),
``Where(mask, 0, K)`` and ``Where(cond, scores, K)``, a causal mask as a constant tensor of 0 and K added to the
scores, each possibly Unsqueezed/Expanded/Reshaped/Cast on its way to the Softmax (``_reach``).

Exactness. A softmax row is ``exp(z − max) / Σ exp(z − max)``; in float32, ``exp(t)`` is exactly 0 for every
``t < ln 2⁻¹⁵⁰ ≈ −103.97``. A masked position's input is ``z₀ + C·d`` (``z₀``: the input with the constant at 0,
``d ≥ 1``-ish: how many times the constant reaches it, the difference between the inputs with the constant at 0
and at −1). When ``z₀ + C·d − max < −104`` for every masked position, with ``max`` the row's unmasked maximum,
its term is 0 with C as it is with K, the row's maximum and sum are the same, and the Softmax output is bit for
bit the same. So ``C = −(104 + MARGIN + lead) / d`` at the worst masked position of the calibration samples
(``lead = z₀ − max``: how far a masked score stands above the row's unmasked maximum), rounded down. A sample
whose masked scores lead by more than the margin beyond what calibration saw gives a term below e⁻⁸⁴ of the
row's sum: still no change a float32 sum can hold. The one row this cannot keep is a row with no position left
to attend (an input whose mask is all zeros): the original's softmax of ``s + finfo.min`` is uniform (the
scores vanish in the rounding), the bounded one's is ``softmax(s)``; both are defined only by the constant's
size, and a real request always has a token to attend. Exploration checks every rewritten model against the
original on the calibration and held-out samples (fp32 tolerances), and the pipeline validates it again.

Why: a vendor quantiser that gives "scores + mask" one per-tensor int8 scale spends it on K. rknn-toolkit2 2.5.0
replaces −3.4e38 by −1e4 and quantises MiniLM-L6's ``scores + mask`` over −10,096..+45 (a step of 40): its w8a8
keeps a worst held-out sentence cosine of 0.16; with C = −126 the step is about 1 and the cosine 0.87
(its per-layer analysis: the fused attention's single-layer cosine 0.52-0.81 before, 0.985-0.996 after).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from flexdsa_core._libraries import get_numpy_value
from flexdsa_core.fusions._naming import fresh_name
from flexdsa_core.targets.forms import ExactForm, observe

BIG = -1e3  # a constant at or below this is a mask's "minus infinity"
LN_SMALLEST = 104.0  # exp(t) == 0 in float32 for t < -103.97
MARGIN = 20.0  # logits kept beyond the worst masked lead the calibration samples showed
MEASURED_SAMPLES = 64
# Constants the measurement runs the model with (``measure``): far below the scores (every masked term 0), above
# BIG (the probes' own constants are no site).
PROBES = (-400.0, -800.0)
# Ops a mask's constant may pass on its way to the Softmax, keeping it an added (or selected) term.
_CARRY = frozenset(
    {"Unsqueeze", "Expand", "Reshape", "Squeeze", "Transpose", "Identity", "Cast", "Concat", "Add"}
)
# Ops a 0/1 mask is made by from a boolean or integer tensor.
_BINARY = frozenset({"Cast", "Not", "Unsqueeze", "Expand", "Reshape", "Squeeze", "Transpose", "Identity",
                     "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or"})  # fmt: skip


def _big(value: ir.Value | None) -> np.ndarray | None:
    """The constant's array when every entry is a mask's minus infinity (<= BIG); else None."""
    array = get_numpy_value(value)
    if array is None or array.dtype.kind != "f" or array.size == 0:
        return None
    return array if bool(np.all(array <= BIG)) else None


def _reach(value: ir.Value, seen: set | None = None) -> str | None:
    """None when every use of ``value`` carries it, added or selected, into a Softmax's input (through
    ``_CARRY``, a Where branch, a Sub's first operand, a Mul or Div by a positive constant); else why not."""
    seen = set() if seen is None else seen
    if value.is_graph_output():
        return f"'{value.name}' is a graph output: the constant would be seen outside a Softmax"
    for node, index in value.uses():
        if id(node) in seen:
            continue
        seen.add(id(node))
        op = node.op_type
        if op == "Softmax":
            continue
        scale = (
            get_numpy_value(node.inputs[1 - index])
            if op in ("Mul", "Div") and len(node.inputs) == 2
            else None
        )
        positive = scale is not None and bool(np.all(scale > 0)) and (op == "Mul" or index == 0)
        if not (op in _CARRY or (op == "Where" and index > 0) or (op == "Sub" and index == 0) or positive):
            return f"'{value.name}' reaches {op} '{node.name}', which does not carry a mask into a Softmax unchanged"
        for out in node.outputs:
            reason = _reach(out, seen)
            if reason:
                return reason
    return None


def _binary(value: ir.Value | None, depth: int = 0) -> bool:
    """Whether ``value`` is a 0/1 mask: made from a boolean or integer tensor by casts, comparisons, reshapes
    and ``1 − x``."""
    if value is None or depth > 12:
        return False
    if value.dtype in (ir.DataType.BOOL, ir.DataType.INT64, ir.DataType.INT32) and value.producer() is None:
        return True
    producer = value.producer()
    if producer is None:
        return False
    if producer.op_type == "Sub" and get_numpy_value(producer.inputs[0]) is not None:
        one = get_numpy_value(producer.inputs[0])
        return bool(np.all(one == 1)) and _binary(producer.inputs[1], depth + 1)
    if producer.op_type in _BINARY:
        data = [v for v in producer.inputs if v is not None and get_numpy_value(v) is None]
        return bool(data) and all(_binary(v, depth + 1) for v in data)
    return False


class _BoundedMask(RewriteRuleClassBase):
    """The shared check: a constant of minus infinities that reaches a Softmax only as an added or selected
    term. ``constant`` is C (set by ``measure``); ``roles`` names the new nodes (none: the site keeps its node)."""

    constant: ClassVar[float] = -1.0
    roles: ClassVar[dict] = {}

    @classmethod
    def describe(cls, site: str) -> str:
        return f"mask constant {cls.constant:g}"

    def _checked(self, context, node: ir.Node, big: ir.Value) -> MatchResult:
        result = MatchResult()
        if big.name.endswith("_bounded"):
            return result.fail(f"'{node.name}': '{big.name}' is a bounded constant already.")
        if _big(big) is None:
            return result.fail(
                f"'{node.name}': '{big.name}' is not a constant of minus infinities (<= {BIG:g})."
            )
        reason = _reach(node.outputs[0])
        if reason:
            return result.fail(f"'{node.name}': {reason}.")
        self._name = fresh_name(context.graph_or_function, f"{big.name}_bounded")
        return result

    def _bounded(self, op, big: ir.Value) -> ir.Value:
        array = get_numpy_value(big)
        bounded = np.where(array <= BIG, np.asarray(self.constant, array.dtype), array).astype(array.dtype)
        return op.initializer(ir.tensor(bounded, name=self._name))


class MaskTimesConstant(_BoundedMask):
    """``Mul(m, K) → Mul(m, C)`` for a 0/1 mask ``m`` (``1 − Cast(attention_mask)``, unsqueezed)."""

    def pattern(self, op, mask, big):
        return op.Mul(mask, big, _outputs=["masked"])

    def check(self, context, mask, big, masked, **_) -> MatchResult:
        node = masked.producer()
        if not _binary(mask):
            return MatchResult().fail(
                f"'{node.name}': '{mask.name}' is not a 0/1 mask made from a boolean or integer tensor."
            )
        return self._checked(context, node, big)

    def rewrite(self, op, mask, big, **_):
        return op.Mul(mask, self._bounded(op, big))


class _WhereConstant(_BoundedMask):
    """``Where(c, x, K) → Where(c, x, C)`` (``in_false``) or ``Where(c, K, x) → Where(c, C, x)``."""

    in_false: ClassVar[bool] = True

    def pattern(self, op, cond, a, b):
        return op.Where(cond, a, b, _outputs=["selected"])

    def check(self, context, cond, a, b, selected, **_) -> MatchResult:
        return self._checked(context, selected.producer(), b if self.in_false else a)

    def rewrite(self, op, cond, a, b, **_):
        if self.in_false:
            return op.Where(cond, a, self._bounded(op, b))
        return op.Where(cond, self._bounded(op, a), b)


class WhereElseConstant(_WhereConstant):
    """``Where(c, x, K) → Where(c, x, C)``: a masked fill of the scores, or of a 0 mask."""


class WhereThenConstant(_WhereConstant):
    """``Where(c, K, x) → Where(c, C, x)``: the same with the condition the other way round."""

    in_false = False


class AddConstantMask(_BoundedMask):
    """``Add(s, M) → Add(s, M')``: a constant mask tensor (a causal mask) of 0 and K, its K entries made C."""

    def pattern(self, op, scores, mask):
        return op.Add(scores, mask, _outputs=["masked"])

    def check(self, context, scores, mask, masked, **_) -> MatchResult:
        node = masked.producer()
        array = get_numpy_value(mask)
        if array is None or array.dtype.kind != "f" or array.size < 2 or mask.name.endswith("_bounded"):
            return MatchResult().fail(f"'{node.name}': '{mask.name}' is not a constant mask tensor.")
        if not (bool(np.any(array <= BIG)) and bool(np.all((array <= BIG) | (array == 0)))):
            return MatchResult().fail(f"'{node.name}': '{mask.name}' is not made of 0 and minus infinities.")
        reason = _reach(masked)
        if reason:
            return MatchResult().fail(f"'{node.name}': {reason}.")
        self._name = fresh_name(context.graph_or_function, f"{mask.name}_bounded")
        return MatchResult()

    def rewrite(self, op, scores, mask, **_):
        return op.Add(scores, self._bounded(op, mask))


RULES = (MaskTimesConstant, WhereElseConstant, WhereThenConstant, AddConstantMask)


def _with_constant(constant: float) -> list[type[_BoundedMask]]:
    return [type(rule.__name__, (rule,), {"constant": float(constant), "roles": {}}) for rule in RULES]


def _softmax_inputs(model: ir.Model, sites: list[str]) -> list[tuple[str, int]]:
    """(input name, axis) of every Softmax the rewritten sites reach."""
    nodes = {node.name: node for node in model.graph}
    found, pending, seen = {}, [nodes[s].outputs[0] for s in sites if s in nodes], set()
    while pending:
        value = pending.pop()
        for node, _ in value.uses():
            if id(node) in seen:
                continue
            seen.add(id(node))
            if node.op_type == "Softmax":
                found[node.inputs[0].name] = node.attributes.get_int("axis", -1)
            else:
                pending.extend(node.outputs)
    return list(found.items())


def measure(model: ir.Model, samples: list[dict]) -> tuple[list, dict]:
    """C from the calibration samples (module docstring). The model is run with the constant at ``PROBES``,
    both far enough below the scores that every masked term is 0 (so every layer computes what the original
    does, and the rewrite's own constants are never matched again): a masked position's multiplier is ``d = (z₁ − z₂) / (P₂ − P₁)`` and its score ``z₁ − P₁·d``. (A
    constant of 0 would let the first attention see padding, and every later layer's scores would differ.)"""
    samples = samples[:MEASURED_SAMPLES]
    probes, sites, refused = [], [], {}
    for constant in PROBES:
        probe = model.clone()
        applied = ExactForm(
            FORM.name, FORM.summary, "", lambda m, s, c=constant: (_with_constant(c), {})
        ).apply(probe, [])
        probes.append(probe)
        sites, refused = sorted(applied.sites), applied.refused
    if not sites:
        return [], {
            "detail": "no attention-mask constant of minus infinities reaching a Softmax",
            "refused": refused,
        }
    softmaxes = _softmax_inputs(probes[0], sites)
    if not softmaxes:
        return [], {"detail": "the mask constants reach no Softmax"}
    names = [name for name, _ in softmaxes]
    first, second = (observe(p, names, samples) for p in probes)
    lead, per_unit, masked = -math.inf, math.inf, 0
    required = math.inf  # C must be below -(LN_SMALLEST + MARGIN + lead) / d at every masked position
    for sample_first, sample_second in zip(first, second, strict=True):
        for name, axis in softmaxes:
            z1, z2 = sample_first[name].astype(np.float64), sample_second[name].astype(np.float64)
            d = (z1 - z2) / (PROBES[0] - PROBES[1])
            hidden = d > 1e-3
            scores = z1 - PROBES[0] * d
            unmasked_max = np.max(np.where(hidden, -np.inf, scores), axis=axis, keepdims=True)
            rows = np.isfinite(unmasked_max) & hidden
            if not rows.any():
                continue
            gap = (scores - unmasked_max)[rows]
            masked += int(rows.sum())
            lead = max(lead, float(gap.max()))
            per_unit = min(per_unit, float(d[rows].min()))
            required = min(required, float((-(LN_SMALLEST + MARGIN + gap) / d[rows]).min()))
    if not masked:
        return [], {"detail": "no masked position beside an unmasked one in the calibration samples: the scores "
                              "a bounded constant must stay beyond could not be measured"}  # fmt: skip
    constant = math.floor(min(required, -(LN_SMALLEST + MARGIN)))
    measured = {"constant": constant, "masked_positions": masked, "largest_masked_lead": round(lead, 3),
                "smallest_multiplier": round(per_unit, 6), "softmax_inputs": names, "samples": len(samples),
                "rule": f"C = -({LN_SMALLEST:g} + {MARGIN:g} + lead) / multiplier at the worst masked position"}  # fmt: skip
    return _with_constant(constant), measured


FORM = ExactForm(
    name="bounded_attention_mask",
    summary="Attention mask's minus-infinity constant → a bounded one measured on the samples (exact in fp32)",
    site_suffix="/bounded_mask",
    measure=measure,
)
