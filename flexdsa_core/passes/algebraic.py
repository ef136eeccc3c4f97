"""``algebraic_simplification``: rewrite chains into shorter equivalent ones.

Each rule is an onnxscript pattern rewrite with its numerics argued in its docstring:

* ``Transpose(Transpose(x, p1), p2) → Transpose(x, p1∘p2)``, ``Reshape(Reshape(x, s1), s2) → Reshape(x, s2)``
  and ``Unsqueeze∘Unsqueeze`` (onnxscript's rules): pure data movement, exact.
* ``Cast(Cast(x, T2), T3) → Cast(x, T3)`` only when T1 → T2 is lossless (every T1 value exists in T2),
  so the second cast sees the same number either way: exact.
* ``Neg(Neg(x)) → x``: exact (also for integers, where negation wraps).
* ``(x * a) * b → x * (a*b)`` and ``(x + a) + b → x + (a+b)`` for constants a, b: exact for integers
  (wrapping arithmetic is associative); for floats one rounding moves (≤ 1 ulp). Refused when a*b
  overflows or underflows to 0, or when a+b cancels (|a|+|b| > 1024·|a+b|), where the moved rounding
  could be large.
* ``Sub(x, c) → Add(x, -c)`` (float and signed int): negation is exact, so x - c == x + (-c).
* ``Div(x, c) → Mul(x, 1/c)`` for floats: exact when every c is a power of two; otherwise only for
  float32/float64, where 1/c and the product add at most ~1 ulp. Integer Div is never touched.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase, RewriteRuleSet
from onnxscript.rewriter.rules.common import (
    reshape_reshape_rule,
    transpose_transpose_rule,
    unsqueeze_unsqueeze_rule,
)

from flexdsa_core._libraries import rule_root_op_type
from flexdsa_core.passes._values import is_float, small_constant
from flexdsa_core.passes.no_op import bypass_no_ops

_D = ir.DataType
_FLOAT_CHAIN = [(_D.FLOAT16, _D.FLOAT), (_D.BFLOAT16, _D.FLOAT), (_D.FLOAT, _D.DOUBLE), (_D.FLOAT16, _D.DOUBLE),
                (_D.BFLOAT16, _D.DOUBLE)]  # fmt: skip
_EXACT_IN_FLOAT16 = {_D.INT8, _D.UINT8, _D.BOOL}
_EXACT_IN_FLOAT = {_D.INT8, _D.UINT8, _D.INT16, _D.UINT16, _D.BOOL}
_EXACT_IN_DOUBLE = _EXACT_IN_FLOAT | {_D.INT32, _D.UINT32}
_SIGNED = [_D.INT8, _D.INT16, _D.INT32, _D.INT64]
_UNSIGNED = [_D.UINT8, _D.UINT16, _D.UINT32, _D.UINT64]


def cast_is_lossless(source: ir.DataType, target: ir.DataType) -> bool:
    """Whether every value of ``source`` is exactly representable in ``target``."""
    if source == target or (source, target) in _FLOAT_CHAIN:
        return True
    if target == _D.FLOAT16:
        return source in _EXACT_IN_FLOAT16
    if target == _D.FLOAT:
        return source in _EXACT_IN_FLOAT
    if target == _D.DOUBLE:
        return source in _EXACT_IN_DOUBLE
    if source == _D.BOOL:
        return target in _SIGNED or target in _UNSIGNED
    if target in _SIGNED and source in _SIGNED:
        return _SIGNED.index(source) < _SIGNED.index(target)
    if target in _UNSIGNED and source in _UNSIGNED:
        return _UNSIGNED.index(source) < _UNSIGNED.index(target)
    if target in _SIGNED and source in _UNSIGNED:
        return _UNSIGNED.index(source) < _SIGNED.index(target)
    return False


class CastCast(RewriteRuleClassBase):
    """Cast(Cast(x, to=T2), to=T3) → Cast(x, to=T3) when x's type converts to T2 losslessly."""

    def pattern(self, op, x, to, to_inner):
        return op.Cast(op.Cast(x, to=to_inner), to=to)

    def check(self, context, x: ir.Value, to: ir.Attr, to_inner: ir.Attr) -> MatchResult:
        result = MatchResult()
        if x.dtype is None:
            return result.fail(f"The element type of '{x.name}' is unknown.")
        inner = ir.DataType(to_inner.as_int())
        if not cast_is_lossless(x.dtype, inner):
            return result.fail(f"Casting {x.dtype.name} to {inner.name} loses values; both casts are needed.")
        return result

    def rewrite(self, op, x: ir.Value, to: ir.Attr, to_inner: ir.Attr):
        return op.Cast(x, to=to.as_int())


