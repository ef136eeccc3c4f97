"""The mixed-precision searches: which layers stay float so the model meets the accuracy target.

Sensitivity of a layer = the accuracy it alone costs (``1 - min over outputs of min(cosine, top-1)`` with
only it quantised, top-1 by the accuracy target's rule; ties broken by the same over every row, near-ties
included: ``scoring.sensitivity_order``). The ``k`` most sensitive stay float for the smallest ``k`` that meets the target, found
by bisection (``_bisect_float_layers``); kept-float layers with the largest measured int8 gain are then tried
back one at a time (``_readmit``). ``_dynamic_mixed`` is the same ranking in dynamic int8.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from flexdsa_core.accuracy import describe as _describe
from flexdsa_core.precision.cpu_forms import (
    DYNAMIC_OP_TYPES,
    EXACT_TOP_K,
    ClassifierHead,
    dynamic_form,
)
from flexdsa_core.precision.quantise import _quantize_dynamic, _quantize_static, _static_recipe
from flexdsa_core.precision.scoring import _Candidate, sensitivity_order
from flexdsa_core.targets.int8_format import Int8Format

# After the bisection, at most this many kept-float layers (largest measured int8 gain first) are tried
# back in int8, one quantise-and-score each.
READMIT_LAYERS = 8


# Sensitivity ranks layers: this many samples order them as well as all would, at a fraction of the runs.
SENSITIVITY_SAMPLES = 8


def _sensitivity(run, fp32: Path, layers, reference, cache: Path, fmt: Int8Format) -> dict[str, dict]:
    """Each layer quantised alone (the rest float): the accuracy it costs by itself, on the first
    ``SENSITIVITY_SAMPLES`` samples (a ranking; the chosen model is judged on all of them)."""
    result = {}
    for index, (name, _) in enumerate(layers):
        run.report(0.3 + 0.5 * index / max(len(layers), 1), f"sensitivity of layer {index + 1}/{len(layers)}: {name}")
        out = run.workdir / f"only_{index}.onnx"
        _quantize_static(fp32, out, run.calibration, cache, fmt, keep=run.tail(fp32), method=run.method, nodes_to_quantize=[name])
        result[name] = run.score_judged(out, SENSITIVITY_SAMPLES)
        out.unlink(missing_ok=True)
    return result


def _readmit(run, fp32, cache, fmt, reference, kept: list[str], chosen: frozenset[str], gains: dict[str, float]):
    """After the bisection: the kept-float layers that gain most from int8 (measured), tried back in int8
    one at a time, largest gain first; each stays int8 if the target still holds. Bisection over one
    ranking assumes the ranking is right; this recovers speed where it was not."""
    order = sorted((name for name in kept if gains.get(name, 0.0) > 0), key=lambda name: -gains[name])
    outcome, best = [], None
    for index, name in enumerate(order[:READMIT_LAYERS]):
        trial = chosen | {name}
        out = run.workdir / f"mixed_readmit_{index}.onnx"
        _quantize_static(fp32, out, run.calibration, cache, fmt, keep=run.tail(fp32), method=run.method, nodes_to_quantize=sorted(trial))
        accuracy = run.score_judged(out)
        outcome.append({"layer": name, "gain_ms": round(gains[name], 4), "ok": accuracy["ok"], "loss": accuracy["loss"]})
        if accuracy["ok"]:
            chosen, best = trial, (out, accuracy)
    return chosen, best, outcome


def _mixed(run, fp32, layers, reference, cache, fmt, full: _Candidate, slower: frozenset[str],
           gains: dict[str, float] | None = None):  # fmt: skip
    """The fewest most-sensitive weight layers kept float so that the static model meets the target.

    ``full`` is every quantisable op in int8 except those measured slower (``slower``). When it misses the
    target, the search quantises the weight layers only (Conv, MatMul, Gemm with an initializer weight):
    activation-only ops (residual Adds, LayerNorm, Softmax, attention-score MatMuls) stay float, so with
    every weight layer excluded the model is the fp32 one and keeping more layers float always reaches the
    target."""
    sensitivity = _sensitivity(run, fp32, layers, reference, cache, fmt)
    # Ties in loss are common where top-1 decides it (no confident row of 8 flips): the loss over every row,
    # then the cosine lost, break them; equal on all keeps graph order (sorted is stable).
    ranked = sorted(layers, key=lambda layer: sensitivity_order(sensitivity[layer[0]]))
    tried: dict[int, dict] = {}
    path_of: dict[int, Path] = {}
    chosen_of: dict[int, frozenset[str] | None] = {}

    def attempt(keep_float: int) -> dict:
        if keep_float not in tried:
            chosen = [name for name, _ in ranked[keep_float:] if name not in slower]
            chosen_of[keep_float] = frozenset(chosen)
            if not chosen:  # nothing left in int8: the fp32 model
                tried[keep_float] = {"ok": True, "loss": 0.0, "outputs": {}}
                return tried[keep_float]
            out = run.workdir / f"mixed_{keep_float}.onnx"
            _quantize_static(fp32, out, run.calibration, cache, fmt, keep=run.tail(fp32), method=run.method, nodes_to_quantize=chosen)
            tried[keep_float] = run.score_judged(out)
            path_of[keep_float] = out
        return tried[keep_float]

    lo, hi = 0, len(ranked)  # invariant: lo misses the target; hi (everything float: fp32) meets it
    scope = "weight layers"
    if full.error is None and full.accuracy.get("ok"):  # every op int8 (bar the slower) meets the target
        hi, scope = 0, "every quantisable op"
        tried[0], path_of[0], chosen_of[0] = full.accuracy, full.path, full.int8_nodes
    elif not attempt(0)["ok"]:
        tried[hi] = {"ok": True, "loss": 0.0, "outputs": {}}  # every weight layer float: the fp32 model
        hi = _bisect_float_layers(attempt, lo, hi)
    else:
        hi = 0
    keep = hi
    readmitted: list[dict] = []
    if gains and keep > 0:
        kept = [name for name, _ in ranked[:keep]]
        chosen, best, readmitted = _readmit(
            run, fp32, cache, fmt, reference, kept, chosen_of.get(keep) or frozenset(), gains
        )
        if best is not None:
            chosen_of[keep], path_of[keep], tried[keep] = chosen, best[0], best[1]
    back = sum(entry["ok"] for entry in readmitted)
    measured = f"; {len(slower)} measured slower in int8 kept float" if slower else ""
    measured += f"; {back} of them back in int8 by measured gain" if back else ""
    candidate = _Candidate(
        "mixed", path_of.get(keep, run.workdir / "mixed_none.onnx"),
        f"static QDQ of {scope}, the {keep} most sensitive of {len(ranked)} weight layers kept float{measured}",
        accuracy=tried[keep], int8_nodes=chosen_of.get(keep),
    )  # fmt: skip
    if keep not in path_of:
        candidate.error = "no weight layer can be int8 within the accuracy target: the mixed model is the fp32 one"
    reasons = {}
    back_in = {entry["layer"]: entry for entry in readmitted if entry["ok"]}
    for rank, (name, _) in enumerate(ranked[:keep]):
        loss = sensitivity[name]["loss"]
        if name in back_in:
            reasons[name] = (
                f"int8: rank {rank + 1} of {len(ranked)} by sensitivity (loss {loss:.4f} alone) and kept float by "
                f"the bisection, then tried back in int8 for its measured gain ({back_in[name]['gain_ms']:.3f} ms): "
                "the target still holds"
            )
            continue
        reason = f"kept float: rank {rank + 1} of {len(ranked)} by sensitivity (loss {loss:.4f} quantised alone)"
        short = tried.get(keep - 1)
        if short is not None:
            reason += (
                f"; with only the {keep - 1} most sensitive layers in float the model misses the target "
                f"({_describe(short, run.options.accuracy)})"
            )
        reasons[name] = reason
    search = {
        "keep_float": keep,
        "scope": scope,
        "measured_slower": sorted(slower),
        "readmitted": readmitted,
        "tried": {str(k): {"ok": v["ok"], "loss": v["loss"]} for k, v in tried.items()},
    }
    if scope == "weight layers":
        search["why_weight_layers"] = (
            f"with every quantisable op in int8 the model misses the target ({_describe(full.accuracy, run.options.accuracy)})"
            if full.error is None else f"the all-int8 model failed: {full.error}"
        )  # fmt: skip
    return candidate, sensitivity, reasons, search


def _float_islands(run, fp32: Path, layers, sensitivity: dict, cache: Path, fmt: Int8Format, slower: frozenset[str],
                   full: _Candidate) -> _Candidate:  # fmt: skip
    """Every quantisable op in int8 (bar those measured slower) except the ``k`` most sensitive weight layers,
    which stay float islands, for the smallest ``k`` whose model meets the target (bisection; ``full`` is
    ``k = 0`` and missed it). ``mixed`` keeps every activation-only op float once the all-int8 model misses
    (its weight-only scope); on a CNN that costs a Q/DQ pair around every layer, and the weight-only model ran
    slower than fp32 (EfficientNet-Lite0: 1.09x its time) where a few float islands keep the int8 chain."""
    ranked = sorted((name for name, _ in layers), key=lambda n: sensitivity_order(sensitivity[n]))
    tried: dict[int, dict] = {0: full.accuracy}

    def attempt(keep: int) -> dict:
        if keep not in tried:
            out = run.workdir / f"islands_{keep}.onnx"
            excluded = sorted(slower | set(ranked[:keep]))
            _quantize_static(fp32, out, run.calibration, cache, fmt, keep=run.tail(fp32), method=run.method,
                             nodes_to_exclude=excluded)  # fmt: skip
            tried[keep] = run.score_judged(out)
        return tried[keep]

    candidate = _Candidate("mixed_islands", run.workdir / "mixed_islands.onnx", "")
    if not ranked or not attempt(len(ranked))["ok"]:
        candidate.error = (
            "with every weight layer float the other int8 ops still miss the target: no float-island model "
            "(the weight-only scope of 'mixed' applies)"
        )
        return candidate
    keep = _bisect_float_layers(attempt, 0, len(ranked))
    (run.workdir / f"islands_{keep}.onnx").replace(candidate.path)
    candidate.accuracy = tried[keep]
    candidate.recipe = _static_recipe(run, fp32, cache, fmt, nodes_to_exclude=sorted(slower | set(ranked[:keep])))
    candidate.int8_nodes = None
    candidate.how = (
        f"static QDQ of every quantisable op, the {keep} most sensitive of {len(ranked)} weight layers kept float "
        f"(islands: {', '.join(ranked[:keep][:8])}{' ...' if keep > 8 else ''})"
        + (f"; {len(slower)} ops measured slower in int8 kept float" if slower else "")
    )
    candidate.accuracy["islands"] = {str(k): {"ok": v["ok"], "loss": v["loss"]} for k, v in sorted(tried.items())}
    for other in run.workdir.glob("islands_*.onnx"):
        other.unlink(missing_ok=True)
    return candidate


def _dynamic_mixed(run, fp32: Path, fmt: Int8Format, sensitivity: dict, reference,
                   head: ClassifierHead | None = None) -> _Candidate:  # fmt: skip
    """Dynamic int8 (``cpu_forms``) with the fewest most sensitive MatMuls kept float that meets the target,
    ranked by the static sensitivity (``sensitivity``, layers named alike in both graphs): the most sensitive
    one float first (dynamic int8 loses less than static per layer, activations scaled per run: on ViT-B
    width one float MatMul gave top-1 1.0 on the samples, 15 of 16 int8), then a
    bisection over how many. A classifier head (``head``) stays int8 with its top candidates re-scored exactly
    (``exact_top_k``) and is not ranked: with every other MatMul float it is the last int8 layer standing
    (GPT-2's LM head, 53% of its fp32 time). Without one, every ranked MatMul float is the fp32 model."""
    form, _ = dynamic_form(onnx.load(str(fp32)))
    matmuls = {node.name for node in form.graph.node if node.op_type in DYNAMIC_OP_TYPES}
    del form
    ranked = [
        name
        for name, entry in sorted(sensitivity.items(), key=lambda item: sensitivity_order(item[1]))
        if name in matmuls and (head is None or name != head.node)
    ]
    candidate = _Candidate("dynamic_mixed", run.workdir / "dynamic_mixed.onnx", "")
    tried: dict[int, dict] = {}

    def attempt(keep: int) -> dict:
        if keep not in tried:
            out = run.workdir / f"dynamic_mixed_{keep}.onnx"
            _quantize_dynamic(fp32, out, fmt, keep_float=tuple(ranked[:keep]), head=head)
            tried[keep] = run.score_judged(out)
            if not tried[keep]["ok"]:
                out.unlink(missing_ok=True)
        return tried[keep]

    keep = min(1, len(ranked))
    if keep and not attempt(keep)["ok"]:
        low, keep = keep, len(ranked)  # invariant: low misses the target; keep meets it (or is the last tried)
        if keep > low and not matmuls - set(ranked):
            tried[keep] = {"ok": True, "loss": 0.0, "outputs": {}}  # every MatMul float: the fp32 model
        elif keep > low and not attempt(keep)["ok"]:
            low = keep  # even with every ranked MatMul float it misses: nothing to bisect
        keep = _bisect_float_layers(attempt, low, keep)
    kept = tuple(ranked[:keep])
    result = run.workdir / f"dynamic_mixed_{keep}.onnx"
    candidate.accuracy = tried.get(keep) or attempt(keep)
    int8 = matmuls - set(kept)
    if result.exists():
        result.replace(candidate.path)
    elif not candidate.accuracy.get("outputs"):
        candidate.error = "no MatMul can be int8 within the accuracy target: every one would be float (the fp32 model)"
    exact = (
        f"; the classifier head {head.node!r} int8 with its top {EXACT_TOP_K} per row re-scored exactly in fp32"
        if head is not None else ""
    )  # fmt: skip
    candidate.how = (
        f"dynamic int8 of {len(int8)} of {len(matmuls)} MatMuls (precision.cpu_forms), the {len(kept)} most "
        f"sensitive by the static ranking kept float: {', '.join(kept) or 'none'}{exact}"
    )
    candidate.int8_nodes = frozenset(int8)
    candidate.recipe = lambda samples, tag, out: _quantize_dynamic(fp32, out, fmt, keep_float=kept, head=head)
    for other in run.workdir.glob("dynamic_mixed_*.onnx"):
        other.unlink(missing_ok=True)
    return candidate


def _layer_table(in_int8: frozenset[str], rows: list[tuple[str, str]], decisions: dict, sensitivity: dict,
                 kept_reasons: dict, outside: str) -> list[dict]:  # fmt: skip
    """``precision.layers``: per quantisable node, the precision the quantiser was asked to give it
    (``in_int8``) and why, with its measured int8 and fp32 kernel times (``costing``) and its
    sensitivity where those were taken."""
    table = []
    for name, op in rows:
        decision = decisions.get(name)
        row: dict = {"layer": name, "op": op}
        if name in sensitivity:
            row["sensitivity"] = sensitivity[name]["loss"]
            row["alone"] = dict(sensitivity[name]["outputs"])
        if name in in_int8:
            row["precision"] = "int8"
            parts = [decision.reason] if decision else []
            if name in sensitivity:
                parts.append(f"the target holds with it quantised (loss {sensitivity[name]['loss']:.4f} alone)")
            row["reason"] = kept_reasons.get(name) or "int8: " + ("; ".join(parts) or "quantised")
        else:
            row["precision"] = "float32"
            if decision is not None and decision.precision == "float32":
                row["reason"] = f"kept float: {decision.reason}"
            elif name in kept_reasons:
                row["reason"] = kept_reasons[name]
            else:
                row["reason"] = f"kept float: {outside}"
        if decision is not None:
            row.update(decision.columns())
        table.append(row)
    return table


def _bisect_float_layers(attempt, misses: int, meets: int) -> int:
    """The fewest most-sensitive layers kept float that meet the target, between ``misses`` (a count known to
    miss it) and ``meets`` (one known to meet it): ``attempt(count)["ok"]`` is monotone in the count."""
    while meets - misses > 1:
        middle = (misses + meets) // 2
        if attempt(middle)["ok"]:
            meets = middle
        else:
            misses = middle
    return meets
