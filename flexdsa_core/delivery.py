"""Is every fusion the plan says was taken in the model we deliver?

Between the Fusion Switcher and the delivered file, the clean-up passes, the target's legalisation and,
on cpu-ort, ONNX Runtime's offline transformers (``ort_layout``) run. Each taken candidate of a bucket's
plan gets ``delivered``:

* ``delivered``: nodes tagged with the rule (``RULE_TAG``) are in the model;
* ``subsumed``: none left because a later taken rule folded them into its own nodes (``gelu_erf``'s Gelu
  inside ``bias_gelu``'s BiasGelu), and that rule is delivered;
* ``delivered as <op>``: ONNX Runtime's offline layout pass turned the rule's op into its blocked-layout
  kernel (``Conv``/``FusedConv`` -> ``com.microsoft.nchwc::Conv``, activation included);
* ``not delivered``: gone, e.g. a model-local function inlined by ONNX Runtime's offline pass. A warning
  says so: the report never claims a fusion the file does not have.
"""

from __future__ import annotations

from collections import Counter

import onnx_ir as ir

from flexdsa_core.fusion_switcher import RULE_TAG
from flexdsa_core.targets.spec import op_key

# What ONNX Runtime's NCHWc transformer makes of an op a fusion produced.
_ORT_LAYOUT_FORMS = {
    "Conv": "com.microsoft.nchwc::Conv",
    "com.microsoft::FusedConv": "com.microsoft.nchwc::Conv",
    "GlobalAveragePool": "com.microsoft.nchwc::GlobalAveragePool",
    "MaxPool": "com.microsoft.nchwc::MaxPool",
}


def check_delivery(plan: dict, model: ir.Model) -> list[str]:
    """Mark each taken candidate of ``plan`` (a ``FusionPlan.to_json()``) and return warnings for losses."""
    tagged = Counter(
        node.metadata_props.get(RULE_TAG) for node in ir.traversal.RecursiveGraphIterator(model.graph)
    )
    ops = {op_key(node.op_type, node.domain) for node in ir.traversal.RecursiveGraphIterator(model.graph)}
    status: dict[str, str] = {}
    taken = [c for c in plan.get("candidates", []) if c.get("taken")]
    # Later rules first: whether a subsuming rule was delivered is known before its victims are judged.
    for candidate in reversed(taken):
        rule = candidate["rule"]
        by = [
            later for later in candidate.get("subsumed_by", {}) if status.get(later, "").startswith("deliver")
        ]
        forms = [_ORT_LAYOUT_FORMS[op] for op in candidate["produces"] if _ORT_LAYOUT_FORMS.get(op) in ops]
        if tagged[rule]:
            status[rule], detail = "delivered", f"{tagged[rule]} node(s) in the model"
        elif by:
            status[rule], detail = "subsumed", f"folded into {', '.join(sorted(by))}"
        elif forms:
            status[rule] = f"delivered as {forms[0]}"
            detail = (
                "ONNX Runtime's offline layout pass (ort_layout) turned it into its blocked-layout kernel"
            )
        else:
            status[rule], detail = "not delivered", "none of its nodes is in the delivered model"
        candidate["delivered"] = {"status": status[rule], "detail": detail}
    return [
        f"fusion {c['rule']!r} was applied but is not in the delivered model ({c['delivered']['detail']})"
        for c in taken
        if c["delivered"]["status"] == "not delivered"
    ]
