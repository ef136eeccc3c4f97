"""int8 (and mixed) on cpu-ort: every candidate built, scored, timed, and the one that ships chosen.

The candidates are listed in the package docstring (``flexdsa_core/precision/__init__.py``); ``_int8`` runs
them in order, with the per-op costing (``_op_costing``: ops measured slower in int8 stay float) and the
methods beyond MinMax where the all-int8 model misses the target: Percentile and Entropy calibration, bias
correction, cross-layer equalisation (``_equalised``). ``_no_int8`` fails or falls
back to fp32 naming the most sensitive layers.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import onnx
import onnx_ir as ir

from flexdsa_core.accuracy import describe as _describe
from flexdsa_core.errors import ValidationFailedError
from flexdsa_core.precision.adaround import adaround
from flexdsa_core.precision.bias_correction import correct_biases
from flexdsa_core.precision.cache import CACHED, CostingScope, cached_profile
from flexdsa_core.precision.costing import decide, profile_int8_vs_fp32, quantised_nodes
from flexdsa_core.precision.cpu_forms import (
    EXACT_TOP_K,
)
from flexdsa_core.precision.equalise import equalise, max_relative_difference
from flexdsa_core.precision.formats import cpu_int8_features, int8_format
from flexdsa_core.precision.layer_cosines import MAX_SAMPLES as LAYER_COSINE_SAMPLES
from flexdsa_core.precision.layer_cosines import layer_cosines
from flexdsa_core.precision.mixed import _dynamic_mixed, _float_islands, _layer_table, _mixed, _sensitivity
from flexdsa_core.precision.quantise import (
    PROFILE_WARMUP,
    WEIGHT_COMPUTE_OPS,
    _cached_time_shares,
    _classifier_head,
    _quantize_dynamic,
    _static_recipe,
    _weight_layers,
)
from flexdsa_core.precision.scoring import (
    PrecisionRun,
    _Candidate,
    _classifier_outputs,
    _confirm,
    _outputs,
    _pick,
    _save,
    _score_on_calibration,
    _scored,
    _scored_search,
    _time_against_fp32,
    claim,
    sensitivity_order,
)
from flexdsa_core.significance import KERNEL_MIN_EFFECT, MIN_ROUNDS
from flexdsa_core.targets.int8_format import Int8Format
from flexdsa_core.version import __version__

# Calibration methods tried beyond MinMax when the all-int8 model misses the target (ONNX Runtime's).
CALIBRATION_METHODS = ("Percentile", "Entropy")
# Cross-layer equalisation (``precision.equalise``) tried too when the all-int8 model misses the target. The
# bench turns it off to measure what it adds; a compile always has it.
EQUALISATION = True
# Learned rounding of the all-int8 model's weights (``precision.adaround``) where it misses the target.
ADAROUND = True
# The equalised fp32 model must compute the fp32 model's outputs to within this (relative to each output's
# largest magnitude); its power-of-two scales make them bit-identical, so anything above is a bug refused.
EQUALISATION_TOLERANCE = 1e-6


def _op_costing(run: PrecisionRun, fp32: Path, static: _Candidate, report: dict, fmt: Int8Format):
    """Each quantisable node's int8 kernel against its fp32 kernel on this CPU (``costing``), from the
    kernel cache where every node's figures are there (``cache``): the decisions, the nodes measured
    slower, and per node where its figures came from."""
    nodes = quantised_nodes(onnx.load(str(static.path)))
    rounds = max(run.options.latency_repeats, MIN_ROUNDS)
    scope = CostingScope(fmt.as_dict(), rounds, PROFILE_WARMUP, run.target, __version__)
    started = time.perf_counter()
    timings, sources = cached_profile(
        fp32, static.path, [n for n, _ in nodes], run.samples[0], run.workdir,
        cache=run.cache, scope=scope, profile=profile_int8_vs_fp32,
    )  # fmt: skip
    decisions = decide(timings)
    slower = frozenset(name for name, d in decisions.items() if d.precision == "float32")
    origins = Counter("kernel cache" if source == CACHED else "measured" for source in sources.values())
    report["op_costing"] = {
        "engine": "onnxruntime CPUExecutionProvider profiler, ORT_ENABLE_ALL, 1 thread, interleaved rounds",
        "rounds": rounds,
        "models": f"fp32 against {static.name} (every quantisable op int8)",
        "rule": f"float where int8 is significantly slower (95% interval of the ratio above 1 + {KERNEL_MIN_EFFECT})",
        "quantisable": len(nodes),
        "measured_slower": len(slower),
        "fp32_ms": round(sum(d.fp32_ms or 0.0 for d in decisions.values()), 3),
        "int8_ms": round(sum(d.int8_ms or 0.0 for d in decisions.values()), 3),
        # Whether this compile ran the profile, and per source how many nodes' figures came from it.
        "profiled": origins["measured"] > 0,
        "figures": {"measured": origins["measured"], "kernel_cache": origins["kernel cache"]},
        "seconds": round(time.perf_counter() - started, 3),
    }
    return decisions, slower, sources


@dataclass
class _Base:
    """A static QDQ candidate with the fp32 model it was quantised from and that model's calibration ranges."""

    fp32: Path
    cache: Path
    model: _Candidate


