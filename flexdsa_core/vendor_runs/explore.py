"""Exploration scored by the vendor's own compiler, with the vendor alone beside every bucket.

Where the target's toolchain is ready and its adapter reads a cost from a compile (``vendor_cost``:
rknn-toolkit2's per-layer cycle table), per shape bucket:

1. **The vendor alone**: the *original* model compiled by the vendor tool at the bucket's shapes and the same
   precision, the build a user gets without us, scored by the vendor's own figure.
2. **Candidates**: our bundle model as the pipeline made it, and for each form the adapter names
   (``vendor_forms``, ``targets/forms``) each variant applied at every site it matches. All are compiled in
   one toolchain run, estimate only (no simulator); each result is a kernel-cache entry keyed by the
   candidate's bytes, options, shapes and the toolchain's versions, so a candidate met again costs nothing.
3. **Per site**, the variant whose layers the vendor scores cheapest (its per-layer figures read back per ONNX
   node) is kept; the choices are composed into one model, compiled to confirm, and the cheapest whole
   candidate wins (ties go to the plainer form).
4. **Never worse than the vendor alone**: a candidate the vendor cannot build, or scores above the original
   in cycles or CPU-fallback nodes, is not shipped. When nothing of ours is at least as good, the bucket
   ships the original model, the vendor alone's build, and the report says why.

5. **Precision** (int8/mixed with samples, ``_precisions``): each precision the vendor makes, on the chosen form,
   calibrated on the calibration samples and judged in its simulator on held-out ones, beside the vendor
   alone's own int8 and its per-layer analysis. Where the adapter names exact rewrites (``vendor_exact_forms``:
   ``forms.ExactForm``, e.g. a bounded attention-mask constant, outlier channels on a path of their own), they
   are applied with figures measured on the calibration samples, kept only where the outputs stay within the
   fp32 tolerances of the original's, compiled int8 with the vendor's per-layer analysis, then with the float16
   hybrids the adapter picks from that analysis (``vendor_sensitivity_hybrids``). The search judges each
   candidate on a few held-out samples; the cheapest accurate one is judged again on more of them, the ones the
   final build is judged on (``_confirm``: the next cheapest where it misses), and ships; an exact-rewritten model
   that wins replaces the bucket's model.

The optimizer validates changed models against the original again, and the toolchain's final compile
(``toolchain_run``) runs the winner in the vendor's simulator.

Over 500 lines because the steps above, the precision candidates the vendor compiles and the traffic figures
all read and fill one ``Exploration`` per job, and the report's ``vendor`` section is made from it.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import onnx_ir as ir

from flexdsa_core.cache import kernel_key
from flexdsa_core.targets.accelerator import AcceleratorAdapter
from flexdsa_core.targets.base import BucketModel
from flexdsa_core.targets.forms import VendorForm, discover_forms
from flexdsa_core.targets.spec import TargetSpec
from flexdsa_core.targets.vendor_cost import VendorCost, ratio
from flexdsa_core.toolchains import ToolchainError, get_toolchain
from flexdsa_core.vendor_runs.toolchain_run import bucket_dims, file_safe, write_samples
from flexdsa_core.version import __version__

PLAIN = "ours"  # our bundle model as the pipeline made it
ALONE = "vendor alone"  # the original model, compiled by the vendor tool alone
COMPOSED = "ours + per-site forms"


@dataclass
class Candidate:
    """One model the vendor compiles: ``forms`` maps form name -> {site: variant} applied to our model."""

    bucket: str
    name: str
    model: ir.Model | None  # None: the original model (``source``)
    forms: dict[str, dict[str, str]] = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    cost: VendorCost | None = None
    error: str | None = None
    cached: bool = False
    precision: str = "float16"  # what the vendor compiles the candidate to
    accuracy: dict | None = None  # its simulator's outputs on the held-out samples, scored (precision only)
    layer_accuracy: list[dict] | None = None  # the vendor's per-layer analysis of its simulator (where asked)
    confirmation: dict | None = None  # its accuracy on more held-out samples, about to ship (``_confirm``)

    @property
    def label(self) -> str:
        return f"{self.bucket}/{self.name}"

    def record(self) -> dict:
        return {
            "candidate": self.name,
            "forms": self.forms,
            "options": self.options,
            "precision": self.precision,
            "vendor": self.cost.as_dict() if self.cost else None,
            "accuracy": self.accuracy,
            **({"layer_accuracy": self.layer_accuracy} if self.layer_accuracy else {}),
            **({"confirmation": self.confirmation} if self.confirmation is not None else {}),
            "error": self.error,
            "from_kernel_cache": self.cached,
        }


@dataclass
class Exploration:
    """What exploration chose: the buckets to ship (models possibly rewritten, or the original), which of
    them changed (to validate again), ``report["vendor"]`` and per bucket the candidates for fusion_plan.json."""

    buckets: list[BucketModel]
    changed: set[str]
    original: set[str]  # buckets that ship the original model (nothing of ours was at least as good)
    report: dict
    plans: dict[str, dict]
    original_file: Path | None = None  # the original model as the vendor compiled it alone
    # Bucket -> the driver options of the precision exploration chose (int8/mixed with samples), for the final build.
    bucket_options: dict[str, dict] = field(default_factory=dict)
    # Bucket -> the held-out samples its pick was confirmed on: the final build is judged on as many.
    judged_samples: dict[str, int] = field(default_factory=dict)


class VendorCompiler:
    """Compiles candidates with one toolchain, many per run, each result kept in the kernel cache."""

    def __init__(self, target: TargetSpec, adapter, root: Path, workdir: Path | None, cache=None,
                 precision: dict | None = None) -> None:  # fmt: skip
        self.target, self.adapter, self.root, self.cache = target, adapter, root, cache
        # What every estimate-only build is asked for (rknn: float16; QNN: the job's own format).
        self.base_options = adapter.vendor_estimate_options(target, {"precision": precision or {}})
        self.toolchain = get_toolchain(target.toolchain)
        self.versions = self.toolchain.status(root).versions
        self.folder = Path(tempfile.mkdtemp(prefix="vendor-explore-", dir=workdir))
        self.compiles = 0

    @property
    def tool(self) -> str:
        """The vendor package and its version ("rknn-toolkit2 2.5.0"), as every figure is labelled."""
        package = self.adapter.vendor_package or next(iter(self.versions), None)
        version = self.versions.get(package) if package else None
        return f"{package} {version}" if version else (package or self.toolchain.name)

    def estimate(self, candidates: list[Candidate], sources: dict[str, Path], shapes: dict[str, dict],
                 feeds: dict[str, dict] | None = None) -> None:  # fmt: skip
        """Fill ``cost``/``error`` of each candidate: from the cache, else one toolchain run for the rest.
        ``sources``: bucket -> the original model's file; ``shapes``: bucket -> input name -> static shape;
        ``feeds``: bucket -> one input sample, for a vendor that compiles only what it runs (QNN)."""
        pending, keys = [], {}
        for index, candidate in enumerate(candidates):
            path = sources[candidate.bucket] if candidate.model is None else self._write(candidate, index)
            key = self._key(path, candidate.options, shapes[candidate.bucket])
            raw = self.cache.get(key) if self.cache is not None else None
            if raw is not None:
                self._read(candidate, json.loads(raw))
                candidate.cached = True
                continue
            keys[candidate.label] = key
            pending.append((candidate, path))
        if not pending:
            return
        request = {
            "action": "compile",
            "continue_on_error": True,
            "target": self.target.model_dump(mode="json"),
            "out_dir": str(self.folder / "out"),
            "buckets": [
                {"name": f"c{index}", "onnx": str(path), "input_shapes": shapes[candidate.bucket],
                 "inputs": (feeds or {}).get(candidate.bucket) or {},
                 "options": {"simulate": False, "export": False, **candidate.options}}
                for index, (candidate, path) in enumerate(pending)
            ],  # fmt: skip
            "options": self.base_options,
        }
        self.compiles += len(pending)
        try:
            result = self.toolchain.run(self.root, request, workdir=self.folder)
        except ToolchainError as err:
            for candidate, _ in pending:
                candidate.error = err.message
            return
        entries = {entry.get("name"): entry for entry in result.get("buckets", [])}
        for index, (candidate, _) in enumerate(pending):
            entry = entries.get(f"c{index}") or {"error": "the toolchain returned no result for it"}
            kept = {"error": _first_line(entry.get("error")), "layers": entry.get("layers") or [],
                    "placement": entry.get("placement") or {}}  # fmt: skip
            self._read(candidate, kept)
            if self.cache is not None and kept["error"] is None:  # a refusal is retried next time, not kept
                self.cache.put(keys[candidate.label], json.dumps(kept).encode())

    def simulate(self, candidates: list[Candidate], sources: dict[str, Path], shapes: dict[str, dict],
                 datasets: dict[str, list[dict]], judged: dict[str, list[dict]], references: dict[str, list[dict]],
                 accuracy) -> None:  # fmt: skip
        """Compile each (precision) candidate calibrated on its bucket's ``datasets`` and run it in the vendor's
        simulator on the ``judged`` samples; ``accuracy`` scores the outputs against the original's
        (``references``). Never cached: an accuracy verdict rests on this run's outputs."""
        from flexdsa_core.accuracy import score

        entries = []
        for index, candidate in enumerate(candidates):
            path = sources[candidate.bucket] if candidate.model is None else self._write(candidate, index)
            name = f"p{index}"
            options = {"export": False, **candidate.options}
            if "custom_hybrid" in options:  # keyed by bucket in the adapter's options, by entry in the driver's
                options["custom_hybrid"] = {name: (options["custom_hybrid"] or {}).get(candidate.bucket) or []}
            entries.append({
                "name": name, "onnx": str(path), "input_shapes": shapes[candidate.bucket], "options": options,
                "dataset": write_samples(self.folder, f"{candidate.bucket}.dataset", datasets[candidate.bucket]),
                "samples": write_samples(self.folder, f"{candidate.bucket}.judged", judged[candidate.bucket]),
                "inputs": write_samples(self.folder, f"{candidate.bucket}.first", judged[candidate.bucket][:1])[0],
            })  # fmt: skip
        request = {
            "action": "compile", "continue_on_error": True, "target": self.target.model_dump(mode="json"),
            "out_dir": str(self.folder / "out-precision"), "buckets": entries,
            "options": self.adapter.toolchain_options(self.target, {}),
        }  # fmt: skip
        self.compiles += len(entries)
        try:
            result = self.toolchain.run(self.root, request, workdir=self.folder)
        except ToolchainError as err:
            for candidate in candidates:
                candidate.error = err.message
            return
        found = {entry.get("name"): entry for entry in result.get("buckets", [])}
        for index, candidate in enumerate(candidates):
            entry = found.get(f"p{index}") or {"error": "the toolchain returned no result for it"}
            self._read(candidate, {"error": _first_line(entry.get("error")), "layers": entry.get("layers") or []})
            if candidate.error is None:
                candidate.accuracy = _scored(references[candidate.bucket], entry.get("sample_outputs") or [], accuracy, score)
                candidate.layer_accuracy = entry.get("layer_accuracy")

    def _read(self, candidate: Candidate, kept: dict) -> None:
        candidate.error = kept.get("error")
        if candidate.error is None:
            candidate.cost = self.adapter.vendor_cost(
                {"layers": kept.get("layers"), "placement": kept.get("placement")}, self.versions
            )
            if candidate.cost is None:
                candidate.error = "the vendor reported no cost for it"

    def _write(self, candidate: Candidate, index: int) -> Path:
        path = self.folder / f"candidate-{index}.onnx"
        ir.save(candidate.model, path)
        return path

    def _key(self, path: Path, options: dict, shapes: dict) -> str:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        canonical = {
            "vendor_compile": digest.hexdigest(),
            "options": {**self.base_options, **options},
            "shapes": shapes,
            "toolchain": {"name": self.toolchain.name, "versions": self.versions},
        }
        return kernel_key(canonical, self.target, __version__)


