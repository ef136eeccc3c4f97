"""The Fusion Switcher: takes each fusion rule where it pays on the target, refuses it where it does not,
and says why (``fusion_plan.json``).

For each rule, in ``rewrites.ordered`` order (each after the rules its ``after`` names):

1. switched off by the user → refused;
2. the target lacks an op in ``rule.produces`` → refused ("target has no X");
3. otherwise every match is judged on its own (per-match granularity: a fusion can pay at one shape and
   not at another). The rule's onnxscript ``RewriteRule``s are driven node by node, as
   ``RewriteRuleSet`` would (by ``fusions.walk``, which the rule tests go through too), but each match's replacement is built *before* anything changes
   (``try_rewrite``) and costed as a delta::

       gain = cost(nodes the match removes) - cost(nodes the replacement adds)

   with the ``CostModel`` (measured kernels on cpu-ort, a roofline estimate elsewhere). The match is
   applied only if the gain pays for the objective:

   * ``latency``, on a target whose kernels are measured here (cpu-ort): the two sides are timed side by
     side in interleaved rounds (``CostModel.compare_paired``) and the match is taken when they are
     significantly faster (the 95 % interval of the per-round time ratio lies below 1 - 10 %), refused
     when significantly slower, and otherwise (a tie, or a side ONNX Runtime cannot run alone) decided
     by a fixed rule: taken if the rewrite leaves fewer kernels (a folded BatchNorm: the Conv with a bias
     costs about what it did without). Timing noise can then turn a decision into a tie, never flip it;
     the statistics are written per match kind (``significance``). On an estimated target: ``gain.seconds > 0``;
   * ``energy``: ``gain.joules > 0`` (where the target has no power figure, energy is unavailable and the
     decision falls back to latency, said so in the plan);
   * ``balanced``: ``gain.seconds / before.seconds + gain.joules / before.joules > 0`` (the first-order
     change of the energy-delay product), falling back to latency likewise.

Rules sharing an ``alternatives`` group consume the same nodes at different granularities: each
alternative is run as above on a clone of the model, "none" counts as gain 0, and the one with the
largest total gain for the objective is applied to the model; the others are refused with the figures.
Alternatives are compared per group, not mixed per match. At one site the rule's variants are tried in
turn until one pays; a site where none pays is recorded once.

Refusals by a rule's own ``check`` (a failed ``MatchResult`` with a sentence) are collected through the
matching tracer and written under the rule in the plan. The main graph and control-flow subgraphs are
rewritten; model-local functions are not (they are inlined before this stage).

Over 500 lines because enumerating candidates, costing them side by side, choosing among
alternatives and writing every decision with its reason are one loop over one plan; the rules
themselves live one per file in ``fusions/`` and the costs in ``cost_model``.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import onnx_ir as ir
import onnx_ir.passes.common as ir_passes
import onnxscript.optimizer
from onnxscript.rewriter import RewriteRule

from flexdsa_core.cost import Cost
from flexdsa_core.cost_model import CostModel
from flexdsa_core.fusions import FusionRule, discover_rules
from flexdsa_core.fusions.walk import RULE_TAG, ReasonTracer, carry_output_types, drive, removed_nodes
from flexdsa_core.op_costs import TensorInfo
from flexdsa_core.rewrites import ordered
from flexdsa_core.targets.spec import TargetSpec, op_key

__all__ = ["RULE_TAG", "FusionPlan", "FusionSwitcher"]

Objective = Literal["latency", "energy", "balanced"]
_MAX_REASONS = 10


@dataclass
class FusionPlan:
    """The switcher's decisions: one entry per candidate rule, in the order they were considered."""

    target: str
    objective: str
    cost_basis: str
    candidates: list[dict] = field(default_factory=list)
    applied: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    cost_model: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        taken_seconds = sum(c["estimated_gain"]["seconds"] or 0.0 for c in self.candidates if c["taken"])
        return {
            "kind": "flexdsa.fusion_plan",
            "target": self.target,
            "objective": self.objective,
            "cost_basis": self.cost_basis,
            "label": (
                "Gains are cost-model figures per match (removed nodes minus added nodes). On a calibrated "
                "target (cpu-ort) the kernel times are measurements on the compiling machine; elsewhere "
                "they are roofline estimates from the target spec."
            ),
            "applied": list(self.applied),
            "estimated_gain_seconds": taken_seconds,
            "candidates": list(self.candidates),
            "notes": list(self.notes),
            "cost_model": dict(self.cost_model),
        }


