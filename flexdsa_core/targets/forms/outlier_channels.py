"""``f(x·Wu + bu)·Wd + bd → bulk + outliers``: a feed-forward block whose few outlier channels swamp a per-tensor
int8 scale, split so that the channels no scale can share travel on a path of their own, exact in fp32 up to
the order of a sum.

With ``I`` the hidden channels (``h = f(u)``, ``u = x·Wu + bu``) whose range dwarfs the others' and ``O`` the output
channels that do so in what is left::

    bulk     = f(x·Wu_I0 + bu_I0)·Wd_I0O0 + bd_O0         (Wu_I0, bu_I0: columns I zeroed; Wd_I0O0: rows I, columns O)
    outliers = Concat(f(x·Wu[:, I] + bu[I]),  f(x·Wu_I0 + bu_I0)·Wd_I0[:, O] + bd[O]) · [[Wd[I, :]], [E_O]]
    y        = bulk + outliers                            (E_O: one-hot rows placing each O channel)

Every output channel is the same sum of the same products as before (the hidden channels ``I`` of the bulk hold
``f(0)``, multiplied by zero rows; ``E_O`` adds a 0 or moves a value): only the order of the terms changes. ``f``
is any chain of element-wise ops with scalar constants (erf/tanh GELU, ReLU, SiLU...).

Why: a vendor that quantises each activation tensor with one int8 scale (rknn-toolkit2: w8a8, per-layer
activations) spends it on the outliers. MiniLM-L6's first FFN: one of 1,536 GELU channels reaches 24.6 where the
median channel peaks at 1.0, and it drives output channel 99 to 194 where the median peaks at 0.85: a step of 0.8
for values near 1 (rknn's per-layer analysis: the down projection at single-layer cosine 0.983, the next norm
0.94). Split, the bulk stays int8 and the few outlier channels take a path small enough to keep float16 for next
to nothing (``float16`` roles: the toolkit's cycles for MiniLM-L6 0.531 of its float16 build, against 0.506 all
int8). Channels are chosen on the calibration samples (``measure``): ``I`` where a channel's peak passes
``FACTOR_IN`` times the median channel's, ``O`` likewise with ``FACTOR_OUT``, at most ``MAX_CHANNELS`` each.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from flexdsa_core._libraries import get_numpy_value
from flexdsa_core.targets.forms import EverySite, ExactForm, matched_sites, observe, outlier_channels

FACTOR_IN = 4.0
FACTOR_OUT = 6.0
MAX_CHANNELS = 8
MEASURED_SAMPLES = 64
# Element-wise ops an activation chain may hold (their other operands scalar constants).
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Erf", "Tanh", "Sigmoid", "Relu", "Gelu", "Pow", "Clip",
                          "HardSigmoid", "HardSwish", "LeakyRelu", "Elu", "Softplus", "Mish", "Exp", "Neg"})  # fmt: skip
_MAX_CHAIN = 16


def _chain(h: ir.Value) -> tuple[ir.Node, list[ir.Node]] | str:
    """(the up projection's bias Add, the activation nodes in graph order) of ``h = f(x·Wu + bu)``; else why not."""
    producer = h.producer()
    if producer is None:
        return f"'{h.name}' is a graph input"
    if h.is_graph_output() or len(h.uses()) != 1:
        return f"'{h.name}' is also used outside the activation"
    nodes, pending, root = {}, [producer], None
    while pending:
        node = pending.pop()
        if id(node) in nodes:
            continue
        if len(nodes) > _MAX_CHAIN or node.op_type not in _ELEMENTWISE:
            return (
                f"'{h.name}' is not an element-wise function of one projection ({node.op_type} '{node.name}')"
            )
        nodes[id(node)] = node
        for value in node.inputs:
            if value is None or get_numpy_value(value) is not None:
                if value is not None and get_numpy_value(value).size != 1:
                    return f"'{node.name}' has a constant that is not a scalar"
                continue
            up = value.producer()
            if up is not None and _projection(up) is not None:
                if root is not None and up is not root:
                    return f"'{h.name}' depends on two projections"
                root = up
            elif up is None:
                return f"'{h.name}' depends on the graph input '{value.name}'"
            else:
                pending.append(up)
    if root is None:
        return f"no projection x·W + b feeds '{h.name}'"
    inside = {id(n) for n in nodes.values()} | {id(root)}
    for node in nodes.values():
        for out in node.outputs:
            users = [user for user, _ in out.uses()]
            if out is not h and (out.is_graph_output() or any(id(u) not in inside for u in users)):
                return f"'{out.name}' is also used outside the activation"
    for out in root.outputs:
        if out.is_graph_output() or any(id(u) not in inside for u, _ in out.uses()):
            return f"'{out.name}' is also used outside the activation"
    order = (
        [n for n in producer.graph if id(n) in nodes] if producer.graph is not None else list(nodes.values())
    )
    return root, order


def _projection(node: ir.Node) -> tuple[ir.Value, np.ndarray, np.ndarray, ir.Node] | None:
    """(x, W, b, the MatMul) of ``Add(MatMul(x, W), b)`` with constant 2-D W and 1-D b, else None."""
    if node.op_type != "Add" or len(node.inputs) != 2:
        return None
    for product, bias in (node.inputs, node.inputs[::-1]):
        matmul = product.producer() if product is not None else None
        b = get_numpy_value(bias)
        if matmul is None or matmul.op_type != "MatMul" or b is None or b.ndim != 1:
            continue
        w = get_numpy_value(matmul.inputs[1])
        if w is not None and w.ndim == 2 and w.shape[1] == b.shape[0] and len(product.uses()) == 1:
            return matmul.inputs[0], w, b, matmul
    return None


class OutlierChannelSplit(RewriteRuleClassBase):
    """The split of the module docstring at a down projection ``Add(MatMul(h, Wd), bd)``; ``channels`` (site ->
    (I, O)) comes from ``measure``, ``roles`` records each new node's role by id."""

    channels: ClassVar[dict[str, tuple[tuple[int, ...], tuple[int, ...]]]] = {}
    roles: ClassVar[dict[int, str]] = {}

    @classmethod
    def describe(cls, site: str) -> str:
        inner, outer = cls.channels[site]
        return f"hidden channels {list(inner)} and output channels {list(outer)} split out"

    def pattern(self, op, h, wd, bd):
        return op.Add(op.MatMul(h, wd), bd, _outputs=["y"])

    def check(self, context, h, wd, bd, y, **_) -> MatchResult:
        result = MatchResult()
        site = y.producer()
        weight, bias = get_numpy_value(wd), get_numpy_value(bd)
        if weight is None or weight.ndim != 2 or bias is None or bias.shape != (weight.shape[1],):
            return result.fail(f"'{site.name}' is not x·W + b with a constant 2-D W and 1-D b.")
        found = _chain(h)
        if isinstance(found, str):
            return result.fail(f"'{site.name}': {found}.")
        if site.name not in self.channels:
            return result.fail(f"'{site.name}': no channel outside the per-tensor range was measured.")
        self._found = found
        return result

    def rewrite(self, op, h, wd, bd, y, **_):
        site = y.producer().name
        inner, outer = (list(c) for c in self.channels[site])
        up_add, activation = self._found
        x, wu, bu, _ = _projection(up_add)
        weight, bias = get_numpy_value(wd), get_numpy_value(bd)
        kept = np.ones(wu.shape[1], bool)
        kept[inner] = False

        def const(array, role):
            return op.initializer(
                ir.tensor(np.ascontiguousarray(array, dtype=weight.dtype), name=f"{site}/{role}")
            )

        def projection(x_value, w, b, role):
            product = self._role(op.MatMul(x_value, const(w, f"{role}_weight")), role)
            return self._role(op.Add(product, const(b, f"{role}_bias")), f"{role}_bias")

        def activate(u, role):
            mapping = {id(up_add.outputs[0]): u}
            for index, node in enumerate(activation):
                inputs = [mapping.get(id(v), v) for v in node.inputs]
                attributes = {name: attr.value for name, attr in node.attributes.items()}
                value = getattr(op, node.op_type)(*inputs, **attributes)
                mapping[id(node.outputs[0])] = self._role(value, f"{role}{index}")
            return mapping[id(h)]

        bulk_hidden = activate(projection(x, wu * kept, bu * kept, "bulk_up"), "bulk_act")
        down = weight * kept[:, None]
        down_bulk = down.copy()
        down_bulk[:, outer] = 0
        bias_bulk = bias.copy()
        bias_bulk[outer] = 0
        bulk = projection(bulk_hidden, down_bulk, bias_bulk, "bulk_down")
        parts, rows = [], []
        if inner:
            parts.append(activate(projection(x, wu[:, inner], bu[inner], "float16_up"), "float16_act"))
            rows.append(weight[inner, :])
        if outer:
            parts.append(projection(bulk_hidden, down[:, outer], bias[outer], "outlier_down"))
            placing = np.zeros((len(outer), weight.shape[1]), weight.dtype)
            placing[range(len(outer)), outer] = 1
            rows.append(placing)
        if not parts:  # nothing to split (only while the sites are being found)
            return bulk
        gathered = self._role(op.Concat(*parts, axis=-1), "float16_concat") if len(parts) > 1 else parts[0]
        outliers = self._role(op.MatMul(gathered, const(np.vstack(rows), "outlier_weight")), "float16_place")
        return self._role(op.Add(bulk, outliers), "float16_merge")

    def _role(self, value: ir.Value, role: str) -> ir.Value:
        self.roles[id(value.producer())] = role
        return value


def measure(model: ir.Model, samples: list[dict]) -> tuple[list, dict]:
    """Per down projection, the channels of the module docstring from the calibration samples."""
    samples = samples[:MEASURED_SAMPLES]
    finder = type("OutlierChannelSplit", (OutlierChannelSplit,), {"channels": EverySite(((), ())), "roles": {}})
    found, refused = matched_sites(model, finder, FORM.name)
    nodes = {node.name: node for node in model.graph}
    sites = {site: _projection(nodes[site]) for site in found}
    if not sites:
        return [], {"detail": "no feed-forward block x·Wu + bu → element-wise → ·Wd + bd", "refused": refused}
    observed = observe(model, sorted({down[0].name for down in sites.values()}), samples)
    channels, measured = {}, {}
    for site, (hidden, weight, bias, _) in sites.items():
        rows = np.concatenate([o[hidden.name].reshape(-1, weight.shape[0]) for o in observed]).astype(
            np.float64
        )
        inner = outlier_channels(np.abs(rows).max(axis=0), FACTOR_IN, MAX_CHANNELS)
        rows[:, inner] = 0
        outer = outlier_channels(np.abs(rows @ weight.astype(np.float64) + bias).max(axis=0), FACTOR_OUT, MAX_CHANNELS)
        if inner or outer:
            channels[site] = (tuple(inner), tuple(outer))
        measured[site] = {"hidden": inner, "output": outer}
    rule = type("OutlierChannelSplit", (OutlierChannelSplit,), {"channels": channels, "roles": {}})
    summary = {"channels": measured, "samples": len(samples),
               "rule": f"a channel whose peak passes {FACTOR_IN:g}x (hidden) or {FACTOR_OUT:g}x (output, the bulk's) the "
                       f"median channel's, at most {MAX_CHANNELS}"}  # fmt: skip
    return ([rule] if channels else []), summary


FORM = ExactForm(
    name="outlier_channel_split",
    summary="FFN outlier channels on a path of their own, the bulk under one int8 scale (exact up to sum order)",
    site_suffix="/outlier_split",
    measure=measure,
)