def explore(
    target: TargetSpec,
    adapter,
    buckets: list[BucketModel],
    original_source: bytes | Path,
    *,
    root: Path | None,
    workdir: Path | None,
    cache=None,
    progress: Callable[[float, str], None] | None = None,
    precision: dict | None = None,
    calibration: dict[str, list[dict]] | None = None,
    held_out: dict[str, list[dict]] | None = None,
    accuracy=None,
    traffic: dict | None = None,
) -> Exploration | None:
    """Exploration for every bucket (module docstring); None where the vendor gives no figure to score by
    (no toolchain for the target, not ready, or an adapter without ``vendor_cost``). With ``precision``
    int8/mixed and ``calibration`` samples, the vendor's precisions (``adapter.vendor_precisions``) are tried on
    the chosen form too, each judged in its simulator on ``held_out`` samples (``_precisions``)."""
    if not _scored_by_the_vendor(target, adapter, root):
        return None
    compiler = VendorCompiler(target, adapter, root, workdir, cache, precision)
    say = progress or (lambda fraction, message: None)
    shapes = {b.name: _static_inputs(b.model) for b in buckets}
    original_file = _original_file(original_source, compiler.folder)
    sources = _vendor_alone_sources(adapter, buckets, original_file, shapes, compiler.folder)
    feeds = {b.name: _feeds(b, compiler.folder) for b in buckets} if adapter.vendor_needs_inputs else None
    # Forms are decided by the vendor's cycles; a vendor that reports placement only cannot judge them.
    forms = [discover_forms()[n] for n in adapter.vendor_forms if n in discover_forms()]

    # The vendor alone, our model, and each form variant at every site it matches: one toolchain run.
    first, sites = _first_candidates(adapter, buckets, forms)
    say(0.1, f"compiling {len(first)} candidate(s) with {compiler.tool} (estimate only)")
    compiler.estimate(first, sources, shapes, feeds)
    # Per site, the cheapest variant by the vendor's per-layer figures; composed and confirmed.
    second = _composed_candidates(buckets, first, sites, forms)
    if second:
        say(0.5, f"confirming {len(second)} composed candidate(s) with {compiler.tool}")
        compiler.estimate(second, sources, shapes, feeds)
    candidates = first + second

    exploration = _choose(buckets, candidates, sites, sources, compiler.tool)
    exploration.original_file = original_file
    # A bucket that ships the original is built as the vendor alone built it (QNN: qnn_preprocess_model first).
    exploration.bucket_options = {name: dict(adapter.vendor_alone_options) for name in exploration.original
                                  if adapter.vendor_alone_options}  # fmt: skip
    if (precision or {}).get("requested") in ("int8", "mixed") and calibration:
        say(0.7, f"quantising candidates with {compiler.tool} and judging them in its simulator")
        explored = _precisions(
            compiler, exploration.buckets, exploration.original, sources, shapes, exploration.report,
            exploration.plans, precision, calibration, held_out or {}, accuracy, original_source,
        )  # fmt: skip
        _ship_precisions(exploration, explored)
        exploration.judged_samples = {name: row["judged_samples"] for name, row in exploration.report.items()
                                      if row.get("judged_samples")}  # fmt: skip
    summary_traffic = None
    if traffic and traffic.get("observed"):
        say(0.9, f"compiling the original at the largest observed shape with {compiler.tool}")
        summary_traffic = _traffic(compiler, traffic, original_file, buckets)
    exploration.report = {
        "tool": compiler.tool,
        "traffic": summary_traffic,
        "compiles": compiler.compiles,
        "cache_hits": sum(1 for c in candidates if c.cached),
        "buckets": exploration.report,
    }
    return exploration


