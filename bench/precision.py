"""``python -m bench.precision``: Flex-DSA's int8 and mixed outputs beside ONNX Runtime's own
``quantize_dynamic`` and ``quantize_static`` of the same models, in one run, on this machine's CPU.

**Trained models, held-out samples** (the default; ``--trained NAMES``): the trained fixtures of
``bench/trained.py`` (a classifier, a transformer encoder, a recurrent model, a packed-output detector, real
weights and real inputs). The first third of each model's samples (in source order: other photos, other
sentences, other clips than the rest) is all that ORT's ``quantize_static`` and our pipeline
(``--precision mixed`` with the fixture's task metric, given as an ``.npz``) receive; every variant is judged
on the other two thirds, which neither saw: the worst output cosine, and the task's metric (top-1 agreement;
per-slice cosine of a packed output), against the accuracy target (cosine >= 0.99, top-1 >= 0.99). Then every
variant is timed as below, on a held-out sample. Results: ``bench/results/precision_trained.json``. The
variants: the original; ``ort-dynamic`` and ``ort-static`` (below); ``nncf`` and ``nncf-mixed`` (NNCF 3.4's
``nncf.quantize`` with its default and its ``mixed`` preset, run in NNCF's own environment:
``bench/nncf_peer.py``); ``flexdsa`` (ours, ``mixed``) and ``flexdsa-no-cle`` (the same without cross-layer
equalisation among the candidates: what that method adds).

**Random-weight bench models** (``--models NAMES``): per model (the bench models of ``bench/models.py``, batch 1): 16 calibration samples (bench inputs, seeds
1-16) feed both our pipeline (``--precision int8`` / ``mixed``, given as an ``.npz``) and ORT's
``quantize_static``; 16 other samples (seeds 101-116) judge every variant against the original: the worst
output cosine, and top-1 agreement on classifier outputs (``logits``). Then every variant is timed at
ORT_ENABLE_ALL, 1 thread, round-robin (``bench/measure.py``); the ratio is the median over rounds of
(variant / original in the same round). Results: ``bench/results/precision.json``.

    ort-dynamic   quantize_dynamic(original) with its defaults (s8 weights per tensor): "nothing else done"
    ort-static    quantize_static(original, QDQ, u8 activations, s8 per-channel weights, reduce_range
                  as this CPU needs (see flexdsa_core/precision/formats.py), MinMax on the same samples)
    flexdsa-int8  FlexDSAOptimizer('cpu-ort').optimize(precision='int8', calibration=samples)
    flexdsa-mixed the same with precision='mixed'

Random weights make top-1 meaningless (near-tied logits), so their figures are numerics, not accuracy.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench import RESULTS_DIR
from bench.measure import Timed, make_inputs, paired_ratio, round_robin, session
from bench.models import bench_model

CALIBRATION_SEEDS = range(1, 17)
EVALUATION_SEEDS = range(101, 117)
VARIANTS = ("original", "ort-dynamic", "ort-static", "flexdsa-int8", "flexdsa-mixed")
CONTROL = "original (A/A)"


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b / norms) if norms else 1.0


def _accuracy(path: str, reference: list[dict], samples: list[dict]) -> dict:
    sess = session(path, "enable_all")
    names = [o.name for o in sess.get_outputs()]
    got = [dict(zip(names, sess.run(names, feed), strict=True)) for feed in samples]
    cosines = {
        name: _cosine(np.concatenate([r[name].ravel() for r in reference]), np.concatenate([g[name].ravel() for g in got]))
        for name in names
    }
    result = {"min_cosine": round(min(cosines.values()), 6), "cosine": {k: round(v, 6) for k, v in cosines.items()}}
    if "logits" in names:
        want = np.concatenate([np.argmax(r["logits"], axis=-1).ravel() for r in reference])
        have = np.concatenate([np.argmax(g["logits"], axis=-1).ravel() for g in got])
        result["top1"] = round(float(np.mean(want == have)), 4)
    return result


def _ort_quantized(original: Path, folder: Path, samples: list[dict]) -> dict[str, Path]:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    from flexdsa_core.precision import cpu_int8_features

    paths = {"ort-dynamic": folder / "ort_dynamic.onnx", "ort-static": folder / "ort_static.onnx"}
    quantize_dynamic(str(original), str(paths["ort-dynamic"]), weight_type=QuantType.QInt8)
    reader = iter(samples)
    quantize_static(
        str(original), str(paths["ort-static"]), type("Reader", (), {"get_next": lambda self: next(reader, None)})(),
        quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
        per_channel=True, reduce_range=cpu_int8_features()["reduce_range"],
    )  # fmt: skip
    return paths


def _ours(original: Path, folder: Path, npz: bytes, precision: str) -> tuple[Path, dict]:
    from flexdsa_core import FlexDSAOptimizer, OptimizeOptions

    started = time.perf_counter()
    result = FlexDSAOptimizer("cpu-ort").optimize(original, OptimizeOptions(precision=precision), calibration=npz)
    seconds = time.perf_counter() - started
    path = folder / f"flexdsa_{precision}.onnx"
    path.write_bytes(result.model_bytes())
    section = result.report["precision"]
    return path, {
        "seconds": round(seconds, 1),
        "shipped": section.get("shipped"),
        "shipped_how": next((c.get("how") for c in section.get("candidates", []) if c["name"] == section.get("shipped")), None),
        "classifier_head": section.get("classifier_head"),
        "candidates": [
            {k: c.get(k) for k in ("name", "how", "meets_target", "time_ratio_vs_fp32", "verdict_vs_fp32")}
            | {"loss": c["accuracy"].get("loss"), "speedup_vs_original": (c.get("timing_vs_fp32") or {}).get("speedup_vs_original")}
            for c in section.get("candidates", [])
        ],
        "kept_float": [r["layer"] for r in section.get("layers", []) if r.get("precision") == "float32"],
        "cpu": section.get("cpu"),
    }


def bench_one(name: str, rounds: int, warmup: int) -> dict:
    model = bench_model(name)
    original = model.path
    print(f"\n== {name}: {original.name}, dims {model.dims}", flush=True)
    probe = session(str(original), "disable_all")
    calibration = [make_inputs(probe, model.dims, seed) for seed in CALIBRATION_SEEDS]
    evaluation = [make_inputs(probe, model.dims, seed) for seed in EVALUATION_SEEDS]
    names = [o.name for o in probe.get_outputs()]
    reference = [dict(zip(names, probe.run(names, feed), strict=True)) for feed in evaluation]
    del probe
    buffer = io.BytesIO()
    np.savez(buffer, **{k: np.concatenate([s[k] for s in calibration]) for k in calibration[0]})
    record: dict = {"dims": model.dims, "variants": {}}
    with tempfile.TemporaryDirectory(prefix=f"bench-precision-{name}-") as tmp:
        folder = Path(tmp)
        paths: dict[str, Path] = {"original": original}
        started = time.perf_counter()
        paths.update(_ort_quantized(original, folder, calibration))
        record["ort_quantize_seconds"] = round(time.perf_counter() - started, 1)
        from flexdsa_core import FlexDSAError

        for precision in ("int8", "mixed"):
            print(f"  flexdsa {precision} ...", flush=True)
            try:
                paths[f"flexdsa-{precision}"], record[f"flexdsa-{precision}"] = _ours(
                    original, folder, buffer.getvalue(), precision
                )
            except FlexDSAError as error:  # a refusal (no int8 model meets the target) is a result, shown
                record[f"flexdsa-{precision}"] = {"error": error.message}
                print(f"  flexdsa {precision}: {error.message[:300]}", flush=True)
        timed = []
        for variant, path in paths.items():
            record["variants"][variant] = {"accuracy": _accuracy(str(path), reference, evaluation),
                                           "size_mb": round(path.stat().st_size / 2**20, 2)}  # fmt: skip
            sess = session(str(path), "enable_all")
            timed.append(Timed(variant, sess, evaluation[0]))
        # The control: a second session of the unchanged original, timed in the same rounds (its "speed-up" is
        # pure noise).
        timed.append(Timed(CONTROL, session(str(original), "enable_all"), evaluation[0]))
        print(f"  timing {len(timed)} sessions x {rounds} rounds ...", flush=True)
        round_robin(timed, rounds, warmup)
        by_name = {t.key: t for t in timed}
        reference_times = by_name["original"].times
        for variant, entry in [*record["variants"].items(), (CONTROL, record.setdefault("control", {}))]:
            times = by_name[variant].times
            ratio = paired_ratio(times, reference_times)
            speedups = sorted(r / t for r, t in zip(reference_times, times, strict=True))
            quartiles = statistics.quantiles(speedups, n=4)
            entry.update(
                median_ms=round(statistics.median(times) * 1e3, 3), speedup=round(1 / ratio, 3),
                speedup_iqr=[round(quartiles[0], 3), round(quartiles[2], 3)],
                times_ms=[round(t * 1e3, 3) for t in times],
            )  # fmt: skip
    return record


def _keeps_accuracy(entry: dict) -> bool:
    """The default accuracy target on the evaluation samples: cosine >= 0.99, top-1 >= 0.99 where judged."""
    return entry["accuracy"]["min_cosine"] >= 0.99 and entry["accuracy"].get("top1", 1.0) >= 0.99


def versus_ort(record: dict) -> dict[str, dict]:
    """Each Flex-DSA variant's speed-up over ORT's ``quantize_dynamic`` output, over the faster ORT quantiser,
    and over the faster one that keeps the accuracy target (None where neither does)."""
    variants = record["variants"]
    ort = [variants[v] for v in ("ort-dynamic", "ort-static") if v in variants]
    accurate = [e for e in ort if _keeps_accuracy(e)]
    result = {}
    for variant in ("flexdsa-int8", "flexdsa-mixed"):
        if variant not in variants or not ort:
            continue
        ours = variants[variant]
        result[variant] = {
            "vs_ort_dynamic": _versus(ours, variants["ort-dynamic"]) if "ort-dynamic" in variants else None,
            "vs_faster_ort": _versus(ours, max(ort, key=lambda e: e["speedup"])),
            "vs_faster_accurate_ort": _versus(ours, max(accurate, key=lambda e: e["speedup"])) if accurate else None,
        }
    return result


def _versus(ours: dict, theirs: dict) -> float:
    """How many times faster ``ours`` ran than ``theirs``: the median over rounds of their time / ours in the
    same round (paired, like every ratio here); from the speed-ups where the rounds were not kept."""
    if "times_ms" in ours and "times_ms" in theirs:
        return round(statistics.median(t / o for t, o in zip(theirs["times_ms"], ours["times_ms"], strict=True)), 3)
    return round(ours["speedup"] / theirs["speedup"], 3)


def _table(results: dict) -> str:
    lines = [
        f"{'model':<12} {'variant':<14} {'speed-up':>9} {'IQR':>13} {'ms':>9} {'cosine':>9} {'top-1':>6} "
        f"{'vs dyn':>7} {'vs ORT':>7} {'vs acc. ORT':>11}  shipped"
    ]
    for name, record in results["models"].items():
        ratios = versus_ort(record)
        for variant, entry in record["variants"].items():
            shipped = (record.get(variant) or {}).get("shipped", "")
            acc = entry["accuracy"]
            ratio = ratios.get(variant, {})
            faster = f"{ratio['vs_faster_ort']:.2f}x" if ratio else ""
            dynamic = f"{ratio['vs_ort_dynamic']:.2f}x" if ratio.get("vs_ort_dynamic") else ""
            accurate = f"{ratio['vs_faster_accurate_ort']:.2f}x" if ratio.get("vs_faster_accurate_ort") else ""
            spread = "[{:.2f}, {:.2f}]".format(*entry["speedup_iqr"]) if "speedup_iqr" in entry else ""
            lines.append(
                f"{name:<12} {variant:<14} {entry['speedup']:>8.2f}x {spread:>13} {entry['median_ms']:>9.2f} "
                f"{acc['min_cosine']:>9.5f} {acc.get('top1', float('nan')):>6.3f} {dynamic:>7} {faster:>7} {accurate:>11}  {shipped}"
            )
        if "speedup" in record.get("control", {}):
            control = record["control"]
            lines.append(
                f"{name:<12} {CONTROL:<14} {control['speedup']:>8.2f}x "
                + "{:>13}".format("[{:.2f}, {:.2f}]".format(*control["speedup_iqr"]))
                + "  (the noise: a second session of the original)"
            )
        for variant in ("flexdsa-int8", "flexdsa-mixed"):
            if "error" in (record.get(variant) or {}):
                lines.append(f"{name:<12} {variant:<14} refused: {record[variant]['error'][:200]}")
    for title, values in results["geomean"].items():
        lines.append(f"geomean {title}: " + ", ".join(f"{k} {v:.2f}x" for k, v in values.items() if v))
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- trained models
TRAINED_VARIANTS = ("original", "ort-dynamic", "ort-static", "nncf", "nncf-mixed", "flexdsa", "flexdsa-no-cle")


def _task_figures(reference: list[dict], got: list[dict], accuracy) -> dict:
    """The accuracy target's verdict and the figures the table shows: worst cosine, top-1 or the worst slice."""
    from flexdsa_core.accuracy import score

    found = score(reference, got, accuracy)
    task = {}
    for name, entry in found["outputs"].items():
        if "top1_rule" in entry:  # on the rows the rule judges (confident ones by default), and on every row
            rows = f"{entry['rows']} {'confident ' if entry['top1_rule'] == 'confident' else ''}rows"
            task[f"{name} top-1 ({rows})"] = entry["top1_agreement"]
            task[f"{name} top-1 expected"] = entry["top1_expected"]
            task[f"{name} top-1 all {entry['rows_all']} rows"] = entry["top1_agreement_all_rows"]
        for piece, figures in (entry.get("slices") or {}).items():
            task[f"{name}[{piece}] cosine"] = figures.get("cosine", figures.get("top1_agreement"))
    cosines = [e["cosine"] for e in found["outputs"].values() if "cosine" in e]
    return {"ok": found["ok"], "min_cosine": min(cosines) if cosines else None, "task": task,
            "samples": found["samples"], "detail": found}  # fmt: skip