def _int8(run: PrecisionRun, report: dict) -> ir.Model | None:
    """Every int8 candidate built and scored in turn, the fastest that meets the target confirmed on the
    held-out folds and shipped; else ``_no_int8``."""
    fmt = int8_format(run.target)
    report["format"] = fmt.as_dict()
    if fmt.runs_here:
        report["cpu"] = cpu_int8_features()
    fp32 = _save(run.fp32_model, run.workdir / "fp32.onnx")
    reference = run.reference()
    if run.packed(fp32):  # outputs packing unlike quantities: their tails stay float in every static candidate
        report["packed_outputs"] = run.packed(fp32)

    fused, unfused, dynamic = _whole_model_bases(run, fp32, fmt)
    candidates = _whole_model_candidates(run, fused, unfused, dynamic, fmt, reference)
    head, exact_head = _exact_head(run, fp32, fmt, dynamic, reference, candidates, report)
    base, weight_layers = _costing_base(fused, unfused)

    measured = run.options.measure_latency and fmt.runs_here
    decisions, slower, sources = _per_op_costing(run, base, fmt, measured, report)
    full = _all_int8(run, base, fmt, slower, reference, candidates)
    if base.model.error is None and full.error is None and not full.accuracy.get("ok"):
        full = _calibration_methods(run, base.fp32, base.cache, fmt, full, slower, candidates, report)
        chain = (full, base.fp32)  # the all-int8 model learned rounding starts from, and its fp32 model
        if EQUALISATION and fmt.runs_here:
            report["equalisation"], equalised = _equalised(run, base.fp32, base.cache, fmt, full, slower, candidates)
            chain = equalised or chain
        # Where our QDQ model is what ships (cpu-ort; TensorRT builds from it): a vendor's quantiser rounds for itself.
        if ADAROUND and fmt.vendor is None and chain[0].error is None and chain[0].recipe is not None:
            report["adaround"] = _adarounded(run, chain[1], chain[0], candidates)
    _weights_only(run, base, fmt, weight_layers, slower, reference, candidates)

    sensitivity, kept_reasons, table_model, search = {}, {}, full, None
    if run.options.precision == "mixed" and base.model.error is None and weight_layers:
        table_model, sensitivity, kept_reasons, search = _mixed_candidates(
            run, base, fmt, weight_layers, full, slower, decisions, reference, candidates, report,
        )  # fmt: skip
        dynamic_ok = dynamic.accuracy.get("ok") or (exact_head.error is None and exact_head.accuracy.get("ok"))
        if fmt.runs_here and dynamic.error is None and not dynamic_ok and sensitivity:
            build_dynamic_mixed = lambda: _dynamic_mixed(run, fp32, fmt, sensitivity, reference, head)  # noqa: E731
            candidates.append(_scored_search(build_dynamic_mixed))

    chosen = _chosen(run, fp32, candidates, measured, report)
    if base.model.error is None and (decisions or search is not None):
        _layers_report(run, base, table_model, decisions, sources, sensitivity, kept_reasons, search, report)
    if chosen is None:
        return _no_int8(run, report, candidates, weight_layers, reference, base.cache, fmt, base.fp32)
    return _shipped(run, chosen, (fp32, base.fp32), report)


