"""``x·W + b → Concat(x ⊙ m, x·P)·[W; W_I repeated] + b``: a projection whose input carries a few channels far
above the rest (a post-norm encoder's LayerNorm output) takes each of them as ``k`` equal pieces beside the bulk,
so that the int8 scale of the projection's input spans the bulk's range only; exact in fp32 up to rounding.

With ``I`` the input channels whose peak dwarfs the median channel's, ``m`` the 0/1 vector that zeroes them, and
for each ``c`` in ``I`` ``k_c`` = its peak over the bulk's largest peak, rounded up::

    pieces = x·P                      (P: for each c, k_c columns holding 1/k_c at row c: x_c / k_c, k_c times)
    x'     = Concat(x ⊙ m, pieces)    (C + Σk_c channels, none above the bulk's peak)
    y      = x'·[W; W[c] k_c times for each c] + b

Every output is the same sum as before: ``x_c·W[c]`` is now ``k_c`` terms ``(x_c/k_c)·W[c]``, and the bulk's
``c`` terms are ``0·W[c]``. The weights keep their values (a channel's scale is not moved into them, as
SmoothQuant would, which widens a per-channel weight scale); the projection grows by Σk_c input channels. The
mask and the picking run in float16 (their roles), so that what is converted to int8 is ``x'``.

Why: rknn-toolkit2 gives a projection's input one per-tensor int8 scale. In MiniLM-L6 the norm before each
feed-forward block carries channel 99 at 17-19x the median channel's peak (and channel 223 up to 11x): the
residual stream's outlier, normalised (``sqrt(384) ≈ 19.6`` is the most one channel can stand out after a
LayerNorm). The toolkit's per-layer analysis puts those conversions at single-layer cosine 0.998, the loss left
after the bounded mask and the feed-forward split (``bounded_mask.py``, ``outlier_channels.py``). Channels are
chosen on the calibration samples (``measure``): at a projection whose input's largest channel peak passes
``SITE_FACTOR`` times the median channel's, every channel past ``FACTOR`` times, at most ``MAX_CHANNELS``; at one
whose input is a normalisation's output (``NORMS``) with its largest channel past ``NORM_SITE_FACTOR`` times
(but not ``SITE_FACTOR``), that one channel; the input at least ``MIN_WIDTH`` channels wide and not on another
form's float16 path. The three projections of one input share its mask, pieces and Concat.

MiniLM-L6 (rknn-toolkit2's estimate, held-out sentences in its simulator): the six feed-forward inputs, at
8.4-18.6x, split channel 99 and where it passes 8x channel 223, in 2-4 pieces; the attention inputs, at 4.2-6.2x,
split their largest channel (99; 62 in the first layer) in 2. Feed-forward inputs alone: 0.539 of the vendor
alone's float16, worst of 32 sentences 0.9889. With the attention inputs' one channel: 0.546, worst 0.9911.
Every channel past 4x at every projection (the attention's output projection and the feed-forward's down
projection too): 0.565, worst of 60 0.9926. The largest channel past 4x at every projection: 0.554.
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np
import onnx_ir as ir
from onnxscript.rewriter import MatchResult, RewriteRuleClassBase

from flexdsa_core._libraries import get_numpy_value
from flexdsa_core.targets.forms import EverySite, ExactForm, matched_sites, observe, outlier_channels

SITE_FACTOR = 8.0
FACTOR = 8.0
MAX_CHANNELS = 4
# A normalisation's output (the residual stream normalised: an attention's or a feed-forward block's input)
# whose largest channel passes this many times the median channel's, but not ``SITE_FACTOR``: that one channel
# alone, in pieces.
NORM_SITE_FACTOR = 4.0
NORMS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization"})
MIN_WIDTH = 64
MEASURED_SAMPLES = 64


class InputOutlierSplit(RewriteRuleClassBase):
    """The split of the module docstring at ``Add(MatMul(x, W), b)``; ``channels`` (site -> ((c, k_c), ...)) comes
    from ``measure``, ``roles`` records each new node's role by id."""

    channels: ClassVar[dict[str, tuple[tuple[int, int], ...]]] = {}
    roles: ClassVar[dict[int, str]] = {}
    # (id of x, its split) -> x' made at an earlier site: projections of one input (an attention's query, key
    # and value) share its mask, its pieces and their Concat.
    widened: ClassVar[dict[tuple[int, tuple], ir.Value]] = {}

    @classmethod
    def describe(cls, site: str) -> str:
        pieces = ", ".join(f"{c} in {k}" for c, k in cls.channels[site])
        return f"input channels split into pieces beside the bulk: {pieces}"

    def pattern(self, op, x, w, b):
        return op.Add(op.MatMul(x, w), b, _outputs=["y"])

    def check(self, context, x, w, b, y, **_) -> MatchResult:
        result = MatchResult()
        site = y.producer()
        weight, bias = get_numpy_value(w), get_numpy_value(b)
        if weight is None or weight.ndim != 2 or bias is None or bias.shape != (weight.shape[1],):
            return result.fail(f"'{site.name}' is not x·W + b with a constant 2-D W and 1-D b.")
        if weight.shape[0] < MIN_WIDTH:
            return result.fail(f"'{site.name}': its input has {weight.shape[0]} channels, under {MIN_WIDTH}.")
        if site.name.rsplit("/", 1)[-1].startswith("float16"):
            return result.fail(f"'{site.name}' is on another form's float16 path.")
        producer = x.producer()
        if producer is not None and producer.name.endswith(f"{FORM.site_suffix}/concat"):
            return result.fail(f"'{site.name}' is split already.")
        if site.name not in self.channels:
            return result.fail(f"'{site.name}': no input channel outside the per-tensor range was measured.")
        return result

    def rewrite(self, op, x, w, b, y, **_):
        site = y.producer().name
        split = self.channels[site]
        weight = get_numpy_value(w)

        def const(array, role):
            return op.initializer(
                ir.tensor(np.ascontiguousarray(array, dtype=weight.dtype), name=f"{site}/{role}")
            )

        if not split:  # nothing to split (only while the sites are being found)
            return op.Add(op.MatMul(x, w), b)
        keep = np.ones(weight.shape[0], weight.dtype)
        rows, pick = [weight], []
        for channel, copies in split:
            keep[channel] = 0
            for _ in range(copies):
                column = np.zeros(weight.shape[0], weight.dtype)
                column[channel] = 1 / copies
                pick.append(column)
                rows.append(weight[channel : channel + 1])
        widened = self.widened.get((id(x), split))
        if widened is None or widened.producer() is None or widened.producer().graph is None:
            masked = self._role(op.Mul(x, const(keep, "keep")), "float16_mask")
            pieces = self._role(op.MatMul(x, const(np.stack(pick, axis=1), "pick")), "float16_pick")
            widened = self.widened[(id(x), split)] = self._role(op.Concat(masked, pieces, axis=-1), "concat")
        product = self._role(op.MatMul(widened, const(np.vstack(rows), "weight")), "projection")
        return op.Add(product, b)

    def _role(self, value: ir.Value, role: str) -> ir.Value:
        self.roles[id(value.producer())] = role
        return value