def bench_trained(name: str, rounds: int, warmup: int) -> dict:
    from bench.trained import fixture
    from flexdsa_core import FlexDSAError
    from flexdsa_core.options import AccuracyTarget

    trained = fixture(name)
    calibration, held_out = trained.split()
    calibration_feeds, feeds = trained.feeds(calibration), trained.feeds(held_out)
    accuracy = AccuracyTarget(**trained.accuracy)
    print(f"\n== {name} ({trained.meta['task']}): calibrate on {len(calibration_feeds)}, judge on {len(feeds)} held out; "
          f"{trained.meta['inputs']}", flush=True)  # fmt: skip
    record: dict = {"task": trained.meta["task"], "inputs": trained.meta["inputs"], "weights": trained.meta["weights"],
                    "calibration_samples": len(calibration_feeds), "held_out_samples": len(feeds), "variants": {}}  # fmt: skip
    probe = session(str(trained.model), "disable_all")
    names = [o.name for o in probe.get_outputs()]
    reference = [dict(zip(names, probe.run(names, feed), strict=True)) for feed in feeds]
    del probe
    buffer = io.BytesIO()
    groups = trained.groups()  # each sample's photo or clip: the job holds out whole ones
    np.savez(buffer, **calibration, **({} if groups is None else {"groups": groups[: len(calibration_feeds)]}))
    with tempfile.TemporaryDirectory(prefix=f"bench-precision-{name}-") as tmp:
        folder = Path(tmp)
        paths: dict[str, Path] = {"original": trained.model}
        paths.update(_ort_quantized(trained.model, folder, calibration_feeds))
        paths.update(_nncf_quantized(trained.model, folder, calibration_feeds, record))
        for variant, equalisation in (("flexdsa", True), ("flexdsa-no-cle", False)):
            print(f"  {variant} mixed ...", flush=True)
            try:
                paths[variant], record[variant] = _ours_trained(trained.model, folder / f"{variant}.onnx", accuracy,
                                                                buffer.getvalue(), equalisation)  # fmt: skip
            except FlexDSAError as error:
                record[variant] = {"error": error.message}
                print(f"  {variant}: {error.message[:300]}", flush=True)
        timed = []
        for variant, path in paths.items():
            sess = session(str(path), "enable_all")
            got = [dict(zip(names, sess.run(names, feed), strict=True)) for feed in feeds]
            record["variants"][variant] = {"accuracy": _task_figures(reference, got, accuracy)}
            timed.append(Timed(variant, sess, feeds[0]))
        timed.append(Timed(CONTROL, session(str(trained.model), "enable_all"), feeds[0]))
        print(f"  timing {len(timed)} sessions x {rounds} rounds ...", flush=True)
        round_robin(timed, rounds, warmup)
        by_name = {t.key: t for t in timed}
        original = by_name["original"].times
        for variant, entry in [*record["variants"].items(), (CONTROL, record.setdefault("control", {}))]:
            times = by_name[variant].times
            speedups = sorted(r / t for r, t in zip(original, times, strict=True))
            quartiles = statistics.quantiles(speedups, n=4)
            entry.update(median_ms=round(statistics.median(times) * 1e3, 3),
                         speedup=round(1 / paired_ratio(times, original), 3),
                         speedup_iqr=[round(quartiles[0], 3), round(quartiles[2], 3)],
                         times_ms=[round(t * 1e3, 4) for t in times])  # fmt: skip
    return record