def _scored_by_the_vendor(target: TargetSpec, adapter, root: Path | None) -> bool:
    """The target's toolchain is installed here and its adapter reads a cost from a compile (``vendor_cost``)."""
    if not target.toolchain or root is None or type(adapter).vendor_cost is AcceleratorAdapter.vendor_cost:
        return False
    return get_toolchain(target.toolchain).status(root).ready


def _vendor_alone_sources(adapter, buckets: list[BucketModel], original_file: Path, shapes: dict[str, dict],
                          folder: Path) -> dict[str, Path]:  # fmt: skip
    """Bucket -> the original model as the vendor alone gets it, the way a user would hand it over: rknn takes
    the shapes beside the file; a vendor that compiles what it runs (QNN) gets it with its input dims fixed to
    the bucket's, nothing else."""
    if not adapter.vendor_needs_inputs:
        return {b.name: original_file for b in buckets}
    return {b.name: _fixed_inputs(original_file, shapes[b.name], folder, b.name) for b in buckets}


def _first_candidates(adapter, buckets: list[BucketModel], forms: list[VendorForm],
                      ) -> tuple[list[Candidate], dict[str, dict[str, dict[str, list[str]]]]]:  # fmt: skip
    """Per bucket the vendor alone, our model, and each form's variant at every site of the form where it applies;
    and per bucket, form -> site -> the variants found there."""
    first: list[Candidate] = []
    sites: dict[str, dict[str, dict[str, list[str]]]] = {}
    for bucket in buckets:
        first += [
            Candidate(bucket.name, ALONE, None, options=dict(adapter.vendor_alone_options)),
            Candidate(bucket.name, PLAIN, bucket.model),
        ]
        sites[bucket.name] = {form.name: form.sites(bucket.model) for form in forms}
        for form in forms:
            for variant in form.variants:
                choices = {s: variant for s, found in sites[bucket.name][form.name].items() if variant in found}
                if choices:
                    first.append(_with_forms(bucket, {form.name: choices}, forms, f"{form.name}:{variant}"))
    return first, sites


def _composed_candidates(buckets: list[BucketModel], first: list[Candidate], sites: dict,
                         forms: list[VendorForm]) -> list[Candidate]:  # fmt: skip
    """Per bucket, the cheapest variant at each site composed into one candidate, unless one compiled already
    has exactly those forms."""
    second: list[Candidate] = []
    for bucket in buckets:
        mine = [c for c in first if c.bucket == bucket.name]
        composed = _compose(bucket, mine, sites[bucket.name], forms)
        if composed is not None and not any(c.forms == composed.forms for c in mine):
            second.append(composed)
    return second


def _choose(buckets: list[BucketModel], candidates: list[Candidate], sites: dict, sources: dict[str, Path],
            tool: str) -> Exploration:  # fmt: skip
    """Per bucket the candidate to ship (``_decide``): ours as the pipeline made it, a form of ours, or the
    original; ``report`` holds each bucket's decision, ``plans`` its candidates for fusion_plan.json."""
    chosen, changed, original, report, plans = [], set(), set(), {}, {}
    for bucket in buckets:
        mine = [c for c in candidates if c.bucket == bucket.name]
        alone = next(c for c in mine if c.name == ALONE)
        best, reason = _decide(mine, alone)
        if best is None or best.name == PLAIN:
            chosen.append(bucket)
        elif best.name == ALONE:
            chosen.append(replace(bucket, model=_original_model(sources[bucket.name]), portable=None))
            original.add(bucket.name)
        else:
            chosen.append(replace(bucket, model=best.model, portable=None))
            changed.add(bucket.name)
        report[bucket.name] = {
            "vendor_alone": alone.cost.as_dict() if alone.cost else {"error": alone.error},
            "explored": best.cost.as_dict() if best is not None and best.cost else None,
            "explored_ratio": ratio(best.cost if best else None, alone.cost),
            "candidate": best.name if best is not None else None,
            "forms": best.forms if best is not None else {},
            "decision": reason,
        }
        plans[bucket.name] = {
            "scored_by": alone.cost.source if alone.cost else tool,
            "candidates": [c.record() for c in mine],
            "sites": {name: found for name, found in sites[bucket.name].items() if found},
            "chosen": best.name if best is not None else None,
            "decision": reason,
        }
    return Exploration(chosen, changed, original, report, plans)