@dataclass
class _Judgement:
    taken: bool
    reason: str
    kind: str  # "Add+LayerNormalization -> SkipLayerNormalization"
    gain_seconds: float | None = None
    gain_joules: float | None = None
    before: Cost | None = None
    after: Cost | None = None
    significance: dict | None = None  # the side-by-side statistics, or how the decision was reached without


@dataclass
class _RuleRun:
    """What driving one rule over a model found."""

    judgements: list[_Judgement] = field(default_factory=list)
    tracer: ReasonTracer = field(default_factory=ReasonTracer)

    @property
    def taken(self) -> list[_Judgement]:
        return [j for j in self.judgements if j.taken]

    def total(self, attribute: str) -> float | None:
        values = [getattr(j, attribute) for j in self.taken]
        return None if any(v is None for v in values) else sum(values)


class FusionSwitcher:
    """Chooses, per match, the fusions that pay on ``target`` for ``objective``, and applies them."""

    def __init__(
        self,
        target: TargetSpec,
        supports: Callable[[str], bool],
        cost_model: CostModel,
        *,
        objective: Objective = "latency",
        disabled: Iterable[str] = frozenset(),
    ) -> None:
        if objective not in ("latency", "energy", "balanced"):
            raise ValueError(f"objective must be 'latency', 'energy' or 'balanced', not {objective!r}")
        self.target = target
        self.supports = supports
        self.cost_model = cost_model
        self.objective = objective
        self.disabled = frozenset(disabled)
        self._notes: dict[str, None] = {}
        # rule -> later rules that consumed nodes it produced (gelu_erf's Gelu inside bias_gelu's BiasGelu).
        self._subsumed: dict[str, collections.Counter[str]] = {}
        # Concrete shapes by value name, found once per run by running the graph: symbolic dims are
        # then specialised consistently across a match instead of one value at a time.
        self._shapes: dict[str, TensorInfo] = {}

    def run(self, model: ir.Model, rules: Sequence[FusionRule] | None = None) -> FusionPlan:
        """Rewrite ``model`` in place to the chosen strategy and return the plan."""
        rules = ordered(rules if rules is not None else discover_rules())
        plan = FusionPlan(self.target.name, self.objective, self.cost_model.basis)
        onnxscript.optimizer.basic_constant_propagation(model.graph)
        self._shapes = self._graph_shapes(model)
        done_groups: set[str] = set()
        changed = False
        for rule in rules:
            if rule.alternatives is None:
                group = [rule]
                rule_changed = self._single(model, rule, plan)
            elif rule.alternatives not in done_groups:
                done_groups.add(rule.alternatives)
                group = [r for r in rules if r.alternatives == rule.alternatives]
                rule_changed = self._alternatives(model, group, plan)
            else:
                continue
            if rule_changed and any(not rr.remove_nodes for r in group for rr in r.rewrite_rules):
                # A rule that leaves its matched nodes in place leaves them dead: remove them now, or the
                # next rule matches, costs and "takes" dead code that never reaches the delivered model.
                onnxscript.optimizer.remove_unused_nodes(model)
            changed |= rule_changed
        if changed:
            ir_passes.NameFixPass()(model)
        for candidate in plan.candidates:
            if candidate["rule"] in self._subsumed:
                candidate["subsumed_by"] = dict(self._subsumed[candidate["rule"]])
        plan.notes = list(self._notes) + [n for n in self.cost_model.notes if n not in self._notes]
        plan.cost_model = self.cost_model.describe()
        return plan

    # -- one rule, or one group of alternatives --------------------------------------------------------

    def _single(self, model: ir.Model, rule: FusionRule, plan: FusionPlan) -> bool:
        refusal = self._legality(rule)
        if refusal is not None:
            plan.candidates.append(_candidate(rule, refusal=refusal))
            return False
        run = self._drive(model, rule)
        plan.candidates.append(_candidate(rule, run=run))
        if run.taken:
            plan.applied.append(rule.name)
        return bool(run.taken)

    def _alternatives(self, model: ir.Model, group: list[FusionRule], plan: FusionPlan) -> bool:
        trials: dict[str, _RuleRun] = {}
        entries: dict[str, dict] = {}
        for rule in group:
            refusal = self._legality(rule)
            if refusal is not None:
                entries[rule.name] = _candidate(rule, refusal=refusal)
                continue
            trials[rule.name] = self._drive(model.clone(), rule)
        scores = {name: self._score(run) for name, run in trials.items()}
        best = max(scores, key=lambda name: scores[name], default=None)
        if best is not None and (not trials[best].taken or scores[best] <= (0.0, 0)):
            best = None  # every match of it was refused on its own, or together it gains nothing
        for rule in group:
            if rule.name not in trials:
                continue
            trial = trials[rule.name]
            if rule.name == best:
                run = self._drive(model, rule)  # the measurements are cached: this re-judges for free
                entries[rule.name] = _candidate(rule, run=run)
                entries[rule.name]["alternative_choice"] = f"cheapest of {_group_names(group)} and none"
                if run.taken:
                    plan.applied.append(rule.name)
                continue
            entry = _candidate(rule, run=trial)
            if entry["taken"]:
                entry["decision"] = "refused"
                entry["refused"] += entry["taken"]
                entry["taken"] = 0
                for line in entry["by_kind"]:  # the trial's "taken" lines were never applied: say so
                    if line["taken"]:
                        line["taken"] = False
                        line["reason"] = line["reason"].removesuffix(": taken") + ": would pay, but not applied"
                if best is None:
                    entry["reason"] = f"no alternative of {_group_names(group)} pays overall; kept unfused"
                else:
                    entry["reason"] = (
                        f"alternative {best!r} gains more ({_gain_text(trials[best])} vs {_gain_text(trial)}; "
                        f"ranked by significant gains, then kernels saved: {scores[best]} vs {scores[rule.name]})"
                    )
            entries[rule.name] = entry
        plan.candidates.extend(entries[r.name] for r in group)
        return best is not None and bool(trials[best].taken)

    def _graph_shapes(self, model: ir.Model) -> dict[str, TensorInfo]:
        values = [v for n in model.graph for v in n.outputs]
        if all(v.shape is not None and v.shape.is_static() and v.dtype is not None for v in values):
            return {}
        found = self.cost_model.infer_shapes(list(model.graph), opsets=model.opset_imports)
        return {v.name: info for v, info in found.items() if v.name}

    def _known_shapes(self, nodes: Sequence[ir.Node]) -> dict[ir.Value, TensorInfo]:
        """The run-wide shapes of the values around ``nodes`` that already exist in the graph (never of
        values the replacement creates: their names are not yet the graph's)."""
        if not self._shapes:
            return {}
        inside = set(nodes)
        known = {}
        for node in nodes:
            around = [*node.inputs, *(node.outputs if node.graph is not None else ())]
            for value in around:
                if value is None or value.const_value is not None or value.name not in self._shapes:
                    continue
                if node.graph is None and value.producer() in inside:
                    continue
                known[value] = self._shapes[value.name]
        return known

    def _legality(self, rule: FusionRule) -> str | None:
        if rule.name in self.disabled or (rule.alternatives and rule.alternatives in self.disabled):
            return "refused: switched off by the user"
        left_to_vendor = self.target.toolchain_fuses.get(rule.name)
        if left_to_vendor:
            return (
                f"refused: left to the {self.target.name} compiler, which fuses it itself ({left_to_vendor})"
            )
        missing = [op for op in rule.produces if not self.supports(op)]
        if missing:
            return f"refused: target {self.target.name} has no {', '.join(missing)}"
        if rule.measured_only and not self.cost_model.measuring:
            return "refused: taken only where kernels are timed on this machine (a roofline cannot tell its gain)"
        if any(rr.as_function for rr in rule.rewrite_rules):
            return "refused: the rule builds model-local functions, which the switcher cannot cost"
        return None

    def _score(self, run: _RuleRun) -> tuple[float, int]:
        """How much an alternative gains: (gain, kernels saved), compared as a tuple.

        Where timings are measured on this machine, only gains the statistics found significant count: a
        match taken by the fixed rule (no significant difference, or not measurable side by side) adds
        its kernels saved, not its noisy timing, so the same model picks the same alternative in every
        cold run. Estimated gains (other targets) are deterministic and count as they are."""
        taken = run.taken
        kernels_saved = sum((j.before.kernels - j.after.kernels) for j in taken if j.before and j.after)
        seconds, joules = run.total("gain_seconds"), run.total("gain_joules")
        if self.objective == "energy" and joules is not None:
            return joules, kernels_saved
        if self.objective == "balanced" and joules is not None:
            before_s = sum(j.before.seconds or 0.0 for j in taken) or 1.0
            before_j = sum(j.before.joules or 0.0 for j in taken) or 1.0
            return (seconds or 0.0) / before_s + joules / before_j, kernels_saved
        if self.cost_model.measuring:
            significant = sum(
                j.gain_seconds or 0.0 for j in taken if (j.significance or {}).get("decided_by") == "measurement"
            )
            return significant, kernels_saved
        return seconds or 0.0, kernels_saved

    # -- the per-match driver ------------------------------------------------------------------------

    def _drive(self, model: ir.Model, rule: FusionRule) -> _RuleRun:
        run = _RuleRun()

        # Alternatives are ranked by their significant gains (``_score``): both thresholds count there.
        both = rule.alternatives is not None

        def decide(rewrite_rule: RewriteRule, delta) -> _Judgement:
            judgement = self._judge(model, rewrite_rule, delta, both_thresholds=both)
            if judgement.taken:
                for earlier in (n.metadata_props.get(RULE_TAG) for n in removed_nodes(rewrite_rule, delta)):
                    if earlier and earlier != rule.name:  # an earlier fusion's node folded into this one
                        self._subsumed.setdefault(earlier, collections.Counter())[rule.name] += 1
            return judgement

        run.judgements = drive(
            model,
            rule.rewrite_rules,
            decide,
            rule_name=rule.name,
            opset_imports=rule.opset_imports,
            tracer=run.tracer,
        )
        return run

    def _judge(
        self, model: ir.Model, rewrite_rule: RewriteRule, delta, *, both_thresholds: bool = True
    ) -> _Judgement:
        removed = removed_nodes(rewrite_rule, delta)
        added = list(delta.new_nodes)
        kind = f"{_ops_text(removed)} -> {_ops_text(added)}"
        emitted = {op_key(n.op_type, n.domain) for n in added if not _is_constant(n)}
        missing = sorted(op for op in emitted if not self.supports(op))
        if missing:
            return _Judgement(False, f"refused: target {self.target.name} has no {', '.join(missing)}", kind)
        carry_output_types(delta)
        opsets = model.opset_imports
        comparison = None
        sized: dict[ir.Value, TensorInfo] = {}  # the shapes the comparison sized both sides at
        if self.cost_model.measuring:
            shapes = {**self._known_shapes(removed), **self._known_shapes(added)}
            # The one threshold this decision turns on (``_pays``): a rewrite that leaves fewer kernels is taken
            # unless significantly slower, any other only when significantly faster.
            fewer = _kernels(added) < _kernels(removed)
            question = "both" if both_thresholds else "slower" if fewer else "faster"
            comparison = self.cost_model.compare_paired(
                removed, added, opsets=opsets, shapes=shapes, question=question, found=sized
            )
        if comparison is not None:
            # Timed side by side, each kernel alone need not be timed as well, nor costed by a roofline: the
            # two sides' seconds come from the comparison, the work (FLOPs, bytes, kernels) from the shapes it
            # sized them at (not inferred again).
            before = self.cost_model.nodes_work(removed, opsets=opsets, shapes=sized)
            after = self.cost_model.nodes_work(added, opsets=opsets, shapes=sized)
        else:
            before = self.cost_model.nodes_cost(removed, opsets=opsets, shapes=self._known_shapes(removed))
            after = self.cost_model.nodes_cost(added, opsets=opsets, shapes=self._known_shapes(added))
        if comparison is not None:
            before = replace(before, seconds=comparison.first_s, measured=before.kernels)
            after = replace(after, seconds=comparison.second_s, measured=after.kernels)
        gain_seconds = _minus(before.seconds, after.seconds)
        gain_joules = _minus(before.joules, after.joules)
        taken, basis, significance = self._pays(before, after, gain_seconds, gain_joules, comparison)
        label = _label(before, after, comparison)
        where = " on this machine" if comparison is not None else ""
        reason = (
            f"{label} {_ops_text(added)} {_ms(after.seconds)} vs {_ops_text(removed)} "
            f"{_ms(before.seconds)}{where}{basis}: {'taken' if taken else 'refused'}"
        )
        return _Judgement(taken, reason, kind, gain_seconds, gain_joules, before, after, significance)

    def _pays(
        self,
        before: Cost,
        after: Cost,
        gain_seconds: float | None,
        gain_joules: float | None,
        comparison=None,
    ) -> tuple[bool, str, dict | None]:
        """(take it?, what the decision rested on beyond latency, the statistics or the rule applied)."""
        objective = self.objective
        if objective in ("energy", "balanced") and gain_joules is None:
            self._note(
                f"energy is unavailable for {self.target.name} (no power figure, or measured times only): "
                f"the {objective} objective decided on latency"
            )
            objective = "latency"
        if objective == "energy":
            return gain_joules > 0, f", energy {_mj(before.joules)} -> {_mj(after.joules)}", None
        if objective == "balanced":
            if gain_seconds is None:
                return False, " (no time estimate)", None
            score = gain_seconds / (before.seconds or 1.0) + gain_joules / (before.joules or 1.0)
            return score > 0, f", energy {_mj(before.joules)} -> {_mj(after.joules)}", None
        fewer = after.kernels < before.kernels
        rule = f"rule: {'fewer' if fewer else 'no fewer'} kernels ({after.kernels} vs {before.kernels})"
        if self.cost_model.measuring:
            # Measured here: only a significant difference decides; anything else goes to the fixed rule.
            if comparison is None:
                return fewer, f" (not measurable side by side; {rule})", {"decided_by": rule, "verdict": None}
            stats = {**comparison.as_dict(), "decided_by": "measurement"}
            if comparison.verdict == "faster":
                return True, f" (significantly faster, ratio {comparison.ratio:.2f})", stats
            if comparison.verdict == "slower":
                return False, f" (significantly slower, ratio {comparison.ratio:.2f})", stats
            stats["decided_by"] = rule
            return fewer, f" (no significant difference, ratio {comparison.ratio:.2f}; {rule})", stats
        if gain_seconds is None:
            return False, " (no time estimate)", None
        return gain_seconds > 0, "", None

    def _note(self, text: str) -> None:
        self._notes[text] = None