def _ours_trained(model: Path, out: Path, accuracy, npz: bytes, equalisation: bool) -> tuple[Path, dict]:
    """Our ``mixed`` compile of a trained fixture, with cross-layer equalisation among its candidates or without
    (``precision.int8.EQUALISATION``: what the new method adds, everything else alike)."""
    from unittest import mock

    from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
    from flexdsa_core.precision import int8

    started = time.perf_counter()
    with mock.patch.object(int8, "EQUALISATION", equalisation):
        result = FlexDSAOptimizer("cpu-ort").optimize(
            model, OptimizeOptions(precision="mixed", accuracy=accuracy), calibration=npz
        )
    out.write_bytes(result.model_bytes())
    section = result.report["precision"]
    return out, {
        "seconds": round(time.perf_counter() - started, 1), "shipped": section.get("shipped"),
        "judgement": section.get("judgement"), "warnings": section.get("warnings"), "claim": section.get("claim"),
        "equalisation": section.get("equalisation"), "calibration_method": section.get("calibration_method"),
        "adaround": section.get("adaround"),
        "own_verdict": {k: (section.get(k) or {}).get("loss") for k in ("accuracy", "calibration_accuracy")},
        "candidates": [{k: c.get(k) for k in ("name", "how", "meets_target", "time_ratio_vs_fp32")}
                       | {"loss": c["accuracy"].get("loss")} for c in section.get("candidates", [])],
    }  # fmt: skip