def _whole_model_bases(run: PrecisionRun, fp32: Path, fmt: Int8Format) -> tuple[_Base, _Base | None, _Candidate]:
    """The candidates made of the whole model: static QDQ of the fused fp32 model, of the model compiled without
    our weight-holding fusions (where the run has it), and dynamic int8; none built yet."""
    cache = run.workdir / "calibration_ranges.json"
    static = _Candidate("static_qdq", run.workdir / "static.onnx", "static QDQ of the fused fp32 model",
                        recipe=_static_recipe(run, fp32, cache, fmt))  # fmt: skip
    unfused = None
    if run.unfused_model is not None:
        unfused_fp32 = _save(run.unfused_model, run.workdir / "fp32_unfused.onnx")
        unfused_static = _Candidate(
            "static_qdq_unfused", run.workdir / "static_unfused.onnx",
            "static QDQ of the model compiled without our fusions whose com.microsoft ops hold weights "
            "(FusedConv, FusedGemm, FusedMatMul, Attention: the QDQ quantiser leaves those in float)",
        )  # fmt: skip
        cache_unfused = run.workdir / "calibration_ranges_unfused.json"
        unfused_static.recipe = _static_recipe(run, unfused_fp32, cache_unfused, fmt)
        unfused = _Base(unfused_fp32, cache_unfused, unfused_static)
    dynamic = _Candidate(
        "dynamic", run.workdir / "dynamic.onnx",
        "dynamic int8 (weights s8, activations per run) of every MatMul with a constant weight, our Attention and "
        "tied-weight FusedMatMul first rewritten to MatMuls the quantiser takes (precision.cpu_forms)",
    )  # fmt: skip
    dynamic.recipe = lambda samples, tag, out: _quantize_dynamic(fp32, out, fmt)  # calibrates on nothing
    return _Base(fp32, cache, static), unfused, dynamic


def _whole_model_candidates(run: PrecisionRun, fused: _Base, unfused: _Base | None, dynamic: _Candidate,
                            fmt: Int8Format, reference: list[dict]) -> list[_Candidate]:  # fmt: skip
    """The whole-model candidates built and scored, in order."""
    builders = [(fused.model, lambda: fused.model.recipe(run.calibration, "fold0", fused.model.path))]
    if unfused is not None:
        builders.append((unfused.model, lambda: unfused.model.recipe(run.calibration, "fold0", unfused.model.path)))
    if fmt.runs_here:  # dynamic int8 is an ONNX Runtime CPU technique, not an accelerator format
        builders.append((dynamic, lambda: _quantize_dynamic(fused.fp32, dynamic.path, fmt, require_int8=True)))
    candidates: list[_Candidate] = []
    for index, (candidate, build) in enumerate(builders):
        run.report(0.3 * index / len(builders), f"int8 candidate {candidate.name}")
        candidates.append(_scored(run, candidate, build, reference))
    return candidates


def _exact_head(run: PrecisionRun, fp32: Path, fmt: Int8Format, dynamic: _Candidate, reference: list[dict],
                candidates: list[_Candidate], report: dict):  # fmt: skip
    """A big classifier head (an LM's) whose top-1 would flip in int8: found, and where dynamic int8 misses the
    target, dynamic int8 with that head's top-k re-scored exactly a candidate of its own. The head (None: none
    found) and that candidate (unbuilt where not needed)."""
    head = None
    if fmt.runs_here:
        head, why = _classifier_head(fp32, _classifier_outputs(reference[0], run.options.accuracy))
        report["classifier_head"] = (
            {"node": head.node, "output": head.output, "classes": head.classes, "exact_top_k": EXACT_TOP_K}
            if head is not None else {"node": None, "why": why}
        )  # fmt: skip
    exact_head = _Candidate(
        "dynamic_exact_head", run.workdir / "dynamic_exact_head.onnx",
        f"dynamic int8 of every MatMul (as 'dynamic'), the classifier head's top {EXACT_TOP_K} per row re-scored "
        "exactly in fp32 (precision.cpu_forms.exact_top_k)",
    )  # fmt: skip
    if head is not None and dynamic.error is None and not dynamic.accuracy.get("ok"):
        run.report(0.3, f"int8 candidate {exact_head.name}")
        build = lambda: _quantize_dynamic(fp32, exact_head.path, fmt, head=head)  # noqa: E731
        exact_head.recipe = lambda samples, tag, out: _quantize_dynamic(fp32, out, fmt, head=head)
        candidates.append(_scored(run, exact_head, build, reference))
    return head, exact_head


