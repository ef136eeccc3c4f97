"""Forms the vendor's own estimate judges: rewrites whose worth depends on how the vendor's compiler lowers a
layer, so that no cost model of ours can decide them, only the vendor compiling both forms can.

A form module exports ``FORM`` (found by discovery, like fusion rules). Each ``VendorForm`` has named variants
(one onnxscript rule each: a block size, a granularity); ``sites`` lists where each variant matches, and
``apply`` takes exactly the chosen (site, variant) pairs. A site is the name of the node the rule matched at;
the rewritten node keeps that name and the nodes it adds are named ``<site><site_suffix>``, so the vendor's
per-layer report (which carries ONNX node names) can be read back per site (``vendor_explore``).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass

import onnx_ir as ir
import onnx_ir.passes.common as ir_passes
from onnxscript.rewriter import RewriteRule

from flexdsa_core.fusions.driver import drive


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
                return _Verdict(False)

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
                    return _Verdict(False)
                main = delta.new_outputs[0].producer()
                extra = [node for node in delta.new_nodes if node is not main]
                for index, node in enumerate(extra):
                    node.name = f"{site}{self.site_suffix}" + (f"_{index}" if index else "")
                main.name = site
                taken.append(site)
                return _Verdict(True)

            drive(model, [rule], take, rule_name=self.name)
        if taken:
            ir_passes.RemoveUnusedNodesPass()(model)
        return taken


@dataclass(frozen=True)
class _Verdict:
    taken: bool


def _root(delta) -> ir.Node:
    """The matched node that produces the match's output (the site)."""
    return delta.match.outputs[0].producer()


@functools.cache
def discover_forms() -> dict[str, VendorForm]:
    """Every ``FORM`` exported by a module in this package, by name."""
    found: dict[str, VendorForm] = {}
    for module in pkgutil.iter_modules(__path__):
        form = getattr(importlib.import_module(f"{__name__}.{module.name}"), "FORM", None)
        if isinstance(form, VendorForm):
            found[form.name] = form
    return found