def _ship_precisions(exploration: Exploration, explored: dict[str, tuple[dict, ir.Model | None]]) -> None:
    """Each bucket's chosen precision joins its build options; where exact rewrites made its int8 accurate, that
    model ships instead (validated again)."""
    options_of = exploration.bucket_options
    for name, (options, model) in explored.items():
        options_of[name] = {**options_of.get(name, {}), **options}
        if model is not None:
            exploration.buckets = [
                replace(b, model=model, portable=None) if b.name == name else b for b in exploration.buckets
            ]
            exploration.changed.add(name)
            exploration.original.discard(name)
            options_of[name] = dict(options)


# Samples a simulator runs per candidate to judge its accuracy in the search (they are slow).
JUDGED_SAMPLES = 8
# Held-out samples the search's pick is confirmed on, and the final build judged on (``_confirm``).
CONFIRMED_SAMPLES = 32
# Candidates confirmed per bucket, cheapest first, before float16 (or the request's format) is settled for.
CONFIRMATIONS = 3


def _confirm(compiler, ranked: dict[str, list[Candidate]], sources, shapes, datasets, held_out, judged,
             original_source, accuracy, alongside: dict[str, Candidate] | None = None,
             ) -> dict[str, tuple[Candidate | None, list[Candidate]]]:  # fmt: skip
    """Per bucket, the cheapest candidate accurate on the search's ``JUDGED_SAMPLES`` that stays accurate on up to
    ``CONFIRMED_SAMPLES`` held-out samples (the final build is judged on the same ones, the search's among them):
    the search compares many candidates on a few samples and keeps the cheapest that passes, so its pick is the
    one most likely to pass by luck; the claim that ships rests on more. Tried cheapest first, at most
    ``CONFIRMATIONS`` per bucket, the buckets of one round in one toolchain run. Where no more samples were held
    out than the search judged, its pick stands unconfirmed. ``alongside``: per bucket one more candidate judged
    on the same samples in the first run (the vendor alone's int8 where accurate on the search's samples: the
    ratio is to its best accurate build, judged by the same evidence as ours). Returns bucket -> (the pick or
    None, the ones that missed)."""
    from flexdsa_core.ort_runs import run

    wide = {name: (held_out.get(name) or [])[:CONFIRMED_SAMPLES] for name in {*ranked, *(alongside or {})}}
    found = {name: (None, []) for name in ranked}
    pending = {}
    for name, ours in ranked.items():
        if ours and len(wide[name]) <= len(judged[name]):
            found[name] = (ours[0], [])
        elif ours:
            pending[name] = list(ours[:CONFIRMATIONS])
    extra = [(name, c) for name, c in (alongside or {}).items() if len(wide[name]) > len(judged[name])]
    references = {name: [run(original_source, s) for s in wide[name]] for name in {*pending, *dict(extra)}}
    while pending or extra:
        trial = {name: queue.pop(0) for name, queue in pending.items()}
        batch = [*trial.items(), *extra]
        extra = []  # judged once, in the first run
        copies = [replace(c, options={**c.options, "accuracy_analysis": False}, accuracy=None,
                          layer_accuracy=None) for _, c in batch]  # fmt: skip
        compiler.simulate(copies, sources, shapes, datasets, wide, references, accuracy)
        for (_, candidate), copy in zip(batch, copies, strict=True):
            candidate.confirmation = copy.accuracy or {"ok": False, "detail": copy.error or "not simulated"}
        for name, candidate in trial.items():
            if candidate.confirmation.get("ok"):
                found[name] = (candidate, found[name][1])
                pending.pop(name)
            else:
                found[name][1].append(candidate)
                if not pending[name]:
                    pending.pop(name)
    return found


def _shortfall(accuracy: dict | None) -> str:
    """A failed accuracy figure in a few words: its worst output's cosine and the sample count."""
    accuracy = accuracy or {}
    if accuracy.get("detail"):
        return accuracy["detail"]
    cosines = [o["cosine"] for o in (accuracy.get("outputs") or {}).values() if o.get("cosine") is not None]
    worst = f"cosine {min(cosines):.4f}" if cosines else "below the target"
    return f"{worst} on {accuracy.get('samples', '?')} samples"


