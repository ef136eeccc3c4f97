"""Rotary position embedding written out (LLaMA/GPT-NeoX style, halves rotated) → ``com.microsoft::RotaryEmbedding``.

    cos, sin   = Unsqueeze(Gather(cos_cache, position_ids), 1), same for sin      # [B, 1, S, Dh]
                 or Unsqueeze(cos_cache[s0 : s0 + S], [0, 1])  (positions s0, s0+1, ...)  # [1, 1, S, Dh]
    rotate(x)  = Concat(-x[..., Dh/2:], x[..., :Dh/2], axis=-1)
    y          = x * cos + rotate(x) * sin                                           # x: [B, H, S, Dh]

The exporters' caches hold each frequency twice (``cat(freqs, freqs)``, [P, Dh]); ONNX Runtime's op takes
the [P, Dh/2] half, which the rule stores as a new initializer (one per cache, shared by the layers
that use it), and refuses caches whose halves differ (another rotation layout). ONNX Runtime wants
position ids of shape [B, S], so ids broadcast over the batch ([1, S]) are expanded first; rows sliced
from s0 become its 1-element form, the offset s0. (A computed slice end is taken to be s0 + S: x * cos
broadcasts only over S rows or one, and one row for a longer sequence is no rotary embedding.) Its CPU kernel is used in float32 here. Interleaved
(GPT-J) and partial rotation are not matched.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import pattern

from flexdsa_core._libraries import get_numpy_value
from flexdsa_core.fusions._shape_values import outside_use_refusal, shape_entries
from flexdsa_core.fusions.base import make_rule

_LAST_AXIS = (-1, 3)


def _const_ints(value: ir.Value | None) -> list[int] | None:
    array = get_numpy_value(value)
    return None if array is None else [int(v) for v in array.reshape(-1)]


def _cache_rows(value: ir.Value) -> tuple[ir.Node, ir.Value] | None:
    """(the Gather or Slice node, the cache) when ``value`` is Unsqueeze(Gather|Slice(cache, ...))."""
    unsqueeze = value.producer()
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze":
        return None
    rows = unsqueeze.inputs[0].producer() if unsqueeze.inputs[0] is not None else None
    if rows is None or rows.op_type not in ("Gather", "Slice"):
        return None
    return rows, rows.inputs[0]


def _slice_bounds(node: ir.Node, known: dict) -> tuple[int, int] | None:
    """(start, end) of a Slice over the last axis with step 1, else None. The bounds may be computed
    from the input's shape (``x.shape[-1] // 2``, as exporters write with dynamic shapes)."""
    inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
    starts, ends = shape_entries(inputs[1], known), shape_entries(inputs[2], known)
    axes = _const_ints(inputs[3]) if inputs[3] is not None else [0]
    steps = _const_ints(inputs[4]) if inputs[4] is not None else [1]
    if None in (starts, ends, axes, steps) or len(starts) != 1 or len(ends) != 1:
        return None
    if axes[0] not in _LAST_AXIS or steps != [1] or None in (starts[0], ends[0]):
        return None
    return starts[0], ends[0]


