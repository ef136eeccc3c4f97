"""Forms the vendor's own estimate judges: rewrites whose worth depends on how the vendor's compiler lowers a
layer, so that no cost model of ours can decide them, only the vendor compiling both forms can.

A form module exports ``FORM`` (found by discovery, like fusion rules). Each ``VendorForm`` has named variants
(one onnxscript rule each: a block size, a granularity); ``sites`` lists where each variant matches, and
``apply`` takes exactly the chosen (site, variant) pairs. A site is the name of the node the rule matched at;
the rewritten node keeps that name and the nodes it adds are named ``<site><site_suffix>``, so the vendor's
per-layer report (which carries ONNX node names) can be read back per site (``vendor_runs.explore``).

An ``ExactForm`` is judged by the vendor's quantiser instead of its cycles: a rewrite that changes no value of the
fp32 model (bounded attention-mask constants, outlier channels moved to a path of their own) but removes what
a per-tensor int8 scale cannot hold. Its rules take figures measured on the calibration samples (``measure``:
the scores' range a mask constant must stay beyond, the channels that swamp a scale), and it names the nodes
that must stay float16 for the rewrite to pay (``float16``). Exploration applies it to the chosen form under the
vendor's int8 precisions and judges it in the vendor's simulator on held-out samples (``vendor_runs.explore``).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as ir_passes
from onnxscript.rewriter import RewriteRule

from flexdsa_core.fusions.walk import drive


@dataclass(frozen=True)
class VendorForm:
    name: str
    summary: str
    variants: dict[str, RewriteRule]
    site_suffix: str

    def sites(self, model: ir.Model) -> dict[str, list[str]]:
        """Site (node name) -> the variants that match there, in declaration order; the model is unchanged."""
        found: dict[str, list[str]] = {}
        for variant, rule in self.variants.items():

            def refuse(_rule, delta, variant=variant):
                found.setdefault(_root(delta).name, []).append(variant)
                return _Decision(False)

            drive(model, [rule], refuse, rule_name=self.name)
        return found

    def replaced(self, model: ir.Model, site: str) -> set[str]:
        """The names of the nodes of ``model`` that a rewrite at ``site`` replaces: what the vendor's layers for
        the site came from before it (``vendor_runs.explore`` compares their cycles with the rewrite's)."""
        found = {site}
        for rule in self.variants.values():

            def refuse(_rule, delta):
                if _root(delta).name == site:
                    found.update(node.name for node in delta.match.nodes if node.name)
                return _Decision(False)

            drive(model, [rule], refuse, rule_name=self.name)
        return found

    def apply(self, model: ir.Model, choices: dict[str, str]) -> list[str]:
        """Rewrite ``model`` in place at each site of ``choices`` (site -> variant); returns the sites taken."""
        taken: list[str] = []
        for variant, rule in self.variants.items():
            wanted = {site for site, chosen in choices.items() if chosen == variant}
            if not wanted:
                continue

            def take(_rule, delta, wanted=wanted):
                site = _root(delta).name
                if site not in wanted:
                    return _Decision(False)
                main = delta.new_outputs[0].producer()
                extra = [node for node in delta.new_nodes if node is not main]
                for index, node in enumerate(extra):
                    node.name = f"{site}{self.site_suffix}" + (f"_{index}" if index else "")
                main.name = site
                taken.append(site)
                return _Decision(True)

            drive(model, [rule], take, rule_name=self.name)
        if taken:
            ir_passes.RemoveUnusedNodesPass()(model)
        return taken


@dataclass(frozen=True)
class _Decision:
    taken: bool


def _root(delta) -> ir.Node:
    """The matched node that produces the match's output (the site)."""
    return delta.match.outputs[0].producer()


@dataclass
class Applied:
    """What an ``ExactForm`` did to a model: the sites it rewrote (site -> what was chosen there, in words), the
    nodes that must stay float16 (names), and the figures it measured, for the report."""

    sites: dict[str, str] = field(default_factory=dict)
    float16: list[str] = field(default_factory=list)
    measured: dict = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)  # reason -> count, where a rule matched and refused