def measure(model: ir.Model, samples: list[dict]) -> tuple[list, dict]:
    """Per projection, the input channels of the module docstring from the calibration samples."""
    samples = samples[:MEASURED_SAMPLES]
    finder = type("InputOutlierSplit", (InputOutlierSplit,), {"channels": EverySite(()), "roles": {}, "widened": {}})
    found, refused = matched_sites(model, finder, FORM.name)
    nodes = {node.name: node for node in model.graph}
    inputs = {site: _input(nodes[site]) for site in found}
    inputs = {site: value for site, value in inputs.items() if value is not None}
    if not inputs:
        return [], {"detail": f"no projection x·W + b with a constant W of at least {MIN_WIDTH} input channels",
                    "refused": refused}  # fmt: skip
    names = sorted({value.name for value in inputs.values()})
    observed = observe(model, names, samples)
    peaks = {}
    for name in names:
        rows = np.concatenate([o[name].reshape(-1, o[name].shape[-1]) for o in observed])
        peaks[name] = np.abs(rows.astype(np.float64)).max(axis=0)
    channels, measured = {}, {}
    for site, value in inputs.items():
        peak = peaks[value.name]
        median = float(np.median(peak))
        chosen = []
        if median > 0 and float(peak.max()) >= SITE_FACTOR * median:
            chosen = outlier_channels(peak, FACTOR, MAX_CHANNELS)
        elif median > 0 and _normalised(value) and float(peak.max()) >= NORM_SITE_FACTOR * median:
            chosen = outlier_channels(peak, NORM_SITE_FACTOR, 1)
        bulk = float(np.delete(peak, chosen).max()) if chosen else float(peak.max())
        split = tuple((c, max(2, math.ceil(float(peak[c]) / bulk))) for c in chosen) if bulk > 0 else ()
        if split:
            channels[site] = split
        measured[site] = {"channels": {c: k for c, k in split},
                          "peak_over_median": round(float(peak.max()) / median, 1) if median > 0 else None,
                          "bulk_peak_over_median": round(bulk / median, 1) if median > 0 else None}  # fmt: skip
    rule = type("InputOutlierSplit", (InputOutlierSplit,), {"channels": channels, "roles": {}, "widened": {}})
    summary = {"channels": measured, "samples": len(samples), "refused": refused,
               "rule": f"where an input's largest channel peak passes {SITE_FACTOR:g}x the median channel's, every "
                       f"channel past {FACTOR:g}x, at most {MAX_CHANNELS}; where a normalisation's output's passes "
                       f"{NORM_SITE_FACTOR:g}x, that channel"}  # fmt: skip
    return ([rule] if channels else []), summary


def _normalised(value: ir.Value) -> bool:
    """Whether ``value`` is a normalisation's output (the residual stream normalised)."""
    producer = value.producer()
    return producer is not None and producer.op_type in NORMS


def _input(site: ir.Node) -> ir.Value | None:
    """The input x of the site ``Add(MatMul(x, W), b)``."""
    for value in site.inputs:
        producer = value.producer() if value is not None else None
        if producer is not None and producer.op_type == "MatMul":
            return producer.inputs[0]
    return None


FORM = ExactForm(
    name="input_outlier_split",
    summary="a projection's outlier input channels fed as equal pieces beside the bulk, its int8 input spanning the "
    "bulk (exact up to rounding)",
    site_suffix="/input_split",
    measure=measure,
)