# NNCF's presets run as peers: its default (symmetric int8 activations) and the one ONNX Runtime's u8 kernels take.
NNCF_PRESETS = ("performance", "mixed")


def _nncf_quantized(original: Path, folder: Path, feeds: list[dict], record: dict) -> dict[str, Path]:
    """NNCF's int8 of ``original`` per preset (``bench/nncf_peer.py``, in NNCF's own environment), on the same
    calibration feeds; a preset that fails is said in ``record["nncf"]`` and left out."""
    from bench import nncf_peer

    samples = nncf_peer.save_feeds(feeds, folder / "nncf_calibration.npz")
    paths, record["nncf"] = {}, {}
    for preset in NNCF_PRESETS:
        variant = "nncf" if preset == "performance" else f"nncf-{preset}"
        print(f"  {variant} ...", flush=True)
        found = nncf_peer.quantise(original, samples, folder / f"{variant}.onnx", preset)
        record["nncf"][variant] = found
        if "error" in found:
            print(f"  {variant}: {found['error'][:300]}", flush=True)
        else:
            paths[variant] = folder / f"{variant}.onnx"
    return paths


def trained_verdict(record: dict) -> dict:
    """Ours against the goal: accurate on held-out samples, and >= 1.15x the fastest accurate peer (ONNX
    Runtime's quantisers, NNCF's) (>= 1.5x the original where none is accurate)."""
    variants = record["variants"]
    ours = variants.get("flexdsa")
    if ours is None:
        return {"ok": False, "why": "no Flex-DSA model"}
    accurate = [v for k, v in variants.items() if k.startswith(("ort-", "nncf")) and v["accuracy"]["ok"]]
    if accurate:
        peer = max(accurate, key=lambda v: v["speedup"])
        ratio = _versus(ours, peer)
        return {"ok": ours["accuracy"]["ok"] and ratio >= 1.15, "vs": "fastest accurate peer",
                "ratio": ratio}  # fmt: skip
    return {"ok": ours["accuracy"]["ok"] and ours["speedup"] >= 1.5, "vs": "original (no peer is accurate)",
            "ratio": ours["speedup"]}  # fmt: skip