@dataclass(frozen=True)
class ExactForm:
    """``apply(model, samples)``: ``measure`` reads the figures its rules need from ``samples`` (ONNX Runtime on
    ``model``) and returns them parametrised (a list of onnxscript rules), each rewrite records the roles of the
    nodes it makes (``rule.roles``: node -> role), and the new nodes are named ``<site><site_suffix>/<role>``;
    those whose role starts with ``float16`` are the float path."""

    name: str
    summary: str
    site_suffix: str
    measure: Callable[[ir.Model, list[dict]], tuple[list, dict]]

    def apply(self, model: ir.Model, samples: list[dict]) -> Applied:
        from flexdsa_core.fusions.walk import ReasonTracer

        applied = Applied()
        name_nodes(model)  # a site is a node's name
        rules, applied.measured = self.measure(model, samples)
        applied.refused.update(applied.measured.pop("refused", {}))
        for rule_class in rules:
            variants = rule_class.rule().commute()  # Add(a, b) and Add(b, a) alike
            tracer = ReasonTracer()

            def take(_rule, delta, rule_class=rule_class):
                site = _root(delta).name
                main = delta.new_outputs[0].producer()
                roles = rule_class.roles
                for index, node in enumerate(n for n in delta.new_nodes if n is not main):
                    role = roles.get(id(node), f"node{index}")
                    node.name = f"{site}{self.site_suffix}/{role}"
                    for number, output in enumerate(node.outputs):  # not the builder's val_N, which may be taken
                        output.name = f"{node.name}_output_{number}"
                    if role.startswith("float16"):
                        applied.float16.append(node.name)
                main.name = site
                if roles.get(id(main), "").startswith("float16"):
                    applied.float16.append(site)
                applied.sites[site] = rule_class.describe(site)
                return _Decision(True)

            drive(model, variants, take, rule_name=self.name, tracer=tracer)
            applied.refused.update(tracer.reasons)
        if applied.sites:
            ir_passes.RemoveUnusedNodesPass()(model)
        return applied


@dataclass(frozen=True)
class FloatPathForm:
    """A form that rewrites nothing: ``find(model, samples)`` names, from figures measured on the calibration
    samples, the nodes a per-tensor int8 scale cannot hold, which stay float16 (``Applied.float16``), each site
    with what was found there. Judged like an ``ExactForm`` (its model is the original, so exact by
    construction)."""

    name: str
    summary: str
    find: Callable[[ir.Model, list[dict]], Applied]

    def apply(self, model: ir.Model, samples: list[dict]) -> Applied:
        name_nodes(model)  # a site is a node's name
        return self.find(model, samples)


def matched_sites(model: ir.Model, finder: type, form_name: str) -> tuple[list[str], dict[str, int]]:
    """The sites (node names, in graph order, each once) where ``finder``'s rule matches ``model``, and the
    reasons it refused elsewhere; nothing is rewritten. A measuring form's first step: ``finder`` is its rule
    class with an ``EverySite`` map, so that every match passes its checks."""
    from flexdsa_core.fusions.walk import ReasonTracer

    found: list[str] = []

    def refuse(_rule, delta):
        found.append(_root(delta).name)
        return _Decision(False)

    tracer = ReasonTracer()
    drive(model, finder.rule().commute(), refuse, rule_name=form_name, tracer=tracer)
    return list(dict.fromkeys(found)), dict(tracer.reasons)


class EverySite(dict):
    """A rule's per-site map that has every site, each mapped to ``nothing`` (to find the sites before
    measuring: ``matched_sites``)."""

    def __init__(self, nothing) -> None:
        super().__init__()
        self.nothing = nothing

    def __contains__(self, key) -> bool:
        return True

    def __getitem__(self, key):
        return self.nothing


def outlier_channels(peaks: np.ndarray, factor: float, at_most: int) -> list[int]:
    """The channels, at most ``at_most`` of the highest, whose peak passes ``factor`` times the median
    channel's; sorted."""
    median = float(np.median(peaks))
    order = np.argsort(-peaks)[:at_most]
    return sorted(int(c) for c in order if peaks[c] > factor * median)


def name_nodes(model: ir.Model) -> None:
    taken = {node.name for node in model.graph if node.name}
    for index, node in enumerate(model.graph):
        if not node.name:
            name = f"node_{node.op_type}_{index}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)


def observe(model: ir.Model, values: list[str], samples: list[dict]) -> list[dict[str, np.ndarray]]:
    """The named values of ``model`` on each sample (ONNX Runtime, no graph optimisation): what a form measures."""
    from flexdsa_core.ort_runs import run, session

    probe = model.clone()
    by_name = {v.name: v for node in probe.graph for v in node.outputs}
    by_name.update({v.name: v for v in probe.graph.inputs})
    probe.graph.outputs.clear()
    for name in values:
        value = by_name[name]
        if value.type is None:
            value.type = ir.TensorType(ir.DataType.FLOAT)
        probe.graph.outputs.append(value)
    sess = session(ir.to_proto(probe).SerializeToString())
    return [run(sess, sample, what=f"measuring {len(values)} value(s) for a vendor form") for sample in samples]


@functools.cache
def discover_forms() -> dict[str, VendorForm | ExactForm | FloatPathForm]:
    """Every ``FORM`` exported by a module in this package, by name."""
    found: dict[str, VendorForm | ExactForm | FloatPathForm] = {}
    for module in pkgutil.iter_modules(__path__):
        form = getattr(importlib.import_module(f"{__name__}.{module.name}"), "FORM", None)
        if isinstance(form, VendorForm | ExactForm | FloatPathForm):
            found[form.name] = form
    return found