# -- helpers ---------------------------------------------------------------------------------------


def _label(before: Cost, after: Cost, comparison) -> str:
    """ "measured" only when both sides were timed here; "estimated" when neither kernel was."""
    if comparison is not None or (
        before.kernels
        and after.kernels
        and before.measured == before.kernels
        and after.measured == after.kernels
    ):
        return "measured"
    if before.measured or after.measured:
        return "partly measured (the rest estimated)"
    return "estimated"


def _is_constant(node: ir.Node) -> bool:
    return node.op_type == "Constant" and node.domain in ("", "ai.onnx")


def _kernels(nodes: Sequence[ir.Node]) -> int:
    """Kernels a node set runs, as ``CostModel`` counts them: every node but a Constant."""
    return sum(1 for node in nodes if not _is_constant(node))


def _ops_text(nodes: Sequence[ir.Node]) -> str:
    names = [n.op_type for n in nodes if not _is_constant(n)]
    return "+".join(names) if names else "nothing"


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _mj(joules: float | None) -> str:
    return "n/a" if joules is None else f"{joules * 1e3:.4f} mJ"


def _group_names(group: Sequence[FusionRule]) -> str:
    return ", ".join(repr(r.name) for r in group)


def _gain_text(run: _RuleRun) -> str:
    seconds = run.total("gain_seconds")
    return "n/a" if seconds is None else f"{seconds * 1e3:+.3f} ms"