def _trained_table(results: dict) -> str:
    """Per model and variant: what shipped, the speed-up over the original with its interquartile range over
    rounds, the worst cosine and the task's figures on the held-out samples, and the verdict."""
    lines = [f"{'model':<19} {'variant':<15} {'shipped':<40} {'speed-up':>9} {'IQR':>13} {'cosine':>9} {'target':>6}  task metric"]
    for name, record in results["models"].items():
        for variant, entry in record["variants"].items():
            acc = entry["accuracy"]
            task = ", ".join(f"{k} {v:.4f}" for k, v in acc["task"].items() if v is not None and "expected" not in k)
            ours = record.get(variant) if variant.startswith("flexdsa") else None
            shipped = ((ours or {}).get("shipped") or "")[:40] if ours else ("fp32" if variant == "original" else "int8")
            lines.append(
                f"{name:<19} {variant:<15} {shipped:<40} {entry['speedup']:>8.2f}x "
                f"{'[{:.2f}, {:.2f}]'.format(*entry['speedup_iqr']):>13} {acc['min_cosine'] or float('nan'):>9.5f} "
                f"{'meets' if acc['ok'] else 'MISS':>6}  {task}"
            )
        for variant in ("flexdsa", "flexdsa-no-cle"):
            if "error" in (record.get(variant) or {}):
                lines.append(f"{name:<19} {variant:<15} refused: {record[variant]['error'][:160]}")
        control = record.get("control", {})
        if "speedup" in control:
            lines.append(f"{name:<19} {'A/A control':<15} {'(noise: the original again)':<40} {control['speedup']:>8.2f}x "
                         + "{:>13}".format("[{:.2f}, {:.2f}]".format(*control["speedup_iqr"])))  # fmt: skip
        equalisation = (record.get("flexdsa") or {}).get("equalisation")
        if equalisation:
            lines.append(f"{name:<19} CLE: {equalisation.get('layers_rescaled')} layers rescaled, candidate "
                         f"{equalisation.get('candidate')} loss {equalisation.get('loss')} (from {equalisation.get('from')} "
                         f"loss {equalisation.get('loss_before')}); refused pairs {equalisation.get('refused')}")  # fmt: skip
        rounding = (record.get("flexdsa") or {}).get("adaround")
        if rounding:
            error = rounding.get("output_error_vs_nearest") or {}
            lines.append(f"{name:<19} AdaRound: {rounding.get('rounded')} layers rounded in {rounding.get('seconds')} s "
                         f"(output error vs nearest: median {error.get('median')}, worst {error.get('worst')}), "
                         f"candidate {rounding.get('candidate')} loss {rounding.get('loss')} (from {rounding.get('from')} "
                         f"loss {rounding.get('loss_before')}); left {len(rounding.get('left') or {})}")  # fmt: skip
        verdict = trained_verdict(record)
        if "ratio" in verdict:
            lines.append(f"{name:<19} goal {'met' if verdict['ok'] else 'NOT met'}: ours {verdict['ratio']:.2f}x the "
                         f"{verdict['vs']} (held out: {record['held_out_samples']} samples, calibrated on "
                         f"{record['calibration_samples']})")  # fmt: skip
    return "\n".join(lines)