def _precisions(compiler, buckets, original, sources, shapes, report, plans, precision, calibration, held_out,
                accuracy, original_source) -> dict[str, tuple[dict, ir.Model | None]]:  # fmt: skip
    """Per bucket, each precision the vendor makes (``adapter.vendor_precisions``: its int8, its own other
    calibration, hybrids keeping our float layers in float16, float16 itself under ``mixed``) compiled on the
    chosen form, calibrated on the calibration samples and judged in the vendor's simulator on the held-out
    ones; beside them the vendor alone's int8 of the original on the same samples. Then the exact rewrites
    (``_exact``), judged the same way. The cheapest candidate that meets the accuracy target ships (float16's
    own figure where ``mixed`` allows it; at equal cost the more accurate); none does: the request's own format
    ships and the accuracy verdict after the final build decides (fail, or fp32). Returns per bucket the driver
    options of the choice and, where an exact rewrite won, the rewritten model that ships."""
    from flexdsa_core.ort_runs import run

    adapter = compiler.adapter
    variants = adapter.vendor_precisions(compiler.target, {"precision": precision})
    if not variants:
        return {}
    plain_int8 = next(iter(variants.values()))
    alone_options = {**plain_int8, "custom_hybrid": {}, **adapter.vendor_alone_options}
    candidates, datasets, judged, references, models = [], {}, {}, {}, {}
    for bucket in buckets:
        samples = calibration.get(bucket.name)
        if not samples:
            continue
        datasets[bucket.name] = samples
        judged[bucket.name] = (held_out.get(bucket.name) or samples)[:JUDGED_SAMPLES]
        references[bucket.name] = [run(original_source, s) for s in judged[bucket.name]]
        models[bucket.name] = _original_model(sources[bucket.name]) if bucket.name in original else bucket.model
        model = None if bucket.name in original else bucket.model
        forms = report[bucket.name]["forms"]
        for name, options in variants.items():
            if options.get("dtype") == "float16":
                continue  # scored already: the chosen form's own figure
            candidates.append(Candidate(bucket.name, name, model, forms=forms, options=options, precision=name))
        # The vendor alone's int8, with the vendor's own per-layer analysis: where its quantiser loses accuracy.
        candidates.append(Candidate(bucket.name, f"{ALONE}: {next(iter(variants))}", None,
                                    options={**alone_options, "accuracy_analysis": True}, precision=next(iter(variants))))  # fmt: skip
    if not candidates:
        return {}
    compiler.simulate(candidates, sources, shapes, datasets, judged, references, accuracy)
    exact = _exact(compiler, models, report, datasets, judged, references, sources, shapes, accuracy,
                   original_source, plain_int8)  # fmt: skip
    candidates += [c for found in exact.values() for c in found["candidates"]]
    has_float16 = any(o.get("dtype") == "float16" for o in variants.values())
    per_bucket, ranked = {}, {}  # bucket -> (its candidates, the vendor alone's int8, float16's cycles or None)
    for bucket in buckets:
        mine = [c for c in candidates if c.bucket == bucket.name]
        if not mine:
            continue
        alone = next(c for c in mine if c.name.startswith(ALONE))
        explored = report[bucket.name]["explored"]
        floor = explored["cycles"] if explored and has_float16 else None
        per_bucket[bucket.name] = (mine, alone, floor)
        ours = [c for c in mine if c is not alone and c.cost is not None and (c.accuracy or {}).get("ok")]
        if alone.cost is not None:  # never more CPU-fallback layers than the vendor alone's own int8 build
            ours = [c for c in ours if c.cost.cpu_nodes <= alone.cost.cpu_nodes]
        ranked[bucket.name] = sorted((c for c in ours if floor is None or c.cost.cycles < floor),
                                     key=lambda c: (c.cost.cycles, (c.accuracy or {}).get("loss", 1.0)))  # fmt: skip
    alone_accurate = {name: alone for name, (_, alone, _) in per_bucket.items() if (alone.accuracy or {}).get("ok")}
    confirmed = _confirm(compiler, ranked, sources, shapes, datasets, held_out, judged, original_source, accuracy,
                         alongside=alone_accurate)  # fmt: skip
    chosen: dict[str, tuple[dict, ir.Model | None]] = {}
    for name, (mine, alone, floor) in per_bucket.items():
        row = report[name]
        best, missed = confirmed[name]
        if best is not None:
            rewritten = best.model if best.name.startswith(EXACT) else None
            chosen[name] = (best.options, rewritten)
            row["precision"] = best.name
            row["explored"] = best.cost.as_dict()
            if rewritten is not None:
                row["forms"] = {**best.forms}
            decision = f"{best.name}: {best.cost.cycles:.0f} cycles, accurate on {len(judged[name])} held-out samples"
            if best.confirmation is not None:
                decision += f" and confirmed on {best.confirmation['samples']}"
                row["judged_samples"] = best.confirmation["samples"]  # the final build is judged on the same
        elif floor is not None:
            fp16 = next(n for n, o in variants.items() if o.get("dtype") == "float16")
            chosen[name] = (variants[fp16], None)
            row["precision"] = fp16
            decision = "float16: no quantised candidate met the accuracy target more cheaply"
        else:
            row["precision"] = None
            decision = "no quantised candidate met the accuracy target in the simulator: the request's own format is built and judged"
        row["vendor_alone_int8"] = {
            **(alone.cost.as_dict() if alone.cost else {"error": alone.error}),
            "precision": alone.precision, "accuracy": alone.accuracy,
            **({"confirmation": alone.confirmation} if alone.confirmation is not None else {}),
        }  # fmt: skip
        if name in exact:
            row["exact_rewrites"] = {key: value for key, value in exact[name].items() if key != "candidates"}
            row["exact_rewrites"]["layer_accuracy_vendor_alone"] = _worst_layers(alone.layer_accuracy)
        row["explored_ratio"] = ratio(
            _cost_of(row["explored"]), _cheapest_accurate_alone(row)
        )
        if missed:
            decision += "; accurate on the search's samples but not confirmed on more: " + "; ".join(
                f"{c.name} ({_shortfall(c.confirmation)})" for c in missed)  # fmt: skip
        row["decision"] += f"; precision: {decision}"
        plans[name]["candidates"] += [c.record() for c in mine]
        plans[name]["precision"] = row["precision"]
    return chosen


# Candidates with the exact rewrites are named from here (``_exact``); one of them shipping changes the model.
EXACT = "w8a8 + exact rewrites"
# Calibration samples the exact rewrites are checked against the original on (with the held-out judged ones).
EXACTNESS_SAMPLES = 24
# Layers listed per analysis in the report (the worst by single-layer cosine); fusion_plan.json has them all.
WORST_LAYERS = 12