class NegNeg(RewriteRuleClassBase):
    """Neg(Neg(x)) → x."""

    def pattern(self, op, x):
        return op.Neg(op.Neg(x))

    def rewrite(self, op, x: ir.Value):
        return op.Identity(x)


def _constant_pair(a: ir.Value, b: ir.Value, x: ir.Value, result: MatchResult):
    if x.const_value is not None:
        return None, None, result.fail(f"'{x.name}' is itself constant: a job for constant folding.")
    a_value, b_value = small_constant(a), small_constant(b)
    if a_value is None or b_value is None:
        return None, None, result.fail("Both coefficients must be small constants.")
    if a_value.dtype != b_value.dtype or a.dtype != x.dtype:
        return None, None, result.fail("The coefficients and the data differ in element type.")
    return a_value, b_value, result


def _coefficient(op, array: np.ndarray):
    return op.Constant(value=ir.tensor(np.asarray(array)))


class _ConstantChain(RewriteRuleClassBase):
    """(x ∘ a) ∘ b → x ∘ (a ∘ b) for a commutative, associative ∘ and constants a, b."""

    op_type: str = ""

    def pattern(self, op, x, a, b):
        make = getattr(op, self.op_type)
        return make(make(x, a), b)

    def combine(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def numerics_problem(self, a: np.ndarray, b: np.ndarray, combined: np.ndarray) -> str | None:
        raise NotImplementedError

    def check(self, context, x: ir.Value, a: ir.Value, b: ir.Value) -> MatchResult:
        a_value, b_value, result = _constant_pair(a, b, x, MatchResult())
        if a_value is None:
            return result
        with np.errstate(all="ignore"):
            combined = self.combine(a_value, b_value)
        if np.issubdtype(combined.dtype, np.floating):
            problem = self.numerics_problem(a_value, b_value, combined)
            if problem:
                return result.fail(problem)
        self._combined = combined
        return result

    def rewrite(self, op, x: ir.Value, a: ir.Value, b: ir.Value):
        return getattr(op, self.op_type)(x, _coefficient(op, self._combined))


class MulMulConstant(_ConstantChain):
    """Mul(Mul(x, a), b) → Mul(x, a*b)."""

    op_type = "Mul"

    def combine(self, a, b):
        return np.multiply(a, b)

    def numerics_problem(self, a, b, combined):
        finite = np.isfinite(a) & np.isfinite(b)
        if np.any(finite & ~np.isfinite(np.broadcast_to(combined, np.broadcast(a, b).shape))):
            return "a*b overflows where (x*a)*b might not."
        if np.any((a != 0) & (b != 0) & (combined == 0)):
            return "a*b underflows to 0 where (x*a)*b might not."
        return None


class AddAddConstant(_ConstantChain):
    """Add(Add(x, a), b) → Add(x, a+b)."""

    op_type = "Add"

    def combine(self, a, b):
        return np.add(a, b)

    def numerics_problem(self, a, b, combined):
        with np.errstate(all="ignore"):
            magnitude = np.abs(a) + np.abs(b)
        if np.any(np.isfinite(magnitude) & ~np.isfinite(combined)):
            return "a+b overflows."
        if np.any(magnitude > 1024 * np.abs(combined)):
            return "a+b cancels; (x+a)+b and x+(a+b) would round differently."
        return None


class SubConstantToAdd(RewriteRuleClassBase):
    """Sub(x, c) → Add(x, -c)."""

    def pattern(self, op, x, c):
        return op.Sub(x, c)

    def check(self, context, x: ir.Value, c: ir.Value) -> MatchResult:
        result = MatchResult()
        value = small_constant(c)
        if value is None or x.const_value is not None:
            return result.fail("The subtrahend is not a small constant (or both sides are).")
        if not (is_float(c.dtype) or (c.dtype is not None and c.dtype.is_signed())):
            return result.fail(f"Negation of {c.dtype} constants is not exact.")
        self._negated = np.negative(value)
        return result

    def rewrite(self, op, x: ir.Value, c: ir.Value):
        return op.Add(x, _coefficient(op, self._negated))


_NON_EXACT_RECIPROCAL_OK = {_D.FLOAT, _D.DOUBLE}


class DivConstantToMul(RewriteRuleClassBase):
    """Div(x, c) → Mul(x, 1/c) when exact (c a power of two) or within float32/float64 rounding."""

    def pattern(self, op, x, c):
        return op.Div(x, c)

    def check(self, context, x: ir.Value, c: ir.Value) -> MatchResult:
        result = MatchResult()
        value = small_constant(c)
        if value is None or x.const_value is not None:
            return result.fail("The divisor is not a small constant (or both sides are).")
        if not is_float(c.dtype):
            return result.fail("Integer division truncates; it has no reciprocal form.")
        if np.any(value == 0) or not np.all(np.isfinite(value)):
            return result.fail("The divisor has zeros or non-finite values.")
        with np.errstate(all="ignore"):
            reciprocal = (np.ones_like(value) / value).astype(value.dtype)
        if not np.all(np.isfinite(reciprocal)) or np.any(reciprocal == 0):
            return result.fail("1/c overflows or underflows.")
        mantissa, _ = np.frexp(np.abs(value.astype(np.float64)))
        exact = bool(np.all(mantissa == 0.5))
        if not exact and c.dtype not in _NON_EXACT_RECIPROCAL_OK:
            return result.fail(f"1/c is not exact in {c.dtype.name}, whose rounding is too coarse to move.")
        self._reciprocal = reciprocal
        return result

    def rewrite(self, op, x: ir.Value, c: ir.Value):
        return op.Mul(x, _coefficient(op, self._reciprocal))


def algebraic_rules() -> RewriteRuleSet:
    return RewriteRuleSet(
        [
            transpose_transpose_rule,
            reshape_reshape_rule,
            unsqueeze_unsqueeze_rule,
            CastCast.rule(),
            NegNeg.rule(),
            *MulMulConstant.rule().commute(),
            *AddAddConstant.rule().commute(),
            SubConstantToAdd.rule(),
            DivConstantToMul.rule(),
        ]
    )


class AlgebraicSimplificationPass(ir.passes.InPlacePass):
    """Apply ``algebraic_rules`` then drop the Identity nodes they leave (graph output names kept)."""

    name = "algebraic_simplification"

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        # Only the rules whose pattern ends at an op type the model holds: a rule ending elsewhere cannot
        # match, and onnxscript would still try every rule on every node (a third of this pass's time on
        # MobileNetV2, swept up to 8 times). What a rewrite adds is seen by the next sweep.
        present = _op_types(model)
        rules = [rule for rule in algebraic_rules().rules if rule_root_op_type(rule) in present | {None}]
        count = RewriteRuleSet(rules).apply_to_model(model) if rules else 0
        if count:
            # Not onnx_ir's IdentityEliminationPass: it cannot bypass an Identity that forwards an
            # outer-scope value to a subgraph output.
            bypass_no_ops(model, frozenset({"Identity"}))
        return ir.passes.PassResult(model, bool(count))


def _op_types(model: ir.Model) -> set[str]:
    """The op types of every node: the main graph, its subgraphs and the model-local functions."""
    found: set[str] = set()
    pending: list[ir.Graph | ir.Function] = [model.graph, *model.functions.values()]
    while pending:
        for node in pending.pop():
            found.add(node.op_type)
            for attr in node.attributes.values():
                if attr.type == ir.AttributeType.GRAPH:
                    pending.append(attr.value)
                elif attr.type == ir.AttributeType.GRAPHS:
                    pending.extend(attr.value)
    return found
