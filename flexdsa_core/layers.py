"""The layers of the compiler core, lowest first: a module imports modules of its own layer and of the layers
below it, never of one above (imports inside functions and under ``TYPE_CHECKING`` included), and no import
closes a circle. ``tests/core/test_import_layers.py`` checks both statically and imports every module alone in
a process of its own, top layer first; DESIGN.md's Layout names the same order.

An entry names a module or a package (``targets`` holds every module under ``targets/``); a module belongs to
its longest entry, and ``""`` is the package itself (``flexdsa_core/__init__``, the public face). What two
layers share sits in the lower one: ``Cost`` in ``cost`` (the targets' estimates and the cost model both
add costs), ``AccuracyTarget`` in ``accuracy_target`` (the request's options hold one, scoring reads it), the
vendor folders in ``vendors`` (the targets find adapters there, the toolchains their drivers).
Nothing at run time imports this module; it is the table the test holds the imports to.
"""

from __future__ import annotations

__all__ = ["LAYERS", "layer_of"]

# (name, what the layer is, its modules and packages), lowest first.
LAYERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("values", "values and helpers that import nothing of the core", (
        "_libraries", "accuracy_target", "cache", "cli_output", "cost", "dims", "errors", "figures", "heap",
        "in_memory", "layers", "requirements", "rewrites", "significance", "traffic_buckets", "vendors", "version",
        "wire",
    )),
    ("models", "reading, checking, running and scoring a model; shapes and memory", (
        "accuracy", "calibration", "compare", "ingest", "invariants", "loadable", "memory_planner",
        "padding_check", "serialized", "shape_plan", "ort_runs",
    )),
    ("rules", "the fusion rules", ("fusions",)),
    ("toolchains", "the machinery that runs a vendor compiler in its own environment", ("toolchains",)),
    ("targets", "the targets declared: specs, adapters, legalisations, forms, templates, toolchains", ("targets",)),
    ("vendor runs", "what is done with a target: its estimate, the vendor's exploration and toolchain runs, the "
     "deploy manifest", ("vendor_runs",)),
    ("options", "what a request asks", ("holdout", "options", "spec_check")),
    ("cost model", "the work, the timing and the cost of kernels on a target", (
        "cost_model", "kernel_timing", "op_costs",
    )),
    ("stages", "the pipeline's stages", (
        "compilation", "delivery", "fusion_switcher", "passes", "pipeline", "registry", "report", "respecialise",
        "shape_tracker", "subgraph_mapper",
    )),
    ("checks", "the verifiers and the precision search, and the state of a run they share", (
        "optimize_run", "precision", "preflight", "verify",
    )),
    ("entry", "the one entry point, its bundle and the command line", ("", "bundle", "cli", "optimizer")),
)  # fmt: skip


def layer_of(module: str) -> int:
    """Index in ``LAYERS`` of ``module`` (``flexdsa_core.targets.rockchip.adapter``); ``KeyError`` when no
    entry holds it: a new top-level module takes its place in the table."""
    relative = module.removeprefix("flexdsa_core").removeprefix(".")
    best: tuple[int, int] | None = None  # (length of the entry, layer)
    for index, (_, _, entries) in enumerate(LAYERS):
        for entry in entries:
            holds = relative == entry or (entry != "" and relative.startswith(f"{entry}."))
            if holds and (best is None or len(entry) > best[0]):
                best = (len(entry), index)
    if best is None:
        raise KeyError(f"{module} is in no layer of flexdsa_core.layers.LAYERS: add it where its imports put it")
    return best[1]