# ------------------------------------------------------------------------------ claims against other photos
# Candidates of graded accuracy: static int8 of the classifier with its first k weight layers (graph order)
# kept float.
CLAIM_LADDER = (0, 5, 10, 20, 35)
CLAIM_RULES = ("confident", "all")


def _ort_static(original: Path, out: Path, samples: list[dict], exclude: list[str]) -> Path:
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    from flexdsa_core.precision import cpu_int8_features

    reader = iter(samples)
    quantize_static(
        str(original), str(out), type("Reader", (), {"get_next": lambda self: next(reader, None)})(),
        quant_format=QuantFormat.QDQ, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
        per_channel=True, reduce_range=cpu_int8_features()["reduce_range"], nodes_to_exclude=exclude,
    )  # fmt: skip
    return out


def claims_study(name: str = "efficientnet-lite0", photos: int = 8, seed: int = 0) -> dict:
    """Does what a job claims from its held-out samples hold on other photos? Twice: the crops of the first
    ``photos`` photos are the job's samples and the rest are the other photos, then the other way round. The
    job's samples are split as a job splits them: by crops (the crops of one photo on both sides) or by whole
    photos (``groups``); each candidate of ``CLAIM_LADDER`` is calibrated on the one side and judged on the
    other (the claim: top-1 found and expected, ``accuracy.score``), then run on the crops of every other
    photo (what it does), under each top-1 rule. Results: ``bench/results/precision_claims.json``."""
    from bench.trained import fixture

    every = list(dict.fromkeys(str(s) for s in fixture(name).groups()))
    studies = [_claims_on(name, every[:photos], seed), _claims_on(name, every[photos:], seed)]
    rows = [row for study in studies for row in study["rows"]]
    return {"model": name, "arrangements": studies, "rows": rows, "summary": _claims_summary(rows)}