class RotaryEmbeddingFusion(pattern.RewriteRuleClassBase):
    """Add(Mul(x, cos), Mul(Concat(Neg(x[..., h:]), x[..., :h]), sin)) → com.microsoft::RotaryEmbedding(x, position_ids, cos_half, sin_half)"""

    def __init__(self):
        # remove_nodes=False: Shape nodes may read x's halves' bounds; the check allows only such uses,
        # and the cos/sin rows, shared by every layer, go once the last layer is fused (dead-node sweep).
        super().__init__("RotaryEmbeddingFusion", remove_nodes=False)

    def pattern(self, op, x, cos, sin):
        # cos and sin stay inputs of the pattern: every layer shares them, so they are read, not replaced.
        first_half = op.Slice(x, _allow_other_inputs=True, _outputs=["first_half"])
        second_half = op.Slice(x, _allow_other_inputs=True, _outputs=["second_half"])
        rotated = op.Concat(op.Neg(second_half), first_half, _outputs=["rotated"])
        return op.Add(op.Mul(x, cos), op.Mul(rotated, sin))

    def check(self, context, x, cos, sin, **bindings) -> pattern.MatchResult:
        result = pattern.MatchResult()
        if x.dtype != ir.DataType.FLOAT or x.shape is None or x.shape.rank() != 4:
            return result.fail(f"Input '{x.name}' is not known to be a 4-D float32 [B, H, S, Dh] tensor.", x)
        sources = _cache_rows(cos), _cache_rows(sin)
        if None in sources or sources[0][0].op_type != sources[1][0].op_type:
            return result.fail(
                "cos and sin are not both Unsqueeze(Gather(cache, ids)) or Unsqueeze(cache[s0:s0+S])."
            )
        (cos_rows, cos_cache), (sin_rows, sin_cache) = sources
        self._rows = "gather" if cos_rows.op_type == "Gather" else "slice"
        self._caches = (cos_cache, sin_cache)
        caches = []
        for cache in (cos_cache, sin_cache):
            array = None if cache.is_graph_input() else get_numpy_value(cache)
            if array is None or array.ndim != 2 or array.dtype != np.float32 or array.shape[1] % 2:
                return result.fail(
                    f"The cache '{cache.name}' is not a constant float32 [P, Dh] table.", cache
                )
            half = array.shape[1] // 2
            if not np.array_equal(array[:, :half], array[:, half:]):
                return result.fail(
                    f"The cache '{cache.name}' does not repeat its frequencies in both halves.", cache
                )
            caches.append(array[:, :half])
        head_size = caches[0].shape[1] * 2
        if caches[0].shape != caches[1].shape or (isinstance(x.shape[3], int) and x.shape[3] != head_size):
            return result.fail("The cos and sin caches do not fit each other and the head size.")
        if (reason := self._rows_refusal(x, cos, sin, cos_rows, sin_rows)) is not None:
            return result.fail(reason)
        if (reason := outside_use_refusal(context)) is not None:
            return result.fail(reason)
        known = {x: [None, None, None, head_size]}
        if _slice_bounds(bindings["first_half"].producer(), known) != (0, head_size // 2):
            return result.fail("The first slice is not x[..., :Dh/2].")
        second = _slice_bounds(bindings["second_half"].producer(), known)
        if second is None or second[0] != head_size // 2 or second[1] < head_size:
            return result.fail("The second slice is not x[..., Dh/2:].")
        if bindings["rotated"].producer().attributes.get_int("axis", 0) not in _LAST_AXIS:
            return result.fail("The halves are not concatenated on the last axis.")
        self._half_caches = caches
        if self._rows == "slice":
            return result
        position_ids = cos_rows.inputs[1]
        if sin_rows.inputs[1] is not position_ids:
            return result.fail("cos and sin are gathered at different position ids.")
        self._position_ids = position_ids
        if (
            position_ids.dtype != ir.DataType.INT64
            or position_ids.shape is None
            or position_ids.shape.rank() != 2
        ):
            return result.fail(
                f"The position ids '{position_ids.name}' are not known to be int64 [B, S].", position_ids
            )
        self._expand_ids = position_ids.shape[0] != x.shape[0]
        self._ids_shape = (x.shape[0], position_ids.shape[1])
        return result

    def _rows_refusal(self, x, cos, sin, cos_rows, sin_rows) -> str | None:
        """None when cos and sin are the cache rows at the positions, shaped [B|1, 1, S, Dh]."""
        expected_axes = [1] if self._rows == "gather" else [0, 1]
        for name, value in (("cos", cos), ("sin", sin)):
            unsqueeze = value.producer()
            axes = _const_ints(unsqueeze.inputs[1]) if len(unsqueeze.inputs) > 1 else None
            if axes is None and "axes" in unsqueeze.attributes:
                axes = list(unsqueeze.attributes["axes"].as_ints())
            if axes != expected_axes:
                return f"The {name} rows are unsqueezed at {axes}, not at {expected_axes}."
        rows = [cos_rows, sin_rows]
        if self._rows == "gather":
            if any(node.attributes.get_int("axis", 0) != 0 for node in rows):
                return "The cache rows are not gathered along the positions axis."
            return None
        # Slice(cache, starts, ends[, axes][, steps]) over the positions axis from a constant start.
        bounds = []
        for node in rows:
            inputs = list(node.inputs) + [None] * (5 - len(node.inputs))
            start = _const_ints(inputs[1])
            axes = _const_ints(inputs[3]) if inputs[3] is not None else [0]
            steps = _const_ints(inputs[4]) if inputs[4] is not None else [1]
            if start is None or len(start) != 1 or start[0] < 0 or axes != [0] or steps != [1]:
                return "The cache rows are not a slice from a constant position along the positions axis."
            end = _const_ints(inputs[2])
            length = x.shape[2]
            # A computed end is the sequence length the Mul with x needs (the exporters' cache[:seq]).
            if end is not None and isinstance(length, int) and end != [start[0] + length]:
                return f"The cache rows {start[0]}:{end[0]} are not the {length} positions of the sequence."
            bounds.append((start[0], inputs[2]))
        if bounds[0][0] != bounds[1][0]:
            return "The cos and sin rows start at different positions."
        self._offset = bounds[0][0]
        return None

    def setup(self):
        self._shared: dict[ir.Value, ir.Value] = {}

    def _half(self, op, cache: ir.Value, array: np.ndarray) -> ir.Value:
        half = self._shared.get(cache)
        if half is None or half.graph is None:  # reuse only what an accepted rewrite put in the graph
            half = op.initializer(ir.tensor(np.ascontiguousarray(array)), name=f"{cache.name}__half")
            self._shared[cache] = half
        return half

    def rewrite(self, op, x, **_):
        cos_cache, sin_cache = self._caches
        position_ids = None if self._rows == "slice" else self._position_ids
        if self._rows == "slice":
            position_ids = op.Constant(value_ints=[self._offset])
        elif self._expand_ids and all(isinstance(d, int) for d in self._ids_shape):
            position_ids = op.Expand(position_ids, op.Constant(value_ints=list(self._ids_shape)))
        elif self._expand_ids:
            batch = op.Shape(x, start=0, end=1)
            length = op.Shape(position_ids, start=1, end=2)
            position_ids = op.Expand(position_ids, op.Concat(batch, length, axis=0))
        return op.RotaryEmbedding(
            x,
            position_ids,
            self._half(op, cos_cache, self._half_caches[0]),
            self._half(op, sin_cache, self._half_caches[1]),
            interleaved=0,
            _domain="com.microsoft",
        )


RULES = [
    make_rule(
        "rotary",
        "Rotary embedding written as x * cos + rotate_half(x) * sin → com.microsoft::RotaryEmbedding",
        ["com.microsoft::RotaryEmbedding"],
        RotaryEmbeddingFusion.rule().commute(),
        opset_imports={"com.microsoft": 1},
        # after the norms and activations around the attention block it sits in
        after=("silu", "skip_layer_norm", "skip_rms_norm"),
    )
]