def _costing_base(fused: _Base, unfused: _Base | None) -> tuple[_Base, list[tuple[str, str]]]:
    """The static model that quantises more layers, the base of the per-op costing and of mixed, and its
    weight layers (Conv/MatMul/Gemm with initializer weights). ONNX Runtime's quantiser leaves our
    com.microsoft::FusedConv/FusedGemm in float, so on CNNs the graph without those fusions is the base
    (ResNet-18 here: 1.77x vs 1.05x for all-int8 on the fused graph)."""
    layers = _weight_layers(onnx.load(str(fused.model.path))) if fused.model.error is None else []
    base = fused
    if unfused is not None and unfused.model.error is None and fused.model.error is None:
        unfused_layers = _weight_layers(onnx.load(str(unfused.model.path)))
        if len(unfused_layers) > len(layers):
            layers, base = unfused_layers, unfused
    return base, [(name, op) for name, op in layers if op in WEIGHT_COMPUTE_OPS]


def _per_op_costing(run: PrecisionRun, base: _Base, fmt: Int8Format, measured: bool, report: dict):
    """``_op_costing`` on the base where latency is measured on this CPU: the decisions, the nodes measured
    slower in int8 and where each node's figures came from (all empty where not measured)."""
    if not measured or base.model.error is not None:
        return {}, frozenset(), {}
    run.report(0.3, "timing every quantisable op in int8 against fp32")
    try:
        return _op_costing(run, base.fp32, base.model, report, fmt)
    except Exception as err:  # noqa: BLE001 - without per-op times the candidates are still timed whole
        report["op_costing"] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"}
        return {}, frozenset(), {}


def _all_int8(run: PrecisionRun, base: _Base, fmt: Int8Format, slower: frozenset[str], reference: list[dict],
              candidates: list[_Candidate]) -> _Candidate:  # fmt: skip
    """The all-int8 model: the base, or where ops were measured slower in int8, the base's graph with those
    kept float (a candidate of its own)."""
    if not slower:
        return base.model
    costed = _Candidate(
        "static_qdq_costed", run.workdir / "static_costed.onnx",
        f"static QDQ of {base.model.name}'s graph with the {len(slower)} ops measured slower in int8 kept float",
    )  # fmt: skip
    costed.recipe = _static_recipe(run, base.fp32, base.cache, fmt, nodes_to_exclude=sorted(slower))
    build = lambda: costed.recipe(run.calibration, "fold0", costed.path)  # noqa: E731
    costed.int8_nodes = frozenset(n for n, _ in quantised_nodes(onnx.load(str(base.model.path)))) - slower
    candidates.append(_scored(run, costed, build, reference))
    return costed


def _weights_only(run: PrecisionRun, base: _Base, fmt: Int8Format, weight_layers: list[tuple[str, str]],
                  slower: frozenset[str], reference: list[dict], candidates: list[_Candidate]) -> None:  # fmt: skip
    """The base's weight layers alone in int8, a candidate: what keeps ViT, whose residual stream and
    attention stay float."""
    weights_int8 = [name for name, _ in weight_layers if name not in slower]
    if base.model.error is not None or not weights_int8:
        return
    weights = _Candidate(
        "static_qdq_weights", run.workdir / "static_weights.onnx",
        f"static QDQ of the weight layers only ({len(weights_int8)} Conv/MatMul/Gemm with initializer "
        f"weights, of {base.model.name}'s graph); activation-only ops (residual Add, LayerNorm, Softmax, "
        "attention-score MatMul) stay float",
        int8_nodes=frozenset(weights_int8),
    )  # fmt: skip
    weights.recipe = _static_recipe(run, base.fp32, base.cache, fmt, nodes_to_quantize=weights_int8)
    build = lambda: weights.recipe(run.calibration, "fold0", weights.path)  # noqa: E731
    candidates.append(_scored(run, weights, build, reference))