def _claims_on(name: str, first: list[str], seed: int) -> dict:
    """``claims_study`` with the crops of ``first`` as the job's samples."""
    import onnx

    from bench.trained import fixture
    from flexdsa_core.accuracy import score
    from flexdsa_core.holdout import plan
    from flexdsa_core.options import AccuracyTarget, HoldOut

    trained = fixture(name)
    feeds, sources = trained.feeds(trained.arrays()), [str(s) for s in trained.groups()]
    own = [i for i, source in enumerate(sources) if source in first]
    other = [i for i, source in enumerate(sources) if source not in first]
    splits = {
        "crops of the same photos": plan(len(own), HoldOut(by_groups=False), seed),
        "whole photos (groups)": plan(len(own), HoldOut(), seed, groups=[sources[i] for i in own]),
    }
    weight_layers = [n.name for n in onnx.load(str(trained.model)).graph.node if n.op_type in ("Conv", "Gemm", "MatMul")]

    def outputs(path, indices):
        sess = session(str(path), "enable_all")
        names = [o.name for o in sess.get_outputs()]
        return [dict(zip(names, sess.run(names, feeds[i]), strict=True)) for i in indices]

    other_reference = outputs(trained.model, other)
    record: dict = {"model": name, "calibration_photos": first, "other_photos": len(set(sources) - set(first)),
                    "other_rows": len(other), "rows": []}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-claims-") as tmp:
        for split_name, split in splits.items():
            fold = split.first
            calibrate, judge = [own[i] for i in fold.calibrate], [own[i] for i in fold.judge]
            judged_reference = outputs(trained.model, judge)
            for keep in CLAIM_LADDER:
                print(f"  {split_name}: {keep} layers float ...", flush=True)
                path = _ort_static(trained.model, Path(tmp) / f"k{keep}.onnx", [feeds[i] for i in calibrate], weight_layers[:keep])
                judged, found = outputs(path, judge), outputs(path, other)
                for rule in CLAIM_RULES:
                    target = AccuracyTarget(**trained.accuracy, top1_rows=rule)
                    claim = score(judged_reference, judged, target)["outputs"]["logits"]
                    truth = score(other_reference, found, target)["outputs"]["logits"]
                    record["rows"].append({
                        "job_photos": first[0], "split": split_name, "judged_samples": len(judge), "judged_groups": split.groups_in(fold.judge),
                        "float_layers": keep, "rule": rule, "rows": claim["rows"], "found": claim["top1_agreement"],
                        "expected": claim["top1_expected"], "bound": claim["top1_bound"], "other_rows": truth["rows"],
                        "other_found": truth["top1_agreement"], "cosine": claim["cosine"], "other_cosine": truth["cosine"],
                    })  # fmt: skip
    return record


def _claims_summary(rows: list[dict]) -> dict:
    """Per split and rule: how far the figures claimed were from what the models did on other photos (mean
    absolute error of found and of expected, and the mean signed error of expected), and of the candidates a
    job would have shipped (top-1 found and expected, and cosine, >= 0.99 on the held-out crops), how many
    the other photos refuted (top-1 or cosine under 0.99 there)."""
    found: dict = {}
    for split in dict.fromkeys(r["split"] for r in rows):
        for rule in CLAIM_RULES:
            mine = [r for r in rows if r["split"] == split and r["rule"] == rule and r["found"] is not None]
            if not mine:
                continue
            claimed = [r for r in mine if min(r["found"], r["expected"], r["cosine"]) >= 0.99]
            found[f"{split}, {rule} rows"] = {
                "found_error": round(statistics.mean(abs(r["found"] - r["other_found"]) for r in mine), 4),
                "expected_error": round(statistics.mean(abs(r["expected"] - r["other_found"]) for r in mine), 4),
                "expected_bias": round(statistics.mean(r["expected"] - r["other_found"] for r in mine), 4),
                "claims_met": len(claimed), "refuted": sum(min(r["other_found"], r["other_cosine"]) < 0.99 for r in claimed),
                "top1_claims_refuted": sum(min(r["found"], r["expected"]) >= 0.99 > r["other_found"] for r in mine),
                "their_cosine_at_most": max((r["cosine"] for r in mine if min(r["found"], r["expected"]) >= 0.99), default=None),
            }
    return found