def _candidate(rule: FusionRule, *, refusal: str | None = None, run: _RuleRun | None = None) -> dict:
    entry = {
        "rule": rule.name,
        "summary": rule.summary,
        "produces": list(rule.produces),
        "alternatives": rule.alternatives,
        "matches": 0,
        "taken": 0,
        "refused": 0,
        "estimated_gain": {"seconds": 0.0, "joules": 0.0, "basis": "estimate"},
        "by_kind": [],
        "check_refusals": [],
    }
    if refusal is not None:
        return {**entry, "decision": "refused", "reason": refusal}
    assert run is not None
    taken = run.taken
    entry.update(
        matches=len(run.judgements),
        taken=len(taken),
        refused=len(run.judgements) - len(taken),
        by_kind=_by_kind(run.judgements),
        check_refusals=[{"reason": r, "count": c} for r, c in run.tracer.reasons.most_common(_MAX_REASONS)],
    )
    timed = [bool(j.significance and j.significance.get("verdict")) for j in run.judgements]
    entry["estimated_gain"] = {
        "seconds": run.total("gain_seconds"),
        "joules": run.total("gain_joules"),
        "basis": (
            "measured side by side" if timed and all(timed)
            else "partly measured (the rest estimated)" if any(timed) else "estimate"
        ),
    }  # fmt: skip
    if not run.judgements:
        first = run.tracer.reasons.most_common(1)
        why = f"; the rule's check said: {first[0][0]}" if first else ""
        return {**entry, "decision": "no match", "reason": f"no match in this model{why}"}
    kinds = entry["by_kind"]
    if len(taken) == len(run.judgements):
        decision = "taken"
    elif taken:
        decision = "partly taken"
    else:
        decision = "refused"
    reason = "; ".join(f"{k['count']}x {k['reason']}" for k in kinds[:3])
    return {**entry, "decision": decision, "reason": reason}


def _by_kind(judgements: Sequence[_Judgement]) -> list[dict]:
    """Identical matches (same ops, same figures, same decision) folded into one line with a count."""
    groups: dict[tuple[str, str, bool], list[_Judgement]] = {}
    for judgement in judgements:
        groups.setdefault((judgement.kind, judgement.reason, judgement.taken), []).append(judgement)
    lines = []
    for (kind, reason, taken), members in groups.items():
        first = members[0]
        lines.append(
            {
                "rewrite": kind,
                "count": len(members),
                "taken": taken,
                "reason": reason,
                "gain_seconds_each": first.gain_seconds,
                "gain_joules_each": first.gain_joules,
                "before": first.before.as_dict() if first.before else None,
                "after": first.after.as_dict() if first.after else None,
                "significance": first.significance,
            }
        )
    return sorted(lines, key=lambda line: -line["count"])