def _mixed_candidates(run: PrecisionRun, base: _Base, fmt: Int8Format, weight_layers: list[tuple[str, str]],
                      full: _Candidate, slower: frozenset[str], decisions: dict, reference: list[dict],
                      candidates: list[_Candidate], report: dict):  # fmt: skip
    """Mixed's search from the base (``precision.mixed``), and where it searched the weight layers only, float
    islands in the all-int8 model: the mixed candidate, the layers' sensitivity, why layers were kept float,
    and what the search did."""
    report["mixed_base"] = base.model.name
    mixed, sensitivity, kept_reasons, search = _mixed(
        run, base.fp32, weight_layers, reference, base.cache, fmt, full, slower,
        {name: d.fp32_ms - d.int8_ms for name, d in decisions.items() if d.precision == "int8" and d.comparison},
    )  # fmt: skip
    mixed.how += f" (from {base.model.name})"
    mixed.recipe = (
        full.recipe if mixed.int8_nodes is None
        else _static_recipe(run, base.fp32, base.cache, fmt, nodes_to_quantize=sorted(mixed.int8_nodes))
    )  # fmt: skip
    candidates.append(mixed)
    if search["scope"] == "weight layers" and full.error is None:  # float islands in the all-int8 model
        islands = _scored_search(
            lambda: _float_islands(run, base.fp32, weight_layers, sensitivity, base.cache, fmt, slower, full)
        )
        candidates.append(islands)
    return mixed, sensitivity, kept_reasons, search


def _chosen(run: PrecisionRun, fp32: Path, candidates: list[_Candidate], measured: bool,
            report: dict) -> _Candidate | None:  # fmt: skip
    """The candidates meeting the target timed against fp32 (where measured), the pick confirmed k-fold on the
    held-out samples (the next pick where it is refuted), and every candidate reported."""
    if measured:
        run.report(0.85, "timing the int8 candidates against fp32")
        runnable = [c for c in candidates if c.error is None and c.accuracy.get("ok")]
        if runnable:
            report["timing"] = _time_against_fp32(run, fp32, runnable)
    chosen, refuted = _pick(candidates, measured), []
    while chosen is not None and not _confirm(run, chosen):  # k-fold: the pooled held-out figure decides
        refuted.append(chosen)
        chosen = _pick([c for c in candidates if c not in refuted], measured)
    for candidate in candidates:
        candidate.accuracy.setdefault("measured_on", run.measured_on())
        if candidate.error is None and candidate.calibration_accuracy is None and candidate.path.is_file():
            _score_on_calibration(run, candidate)
    report["candidates"] = [c.as_dict() for c in candidates]
    return chosen


def _layers_report(run: PrecisionRun, base: _Base, table_model: _Candidate, decisions: dict, sources: dict,
                   sensitivity: dict, kept_reasons: dict, search: dict | None, report: dict) -> None:  # fmt: skip
    """``precision.layers``: each quantisable node of the base, whether ``table_model`` (mixed's, else the
    all-int8 model) computes it in int8 and why, its kernel times and share of the fp32 time."""
    outside = (
        "not a weight layer; the mixed search quantises weight layers only ("
        + search.get("why_weight_layers", "")
        + ")"
        if search is not None and search["scope"] == "weight layers"
        else "not quantised in this model"
    )
    rows = quantised_nodes(onnx.load(str(base.model.path)))
    in_int8 = frozenset() if table_model.error else table_model.int8_nodes
    table = _layer_table(
        frozenset(n for n, _ in rows) if in_int8 is None else in_int8, rows, decisions, sensitivity,
        kept_reasons, outside,
    )  # fmt: skip
    shares = _cached_time_shares(run, base.fp32)
    for row in table:
        row["time_share"] = round(shares.get(row["layer"], 0.0), 4)
        if row["layer"] in sources:  # measured in this compile, or read from the kernel cache
            row["timing_source"] = sources[row["layer"]]
    report["layers"] = table
    report["layers_model"] = table_model.name
    if search is not None:
        report["search"] = search


def _shipped(run: PrecisionRun, chosen: _Candidate, fp32_sources: tuple[Path, Path], report: dict) -> ir.Model:
    """The chosen candidate's model, its figures and claim in the report."""
    report["shipped"] = chosen.name
    report["accuracy"] = chosen.accuracy
    report["calibration_accuracy"] = chosen.calibration_accuracy
    report["claim"], warnings = claim(run, chosen.accuracy)
    report["claim"]["method"] = {"candidate": chosen.name, "how": chosen.how}
    report["warnings"].extend(warnings)
    if report.get("layers"):
        report["layer_cosines"] = _layer_cosines(run, chosen, fp32_sources, report["layers"])
    return ir.from_proto(onnx.load(str(chosen.path)))