def _claims_table(record: dict) -> str:
    lines = [f"{record['model']}: a job's claim from held-out crops of 8 photos, against the crops of the 8 others"]
    for study in record["arrangements"]:
        lines.append(f"  job photos from {study['calibration_photos'][0]}: other photos' crops {study['other_rows']}")
    lines.append(f"{'split':<26} {'float':>5} {'rule':<9} {'rows':>4} {'found':>6} {'expected':>8} {'bound':>6}  "
                 f"{'other photos (rows)':>20}")  # fmt: skip
    for r in record["rows"]:
        figures = (f"{r['found']:>6.3f} {r['expected']:>8.3f} {r['bound']:>6.3f}" if r["found"] is not None
                   else f"{'-':>6} {'-':>8} {'-':>6}")  # fmt: skip
        lines.append(f"{r['split']:<26} {r['float_layers']:>5} {r['rule']:<9} {r['rows']:>4} {figures}  "
                     f"{r['other_found']:>13.3f} ({r['other_rows']})")  # fmt: skip
    for key, value in record["summary"].items():
        lines.append(f"{key}: " + ", ".join(f"{k} {v}" for k, v in value.items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trained", default=None, help="comma-separated trained fixtures (default: all of them)")
    parser.add_argument("--models", default=None, help="comma-separated random-weight bench models instead")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--show", action="store_true", help="print the table of the last results, run nothing")
    parser.add_argument("--claims", action="store_true",
                        help="the claims study instead: does a job's held-out figure hold on other photos?")
    args = parser.parse_args(argv)
    # onnxruntime.quantization logs "consider pre-processing" to the root logger on every model it quantises.
    logging.getLogger().setLevel(logging.ERROR)
    from flexdsa_core.precision import cpu_int8_features

    if args.claims:
        out = RESULTS_DIR / "precision_claims.json"
        record = json.loads(out.read_text()) if args.show else claims_study()
        record["summary"] = _claims_summary(record["rows"])
        if not args.show:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(record, indent=1, default=str))
        print(_claims_table(record))
        return record
    if args.models is None:
        return _main_trained(args)
    if args.show:
        results = json.loads((RESULTS_DIR / "precision.json").read_text())
        print(_table(results))
        return results

    results: dict = {"cpu": cpu_int8_features(), "rounds": args.rounds, "models": {}}
    out = RESULTS_DIR / "precision.json"
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        results["models"][name] = bench_one(name, args.rounds, args.warmup)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1, default=str))
    kinds = {"transformers": ("bert", "gpt2", "llama", "vit"), "cnns": ("resnet", "mobilenetv2")}
    results["geomean"] = {}
    for kind, members in kinds.items():
        chosen = [r for n, r in results["models"].items() if n in members]
        results["geomean"][kind] = {
            variant: math.exp(statistics.mean(math.log(r["variants"][variant]["speedup"]) for r in chosen))
            for variant in VARIANTS[1:]
            if chosen and all(variant in r["variants"] for r in chosen)
        }
        # Per model the faster of our two that shipped (int8 may be refused where only mixed keeps the target).
        ours = [max((r["variants"][v]["speedup"] for v in VARIANTS[3:] if v in r["variants"]), default=None) for r in chosen]
        if chosen and all(ours):
            results["geomean"][kind]["flexdsa (faster of int8, mixed)"] = math.exp(statistics.mean(map(math.log, ours)))
    out.write_text(json.dumps(results, indent=1, default=str))
    print(f"\nCPU flags: {', '.join(results['cpu']['flags'])}; {results['cpu']['why']}")
    print(_table(results))
    return results


def _main_trained(args) -> dict:
    from bench.trained import FIXTURES
    from flexdsa_core.precision import cpu_int8_features

    out = RESULTS_DIR / "precision_trained.json"
    if args.show:
        results = json.loads(out.read_text())
    else:
        results = {"cpu": cpu_int8_features(), "rounds": args.rounds, "models": {}}
        print(f"CPU vector flags: {', '.join(results['cpu']['flags'])}; int8 dot product: "
              f"{', '.join(results['cpu']['int8_dot_product']) or 'none'} ({results['cpu']['why']})", flush=True)  # fmt: skip
        for name in [m.strip() for m in (args.trained or ",".join(FIXTURES)).split(",") if m.strip()]:
            results["models"][name] = bench_trained(name, args.rounds, args.warmup)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(results, indent=1, default=str))
    print(f"\nCPU: {', '.join(results['cpu']['int8_dot_product']) or 'no int8 dot product'}; {results['rounds']} "
          "interleaved rounds, 1 thread; speed-up = median over rounds of original / variant")  # fmt: skip
    print(_trained_table(results))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