def _exact(compiler, models, report, datasets, judged, references, sources, shapes, accuracy, original_source,
           int8: dict) -> dict[str, dict]:  # fmt: skip
    """The adapter's exact rewrites (``vendor_exact_forms``: ``forms.ExactForm``) applied to each bucket's
    chosen model with figures measured on its calibration samples, kept only where the rewritten model's
    outputs stay within the fp32 tolerances of the original's on the samples; compiled w8a8 with the forms'
    float16 paths and the vendor's per-layer analysis (round 1), then with the float16 hybrids the adapter
    chooses from that analysis (``vendor_sensitivity_hybrids``: round 2), all judged in the simulator on the
    held-out samples like every precision candidate."""
    names = getattr(compiler.adapter, "vendor_exact_forms", ())
    forms = [discover_forms()[n] for n in names if n in discover_forms()]
    if not forms:
        return {}
    found, first = {}, []
    for name, model in models.items():
        rewritten = model.clone()
        applied = {form.name: form.apply(rewritten, datasets[name]) for form in forms}
        taken = {form: result for form, result in applied.items() if result.sites}
        section = {
            "forms": {form: {"sites": result.sites, "measured": result.measured,
                             "float16_nodes": len(result.float16)} for form, result in applied.items()},  # fmt: skip
            "candidates": [],
        }
        found[name] = section
        if not taken:
            section["detail"] = "no exact rewrite applies to this model"
            continue
        checked = datasets[name][:EXACTNESS_SAMPLES] + judged[name]
        problem = _exactness(original_source, rewritten, checked)
        section["validation"] = problem or (
            f"the rewritten model's outputs are within the fp32 tolerances of the original's on {len(checked)} "
            "samples (ONNX Runtime)"
        )
        if problem:
            continue
        float16 = [node for result in taken.values() for node in result.float16]
        options = {**int8, "hybrid_layers": {"nodes": float16}, "accuracy_analysis": True}
        forms_taken = {**report[name]["forms"], **{f: dict(r.sites) for f, r in taken.items()}}
        candidate = Candidate(name, EXACT, rewritten, forms=forms_taken, options=options, precision=EXACT)
        section["candidates"].append(candidate)
        section["float16"] = float16
        first.append(candidate)
    if not first:
        return found
    compiler.simulate(first, sources, shapes, datasets, judged, references, accuracy)
    second = []
    for candidate in first:
        section = found[candidate.bucket]
        section["layer_accuracy"] = _worst_layers(candidate.layer_accuracy)
        hybrids = compiler.adapter.vendor_sensitivity_hybrids(
            candidate.options, candidate.layer_accuracy or [], section["float16"]
        )
        for label, options in hybrids.items():
            second.append(Candidate(candidate.bucket, f"{EXACT} + {label}", candidate.model, forms=candidate.forms,
                                    options=options, precision=f"{EXACT} + {label}"))  # fmt: skip
    if second:
        compiler.simulate(second, sources, shapes, datasets, judged, references, accuracy)
    for candidate in second:
        found[candidate.bucket]["candidates"].append(candidate)
    return found


def _exactness(original_source, rewritten: ir.Model, samples: list[dict]) -> str | None:
    """None when ``rewritten`` gives the original's outputs within the fp32 validation tolerances on every
    sample (ONNX Runtime); else what differs."""
    import numpy as np

    from flexdsa_core.ort_runs import DEFAULT_TOLERANCES, run, session

    before, after = session(original_source), session(ir.to_proto(rewritten).SerializeToString())
    for index, sample in enumerate(samples):
        want, got = run(before, sample), run(after, sample)
        for name, value in want.items():
            other = got.get(name)
            if other is None or other.shape != value.shape:
                return f"output {name!r} is missing or reshaped on sample {index}"
            if not np.issubdtype(value.dtype, np.floating):
                if not np.array_equal(value, other):
                    return f"output {name!r} differs on sample {index}"
                continue
            atol, rtol = DEFAULT_TOLERANCES.get(str(value.dtype), (1e-4, 1e-3))
            excess = np.abs(other.astype(np.float64) - value) - (atol + rtol * np.abs(value.astype(np.float64)))
            if float(excess.max(initial=-1.0)) > 0:
                return (f"output {name!r} differs beyond the fp32 tolerances on sample {index} (max abs "
                        f"{float(np.abs(other - value).max()):.3g}): not exact, not offered")  # fmt: skip
    return None


def _worst_layers(rows: list[dict] | None) -> dict | None:
    """The vendor's per-layer analysis for the report: the layers it scores worst alone (single-layer cosine)."""
    if not rows:
        return None
    scored = [r for r in rows if r.get("cosine_single") is not None]
    worst = sorted(scored, key=lambda r: r["cosine_single"])[:WORST_LAYERS]
    return {
        "layers": len(rows),
        "worst_single": [{k: r.get(k) for k in ("layer", "op", "cosine", "cosine_single", "onnx_nodes")} for r in worst],
        "final_cosine": rows[-1].get("cosine"),
        "measured_on": "the first held-out sample, in the vendor's simulator against its float run",
    }


def _cost_of(figure: dict | None) -> VendorCost | None:
    if not figure or figure.get("cycles") is None:
        return None
    return VendorCost(figure["cycles"], figure.get("cpu_nodes", 0), figure.get("transitions", 0), figure.get("source", ""))


def _cheapest_accurate_alone(row: dict) -> VendorCost | None:
    """The vendor alone's best build that keeps the accuracy target: the cheaper of its float16 and its own
    int8 where that int8 is accurate on the held-out samples (on the wider ones where it was confirmed, as ours)."""
    options = [_cost_of(row["vendor_alone"])]
    int8 = row.get("vendor_alone_int8") or {}
    if (int8.get("confirmation") or int8.get("accuracy") or {}).get("ok"):
        options.append(_cost_of(int8))
    options = [o for o in options if o is not None]
    return min(options, key=lambda c: c.cycles, default=None)


def _with_forms(bucket: BucketModel, choices: dict[str, dict[str, str]], forms: list[VendorForm], name: str):
    model = bucket.model.clone()
    by_name = {form.name: form for form in forms}
    for form_name, sites in choices.items():
        by_name[form_name].apply(model, sites)
    return Candidate(bucket.name, name, model, forms=choices)


def _compose(bucket, candidates: list[Candidate], sites: dict, forms: list[VendorForm]) -> Candidate | None:
    """Per site, the variant the vendor scored cheapest on that site's layers (our plain model's layers for
    the site when no variant beats them); None where no variant wins anywhere."""
    plain = next((c for c in candidates if c.name == PLAIN and c.cost is not None), None)
    if plain is None:
        return None
    choices: dict[str, dict[str, str]] = {}
    for form in forms:
        for site in sites.get(form.name, {}):
            best_variant, best_cycles = None, plain.cost.site_cycles(form.replaced(plain.model, site))
            for candidate in candidates:
                variant = candidate.forms.get(form.name, {}).get(site)
                if variant is None or candidate.cost is None:
                    continue
                cycles = candidate.cost.site_cycles(_site_nodes(candidate.model, site, form))
                if cycles < best_cycles:
                    best_variant, best_cycles = variant, cycles
            if best_variant is not None:
                choices.setdefault(form.name, {})[site] = best_variant
    # A variant that costs no more cycles yet leaves fewer layers on the CPU (the vendor's CPU layers carry no
    # cycles, so no site shows it) is taken wherever it matched.
    for candidate in candidates:
        if candidate.cost is None or candidate.cost.cycles is None or not candidate.forms:
            continue
        if candidate.cost.cycles <= plain.cost.cycles and candidate.cost.cpu_nodes < plain.cost.cpu_nodes:
            for form_name, sites_taken in candidate.forms.items():
                for site, variant in sites_taken.items():
                    choices.setdefault(form_name, {}).setdefault(site, variant)
    if not choices:
        return None
    return _with_forms(bucket, choices, forms, COMPOSED)