def _layer_cosines(run: PrecisionRun, chosen: _Candidate, sources: tuple[Path, ...], rows: list[dict]) -> dict:
    """Each row of ``precision.layers`` gets its output tensor's cosine in the shipped model to the fp32
    model's on the held-out samples (``layer_cosines``); what was compared, on how many samples."""
    names = {node.name for node in onnx.load(str(chosen.path), load_external_data=False).graph.node}
    # The fp32 graph the shipped model was quantised from: the one whose node names it keeps most of.
    source = max(dict.fromkeys(sources), key=lambda path: len(names & {
        n.name for n in onnx.load(str(path), load_external_data=False).graph.node}))  # fmt: skip
    samples = run.judged or run.samples
    try:
        found = layer_cosines(source, chosen.path, [row["layer"] for row in rows], samples)
    except Exception as err:  # noqa: BLE001 - a figure to look at, not a check: its failure is reported, not fatal
        return {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"}
    for row in rows:
        if row["layer"] in found:
            row.update({k: v for k, v in found[row["layer"]].items() if k != "tensor"})
    return {
        "model": chosen.name, "against": source.name, "layers": len(found),
        "samples": min(len(samples), LAYER_COSINE_SAMPLES),
        "on": "held-out samples" if run.judged else "the calibration samples (nothing held out)",
        "how": "cosine of each layer's output tensor in the shipped model to the fp32 model's, both run as written "
        "(ORT_DISABLE_ALL): over every sample at once, and its worst sample",
    }  # fmt: skip


def _calibration_methods(run, fp32: Path, cache: Path, fmt: Int8Format, full: _Candidate, slower: frozenset[str],
                         candidates: list[_Candidate], report: dict) -> _Candidate:  # fmt: skip
    """The all-int8 model (``full``) misses the target with MinMax ranges: the same model calibrated by
    ONNX Runtime's Percentile (ranges clipped at the 99.999th percentile: one outlier no longer stretches a
    scale) and Entropy (the range keeping the most information, KL divergence) methods, each a candidate.
    The method whose model judges best (least loss on the held-out samples) calibrates the later candidates
    (weights only, mixed); ``precision.calibration_method`` says which and why."""
    tried = {"MinMax": full.accuracy.get("loss")}
    best = full
    nodes = {"nodes_to_exclude": sorted(slower)} if slower else {}
    for method in CALIBRATION_METHODS:
        run.method = method
        candidate = _Candidate(
            f"static_qdq_{method.lower()}", run.workdir / f"static_{method.lower()}.onnx",
            f"{full.how}, calibrated by {method} instead of MinMax",
            recipe=_static_recipe(run, fp32, cache, fmt, **nodes), int8_nodes=full.int8_nodes,
        )  # fmt: skip
        run.report(0.3, f"int8 candidate {candidate.name}")
        _scored(run, candidate, lambda c=candidate: c.recipe(run.calibration, "fold0", c.path), run.reference())
        candidates.append(candidate)
        tried[method] = None if candidate.error else candidate.accuracy.get("loss")
        if candidate.error is None and candidate.accuracy.get("loss", 1.0) < best.accuracy.get("loss", 1.0):
            best = candidate
    run.method = "MinMax" if best is full else best.name.rsplit("_", 1)[-1].capitalize()
    report["calibration_method"] = {
        "chosen": run.method, "loss_by_method": tried,
        "why": "MinMax's all-int8 model missed the target on the held-out samples; the method with the least loss "
        "there calibrates the later candidates",
    }  # fmt: skip
    if fmt.runs_here and best.error is None and best.recipe is not None:  # a vendor quantises for itself
        report["bias_correction"] = _bias_corrected(run, fp32, best, candidates)
    return best


def _equalised(run, fp32: Path, cache: Path, fmt: Int8Format, best: _Candidate, slower: frozenset[str],
               candidates: list[_Candidate]) -> tuple[dict, tuple[_Candidate, Path] | None]:  # fmt: skip
    """The all-int8 model (``best``: the best-calibrated one, which missed the target) made again from the fp32
    model after cross-layer equalisation (``precision.equalise``: exact, its outputs checked bit-close on the
    held-out samples first), a candidate of its own, and that model with its biases corrected (as
    ``_bias_corrected``) another. Node names do not change, so the same nodes are kept float. What was
    equalised, and what each candidate lost, for ``precision.equalisation``; and the equalised candidate with its
    fp32 model (None where none was made)."""
    started = time.perf_counter()
    equalised, found = equalise(onnx.load(str(fp32)))
    if not found["layers_rescaled"]:
        return {**found, "candidate": None, "why": "no pair of layers could be equalised exactly"}, None
    equalised_fp32 = _save(equalised, run.workdir / "fp32_equalised.onnx")
    del equalised
    difference = max_relative_difference(_outputs(fp32, run.judged), _outputs(equalised_fp32, run.judged))
    found["fp32_max_relative_difference"] = difference
    if difference > EQUALISATION_TOLERANCE:
        return {**found, "candidate": None,
                "why": f"the equalised fp32 model departs from the fp32 one by {difference:.3g} (relative): not used"}, None  # fmt: skip
    nodes = {"nodes_to_exclude": sorted(slower)} if slower else {}
    method = "" if run.method == "MinMax" else f"_{run.method.lower()}"
    candidate = _Candidate(
        f"static_qdq{method}_cle", run.workdir / "static_cle.onnx",
        f"static QDQ ({run.method}) of every quantisable op of the model after cross-layer equalisation "
        f"({found['layers_rescaled']} layers' output channels rescaled by powers of two against their readers' "
        "input channels, exact in fp32: precision.equalise)" + (f"; {len(slower)} ops measured slower kept float" if slower else ""),
        recipe=_static_recipe(run, equalised_fp32, cache.with_name(f"{cache.stem}.equalised.json"), fmt, **nodes),
        int8_nodes=best.int8_nodes,
    )  # fmt: skip
    run.report(0.3, f"int8 candidate {candidate.name}")
    _scored(run, candidate, lambda: candidate.recipe(run.calibration, "fold0", candidate.path), run.reference())
    candidates.append(candidate)
    record = {**found, "candidate": candidate.name,
              "loss": None if candidate.error else candidate.accuracy.get("loss"),
              "ok": bool(candidate.accuracy.get("ok")) and candidate.error is None,
              "from": best.name, "loss_before": best.accuracy.get("loss")}  # fmt: skip
    if candidate.error is None and candidate.recipe is not None:
        corrected = _bias_corrected(run, equalised_fp32, candidate, candidates, "static_cle_bias_corrected.onnx")
        record["bias_corrected"] = {k: corrected.get(k) for k in ("candidate", "loss", "corrected")}
    record["seconds"] = round(time.perf_counter() - started, 2)
    return record, (candidate, equalised_fp32)


def _adarounded(run, fp32: Path, best: _Candidate, candidates: list[_Candidate]) -> dict:
    """The all-int8 model ``best`` (the equalised one where equalisation made one, else the best-calibrated) with
    its weights' rounding learned on the calibration samples (``precision.adaround``), then its biases corrected
    (as ``_bias_corrected``): a candidate of its own (EfficientNet-Lite0, judged on 85 crops of other photos:
    cosine 0.9975 with bias correction alone, 0.9981 with learned rounding first). What was rounded, and what the
    candidate lost, for ``precision.adaround``."""
    found: dict = {}

    def recipe(samples: list[dict], tag: str, out: Path) -> Path:
        plain = best.recipe(samples, tag, out.with_name(f"{out.stem}.nearest.onnx"))
        rounded = out.with_name(f"{out.stem}.uncorrected.onnx")
        found.update(adaround(plain, fp32, samples, rounded))
        found["bias_correction"] = correct_biases(rounded, fp32, samples, out)
        return out

    how = ("its int8 weights then rounded up or down as learned on the calibration samples, layer by layer "
           "(AdaRound: precision.adaround), and its Conv biases corrected (precision.bias_correction)")  # fmt: skip
    return _derived(run, best, candidates, "adaround", run.workdir / "static_adaround.onnx", how, recipe, found)


def _bias_corrected(run, fp32: Path, best: _Candidate, candidates: list[_Candidate],
                    file: str = "static_bias_corrected.onnx") -> dict:  # fmt: skip
    """The best-calibrated all-int8 model with each Conv's bias corrected by the mean error its output carries
    on the calibration samples (``precision.bias_correction``), a candidate of its own (EfficientNet-Lite0
    all-int8: held-out top-1 0.871 -> 0.929). The later candidates are not corrected: each search step would
    pay for it again."""
    found: dict = {}

    def recipe(samples: list[dict], tag: str, out: Path) -> Path:
        plain = best.recipe(samples, tag, out.with_name(f"{out.stem}.uncorrected.onnx"))
        found.update(correct_biases(plain, fp32, samples, out))
        return out

    how = ("each quantised Conv's bias then corrected, layer by layer, by the mean error its output carries on the "
           "calibration samples (precision.bias_correction)")  # fmt: skip
    return _derived(run, best, candidates, "bias_corrected", run.workdir / file, how, recipe, found)


def _derived(run, best: _Candidate, candidates: list[_Candidate], suffix: str, path: Path, how: str, recipe,
             found: dict) -> dict:  # fmt: skip
    """``best`` made again by ``recipe`` (a step after its quantiser), scored as a candidate of its own named
    ``<best>_<suffix>``; what the step reported (``found``, filled by the recipe) with the candidate's loss
    beside ``best``'s."""
    candidate = _Candidate(f"{best.name}_{suffix}", path, f"{best.how}; {how}", recipe=recipe,
                           int8_nodes=best.int8_nodes)  # fmt: skip
    run.report(0.3, f"int8 candidate {candidate.name}")
    _scored(run, candidate, lambda: recipe(run.calibration, "fold0", candidate.path), run.reference())
    candidates.append(candidate)
    return {**found, "candidate": candidate.name, "loss": None if candidate.error else candidate.accuracy.get("loss"),
            "from": best.name, "loss_before": best.accuracy.get("loss")}  # fmt: skip


def _no_int8(run, report, candidates, layers, reference, cache, fmt, fp32) -> None:
    """No int8 model both meets the target and is not slower than fp32: fp32 with a warning, or a failure
    that names the layers which miss the target."""
    accurate = [c for c in candidates if c.accuracy.get("ok") and c.error is None]
    if accurate:  # accurate but slower: the never-slower guard keeps fp32, whatever the fallback setting
        report["shipped"] = "fp32"
        report["warnings"].append(
            "no int8 model was faster than the fp32 one on this machine ("
            + ", ".join(f"{c.name}: time ratio {c.ratio:.3f}" for c in accurate if c.ratio is not None)
            + "); shipped fp32 (never-slower guard)"
        )
        return None
    best = max((c for c in candidates if c.error is None), key=lambda c: 1 - c.accuracy["loss"], default=None)
    missed = _describe(best.accuracy, run.options.accuracy) if best else "every quantiser failed"
    worst_layers = ""
    if layers and not any("sensitivity" in row for row in report.get("layers", [])):
        sensitivity = _sensitivity(run, fp32, layers, reference, cache, fmt)
        ranked = sorted(sensitivity.items(), key=lambda item: sensitivity_order(item[1]))[:5]
        rows = {row["layer"]: row for row in report.get("layers", [])}
        for name, entry in sensitivity.items():
            rows.setdefault(name, {"layer": name}).update(sensitivity=entry["loss"], alone=entry["outputs"])
        if not report.get("layers"):  # no per-op costing: the five most sensitive layers
            report["layers"] = [rows[name] for name, _ in ranked]
        worst_layers = "; most sensitive layers: " + ", ".join(f"{n} (loss {s['loss']:.4f})" for n, s in ranked)
    message = (
        f"no int8 model meets the accuracy target on {run.measured_on()} (best: {best.name if best else '-'}, "
        f"{missed}){worst_layers}"
    )
    if run.options.precision == "mixed":  # float everywhere is the end of mixed's search: fp32, said so
        report["shipped"] = "fp32"
        report["warnings"].append(f"{message}; mixed kept every layer in float, so fp32 shipped")
        return None
    if run.options.precision_fallback == "fp32":
        report["shipped"] = "fp32"
        report["warnings"].append(f"{message}; shipped fp32 as precision_fallback asks")
        return None
    raise ValidationFailedError(
        f"{message}. Use precision 'mixed' to keep the sensitive layers in float, relax 'accuracy', or set "
        "precision_fallback 'fp32'.",
        details={"precision": report},
    )