def _site_nodes(model: ir.Model | None, site: str, form: VendorForm) -> set[str]:
    names = {site}
    if model is not None:
        names.update(n.name for n in model.graph if n.name and n.name.startswith(site + form.site_suffix))
    return names


def _decide(candidates: list[Candidate], alone: Candidate) -> tuple[Candidate | None, str]:
    """The cheapest candidate of ours the vendor built, unless the vendor alone is better (in cycles or in
    CPU-fallback nodes): then the original. Ties go to the plainer form (fewer rewrites to trust)."""
    ours = [c for c in candidates if c is not alone and c.cost is not None]
    refused = [c for c in candidates if c is not alone and c.error]
    if ours and all(c.cost.cycles is None for c in ours):  # the vendor reports placement only (QNN)
        return _decide_by_placement(ours, alone)
    if not ours:
        if alone.cost is not None:
            why = "; ".join(f"{c.name}: {c.error}" for c in refused) or "no candidate of ours compiled"
            return alone, f"the vendor built none of our forms ({why}): the original model ships, as the vendor alone builds it"
        return None, "the vendor built neither the original nor any form of ours"
    best = min(ours, key=lambda c: (c.cost.cycles, c.cost.cpu_nodes, sum(len(s) for s in c.forms.values())))
    if alone.cost is None or alone.cost.cycles is None:
        return best, f"the vendor alone could not build the original ({alone.error}); ours builds"
    if best.cost.cycles > alone.cost.cycles or best.cost.cpu_nodes > alone.cost.cpu_nodes:
        return alone, (
            f"the vendor scores our best form ({best.name}: {best.cost.cycles:.0f} cycles, {best.cost.cpu_nodes} "
            f"CPU layer(s)) above the original alone ({alone.cost.cycles:.0f}, {alone.cost.cpu_nodes}): "
            "the original model ships"
        )
    share = best.cost.cycles / alone.cost.cycles if alone.cost.cycles else 1.0
    text = f"{best.name}: {best.cost.cycles:.0f} cycles, {share:.3f}x the vendor alone's {alone.cost.cycles:.0f}"
    if refused:
        text += "; the vendor refused " + "; ".join(f"{c.name} ({c.error})" for c in refused)
    return best, text


def _traffic(compiler: VendorCompiler, traffic: dict, original_file: Path, buckets: list[BucketModel]) -> dict:
    """The vendor alone compiled at the largest observed value of every dim (what a user without buckets would
    build to serve all of the traffic), for ``traffic_figures`` to hold the buckets' expected cost against."""
    observed = traffic["observed"]
    largest = {dim: max(entry["dims"][dim] for entry in observed) for dim in observed[0]["dims"]}
    shapes = _shapes_at(original_file, {**traffic.get("fixed", {}), **largest})
    name = "largest observed shape"
    candidate = Candidate(name, f"{ALONE} at the largest observed shape", None,
                          options=dict(compiler.adapter.vendor_alone_options))  # fmt: skip
    sources = {name: _fixed_inputs(original_file, shapes, compiler.folder, name)
               if compiler.adapter.vendor_needs_inputs else original_file}  # fmt: skip
    compiler.estimate([candidate], sources, {name: shapes})
    return {
        "largest_observed": largest,
        "input_shapes": shapes,
        "vendor_alone": candidate.cost.as_dict() if candidate.cost else {"error": candidate.error},
        "bucket_dims": traffic["bucket_dims"],
        "observed": observed,
    }


def traffic_figures(traffic: dict, per_bucket_cycles: dict[str, float | None]) -> dict:
    """Expected vendor cycles per request: each observed shape served by the smallest bucket that fits it
    (the manifest's policy), weighted by its count, against the vendor alone at the largest observed shape."""
    served, unserved = {}, 0
    total = sum(entry["count"] for entry in traffic["observed"])
    expected = 0.0
    for entry in traffic["observed"]:
        fitting = [
            name for name, dims in traffic["bucket_dims"].items()
            if all(dims.get(dim, value) >= value for dim, value in entry["dims"].items())
        ]  # fmt: skip
        fitting = [name for name in fitting if per_bucket_cycles.get(name) is not None]
        if not fitting:
            unserved += entry["count"]
            continue
        name = min(fitting, key=lambda n: per_bucket_cycles[n])
        served[name] = served.get(name, 0) + entry["count"]
        expected += entry["count"] * per_bucket_cycles[name]
    alone = traffic["vendor_alone"].get("cycles")
    per_request = expected / (total - unserved) if total > unserved else None
    return {
        "requests": total,
        "served_by_bucket": served,
        "unserved": unserved,
        "expected_cycles_per_request": per_request,
        "vendor_alone_at_largest": alone,
        "largest_observed": traffic["largest_observed"],
        "ratio": per_request / alone if per_request is not None and alone else None,
    }


def _shapes_at(path: Path, dims: dict[str, int]) -> dict[str, list[int]]:
    """The original's input shapes with its named dims set to ``dims`` (fixed dims as they are)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {init.name for init in graph.initializer}
    shapes = {}
    for value in graph.input:
        if value.name in initializers:
            continue
        shapes[value.name] = [
            d.dim_value if d.HasField("dim_value") else int(dims.get(d.dim_param, 1))
            for d in value.type.tensor_type.shape.dim
        ]
    return shapes


def _decide_by_placement(ours: list[Candidate], alone: Candidate) -> tuple[Candidate | None, str]:
    """Where the vendor gives no cost, only where it puts each node: ours unless it leaves more nodes on the CPU
    than the vendor alone does with the original."""
    best = min(ours, key=lambda c: (c.cost.cpu_nodes, sum(len(s) for s in c.forms.values())))
    if alone.cost is None:
        return best, f"the vendor alone could not build the original ({alone.error}); ours builds"
    if best.cost.cpu_nodes > alone.cost.cpu_nodes:
        return alone, (
            f"the vendor leaves {best.cost.cpu_nodes} node(s) of ours on the CPU and {alone.cost.cpu_nodes} of the "
            "original alone: the original model ships"
        )
    return best, (
        f"{best.name}: {best.cost.cpu_nodes} node(s) on the CPU of {best.cost.layers} placed (the vendor alone: "
        f"{alone.cost.cpu_nodes} of {alone.cost.layers}); the vendor reports no cost to compare beyond placement"
    )


def _feeds(bucket: BucketModel, folder: Path) -> dict[str, str]:
    """One seeded input sample at the bucket's shapes, saved as .npy: input name -> path."""
    import numpy as np

    from flexdsa_core.ort_runs import make_inputs, proto_without_weights

    written = {}
    for name, array in make_inputs(proto_without_weights(bucket.model), seed=0, dims=bucket_dims(bucket)).items():
        path = folder / f"{bucket.name}.feed.{file_safe(name)}.npy"
        np.save(path, array)
        written[name] = str(path)
    return written


def _static_inputs(model: ir.Model) -> dict[str, list[int]]:
    return {
        value.name: [int(d) for d in value.shape]
        for value in model.graph.inputs
        if value.const_value is None and value.shape is not None and value.shape.is_static()
    }


def _original_file(source: bytes | Path, folder: Path) -> Path:
    if isinstance(source, Path):
        # The vendor's compiler runs in a folder of its own: a path relative to ours would name nothing there
        # (`flexdsa optimize tests/models/m.onnx` lost the vendor-alone baseline to a FileNotFoundError).
        return source.resolve()
    path = folder / "original.onnx"
    if not path.exists():
        path.write_bytes(source)
    return path


def _fixed_inputs(path: Path, shapes: dict[str, list[int]], folder: Path, bucket: str) -> Path:
    """A copy of the original with its graph inputs' dims set to the bucket's (what ONNX Runtime's
    ``make_dynamic_shape_fixed`` does for a QNN user); its weights are left where they are."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    for value in proto.graph.input:
        if value.name not in shapes:
            continue
        for dim, size in zip(value.type.tensor_type.shape.dim, shapes[value.name], strict=False):
            dim.Clear()
            dim.dim_value = int(size)
    fixed = folder / f"{path.stem}.{file_safe(bucket)}.fixed.onnx"
    if any(init.HasField("data_location") and init.data_location == onnx.TensorProto.EXTERNAL
           for init in proto.graph.initializer):  # fmt: skip
        fixed = path.parent / fixed.name  # its external data sits beside the original (the scratch copy's folder)
    onnx.save(proto, str(fixed))
    return fixed


def _original_model(path: Path) -> ir.Model:
    return ir.load(path)


def _first_line(text: str | None) -> str | None:
    if not text:
        return None
    lines = [line for line in str(text).splitlines() if line.strip()]
    return lines[-1][:400] if lines else None


def vendor_section(target: TargetSpec, adapter, exploration: Exploration, toolchain: dict) -> dict:
    """``report["vendor"]``: per bucket the vendor alone and the shipped bundle, both as the vendor's final
    compile scores them (the bundle: the toolchain stage's own build, the one that ships), with the ratio,
    CPU-fallback layers and transitions; energy where a sourced power figure exists, else said unknown."""
    versions = toolchain.get("versions") or {}
    buckets = {}
    for name, explored in exploration.report["buckets"].items():
        entry = (toolchain.get("buckets") or {}).get(name) or {}
        final = None
        if entry.get("layers") or entry.get("vendor_placement"):
            final = adapter.vendor_cost({"layers": entry.get("layers"), "placement": entry.get("vendor_placement")}, versions)
        alone = explored["vendor_alone"]
        shipped = "original" if name in exploration.original else ("ours + forms" if name in exploration.changed else "ours")
        row = {
            "vendor_alone": alone,
            "ours": final.as_dict() if final else explored["explored"],
            "ours_from": "the final compile of the shipped bundle" if final else "the exploration estimate",
            "ratio": None,
            "shipped": shipped,
            "forms": explored["forms"] if shipped == "ours + forms" else {},
            "decision": explored["decision"],
            # The driver options the shipped build was made with (the bundle's convert script repeats them).
            "options": exploration.bucket_options.get(name) or {},
        }
        if explored.get("vendor_alone_int8"):
            row["vendor_alone_int8"] = explored["vendor_alone_int8"]
            row["precision"] = explored.get("precision")
        if explored.get("exact_rewrites"):
            row["exact_rewrites"] = explored["exact_rewrites"]
        best_alone = _cheapest_accurate_alone(explored)
        row["vendor_alone_best"] = best_alone.as_dict() if best_alone else None
        ours_cycles = (row["ours"] or {}).get("cycles")
        if ours_cycles is not None and best_alone is not None and best_alone.cycles:
            row["ratio"] = ours_cycles / best_alone.cycles
        buckets[name] = row
    traffic = exploration.report.get("traffic")
    if traffic:
        traffic = traffic_figures(traffic, {name: (row["ours"] or {}).get("cycles") for name, row in buckets.items()})
    return {
        "tool": exploration.report["tool"],
        "traffic": traffic,
        "measure": next((b["vendor_alone"].get("source") for b in buckets.values() if b["vendor_alone"].get("source")), None),
        "buckets": buckets,
        "compiles": exploration.report["compiles"],
        "cache_hits": exploration.report["cache_hits"],
        "energy": energy_note(target, any(b["vendor_alone"].get("cycles") for b in buckets.values())),
    }


def energy_note(target: TargetSpec, in_cycles: bool) -> dict:
    """Joules per inference need the part's power and the vendor's figure in seconds; say which is missing."""
    missing = []
    if target.power_w is None:
        missing.append(f"{target.name}'s power is unsourced ({target.sources.get('power_w', 'no source')})")
    if in_cycles:
        missing.append("the vendor's estimate is in cycles and the accelerator's clock is unsourced")
    else:
        missing.append("the vendor reports no time or energy for the model, only its placement")
    return {"known": False, "detail": "energy per inference is not known: " + "; ".join(missing)}


def _scored(reference: list[dict], outputs: list[dict[str, str]], accuracy, score) -> dict:
    import numpy as np

    if len(outputs) != len(reference):
        return {"ok": False, "loss": 1.0, "outputs": {},
                "detail": f"the simulator returned outputs for {len(outputs)} of {len(reference)} samples"}  # fmt: skip
    got = []
    for want, paths in zip(reference, outputs, strict=True):
        if set(want) - set(paths):
            return {"ok": False, "loss": 1.0, "outputs": {}, "detail": "an output was not returned"}
        got.append({k: np.load(paths[k]).reshape(v.shape).astype(v.dtype) for k, v in want.items()})
    found = score(reference, got, accuracy)
    found["samples"] = len(reference)
    return found
