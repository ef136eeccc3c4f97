"""Gates for pipelines: what a job must reach (``requirements`` in the spec, ``flexdsa submit --require``), the
figures it is judged on, and its comparison with the previous job of the same model on the same target.

A requirement is ``<figure> <op> <number>`` (op one of ``>= > <= < ==``) or the word ``no_regression``. The
figures, each read from the job's report (``figures``: the report summary and its comparison row, the one the
"which chip?" table shows) and named with its source:

* ``speedup``: the report's headline speed-up, i.e. the fp32 original's latency / the optimised model's, from the
  source the report uses: on ``cpu-ort`` measured on this CPU in paired rounds (``1 / median(t_opt / t_orig)``;
  in an int8/mixed/fp16 job the shipped precision against the fp32 original); elsewhere an estimate, the
  vendor's own (its compiler alone / ours, in cycles) where its toolchain ran, else the roofline's;
* ``accuracy``: the worst accuracy figure the report states: the vendor simulator's (judged score, else the
  worst cosine to the original) where a toolchain ran, else the held-out samples' worst figure (``1 - loss``)
  of an int8/mixed/fp16 job. A job checked only numerically (fp32: ONNX Runtime, max abs difference on
  synthetic inputs; any figure on synthetic inputs, marked "numerics only") makes no accuracy claim, so it
  has no accuracy figure and an accuracy requirement is unmet;
* ``latency_ms``: the optimised model's latency in ms (measured on cpu-ort, the roofline estimate elsewhere),
  the job's figure (``report["figures"]``); where that estimate is a lower bound (CPU-fallback nodes left
  out), an upper limit (``latency_ms<5``) cannot be established from it and is unmet, saying why;
* ``bundle_mb``: every file of the bundle together, in MB (10^6 bytes);
* ``cpu_nodes``: the nodes the Subgraph Mapper leaves on the CPU (headline bucket; 0 on cpu-ort).

A figure the report does not give makes its requirement unmet ("not known"), never met by default.

``no_regression``: no figure worse than the previous successful job of the same ``model_name`` on the same
target (``compare_with_previous``): latency higher by more than ``LATENCY_TOLERANCE`` (measured) or
``ESTIMATE_TOLERANCE`` (estimated; only when both jobs give it from the same source), accuracy lower by
more than ``ACCURACY_TOLERANCE`` (same metric), the bundle larger by more than ``BUNDLE_TOLERANCE``, or more
CPU-fallback nodes. With no previous job there is nothing to regress from: met, and said so.
"""

from __future__ import annotations

import difflib
import operator
import re
from typing import Any

NO_REGRESSION = "no_regression"
FIGURES = {
    "speedup": "the headline speed-up over the fp32 original (x)",
    "accuracy": "the worst accuracy figure the report states",
    "latency_ms": "the optimised model's latency (ms)",
    "bundle_mb": "the bundle's size (MB)",
    "cpu_nodes": "nodes left on the CPU",
}
NAMES = (*FIGURES, NO_REGRESSION)
OPERATORS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq}
MAX_REQUIREMENTS = 16

# no_regression's tolerances: what counts as worse than the previous job.
LATENCY_TOLERANCE = 0.10  # measured timings on a shared machine move by a few percent between runs
ESTIMATE_TOLERANCE = 0.01  # estimates are deterministic: only a real change moves them
ACCURACY_TOLERANCE = 0.001
BUNDLE_TOLERANCE = 0.05

_EXPRESSION = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(>=|<=|==|>|<)\s*([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*$")
_WORD = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*$")


def parse(expression: str) -> tuple[str, str | None, float | None]:
    """(figure, op, bound) of one requirement, or ``(no_regression, None, None)``; ``ValueError`` with the fix
    for a name that is not a figure (the closest one named) or an expression that cannot be read."""
    text = str(expression)
    match = _EXPRESSION.match(text)
    word = _WORD.match(text)
    name = match.group(1) if match else (word.group(1) if word else None)
    if name is None:
        raise ValueError(
            f"Cannot read the requirement {text!r}: write <figure><op><number>, e.g. 'speedup>=1.2', or "
            f"'{NO_REGRESSION}' (figures: {', '.join(FIGURES)}; ops: {', '.join(OPERATORS)})."
        )
    if name not in NAMES:
        close = difflib.get_close_matches(name, NAMES, n=1, cutoff=0.5)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"Unknown requirement {name!r} in {text!r}.{hint} Known: {', '.join(NAMES)}.")
    if name == NO_REGRESSION:
        if match:
            raise ValueError(f"{NO_REGRESSION!r} takes no bound: write it alone (got {text!r}).")
        return name, None, None
    if not match:
        raise ValueError(f"The requirement {text!r} needs a bound: e.g. '{name}>=1.2' (ops: {', '.join(OPERATORS)}).")
    return name, match.group(2), float(match.group(3))


def canonical(expression: str) -> str:
    """The requirement as stored and shown: checked, blanks dropped, its number as written (``speedup>=1.0``)."""
    name, op, _ = parse(expression)
    return name if op is None else f"{name}{op}{_EXPRESSION.match(str(expression)).group(3)}"


# --- the figures ------------------------------------------------------------------------------------------


def figures(summary: dict | None, bundle_bytes: int | None) -> dict[str, Any]:
    """The figures a job is judged on, from its report summary (with the comparison row the worker keeps in
    it) and the size of its artifacts: each value with its source, None where the report gives none."""
    summary = summary or {}
    row = summary.get("comparison") or {}
    latency = row.get("latency") or {}
    accuracy = row.get("accuracy") or {}
    headline = summary.get("headline") or {}
    claimed = (
        accuracy.get("value") is not None
        and accuracy.get("metric") not in (None, "max_abs")
        and not accuracy.get("numerics_only")
    )
    return {
        "speedup": summary.get("speedup"),
        "speedup_source": headline.get("source"),
        "speedup_text": headline.get("text"),
        "accuracy": accuracy.get("value") if claimed else None,
        "accuracy_metric": accuracy.get("metric") if claimed else None,
        "accuracy_source": accuracy.get("source") if claimed else _no_accuracy_reason(accuracy),
        "latency_ms": round(latency["seconds"] * 1e3, 6) if latency.get("seconds") is not None else None,
        "latency_source": latency.get("source"),
        "latency_complete": latency.get("complete", not latency.get("partial")),
        "latency_text": latency.get("label"),
        "bundle_mb": round(float(bundle_bytes) / 1e6, 6) if bundle_bytes is not None else None,
        "cpu_nodes": row.get("cpu_fallback_nodes"),
    }


def _no_accuracy_reason(accuracy: dict) -> str:
    if accuracy.get("numerics_only") and accuracy.get("metric") not in (None, "max_abs"):
        return (
            f"no accuracy claim: {accuracy.get('text') or accuracy['metric']} rests on synthetic inputs (numerics "
            "only); calibration samples of your data give one"
        )
    if accuracy.get("metric") == "max_abs":
        return (
            f"no accuracy claim: outputs checked numerically only (ONNX Runtime, max abs difference "
            f"{accuracy['value']:.2e}); an int8/mixed/fp16 job with calibration samples, or a vendor simulator, "
            "gives one"
        )
    return "the report states no accuracy figure"


# --- the comparison with the previous job -------------------------------------------------------------------


def compare_with_previous(current: dict, previous: dict) -> list[dict[str, Any]]:
    """Side by side, figure by figure: ``{"figure", "current", "previous", "change", "regressed", "rule"}``;
    ``change`` is relative for latency and bundle size, absolute for accuracy and CPU nodes. A figure either
    job lacks (or gives from another source or metric) is listed with ``regressed`` None: not compared."""
    rows = []
    same_source = current.get("latency_source") == previous.get("latency_source")
    measured = current.get("latency_source") == "measured on this CPU"
    tolerance = LATENCY_TOLERANCE if measured else ESTIMATE_TOLERANCE
    rows.append(_relative("latency_ms", current, previous, tolerance, comparable=same_source))
    same_metric = current.get("accuracy_metric") == previous.get("accuracy_metric")
    rows.append(_lower_is_worse("accuracy", current, previous, ACCURACY_TOLERANCE, comparable=same_metric))
    rows.append(_relative("bundle_mb", current, previous, BUNDLE_TOLERANCE, comparable=True))
    rows.append(_more_is_worse("cpu_nodes", current, previous))
    return rows


def _relative(name: str, current: dict, previous: dict, tolerance: float, *, comparable: bool) -> dict:
    now, before = current.get(name), previous.get(name)
    row = {"figure": name, "current": now, "previous": before, "change": None, "regressed": None,
           "rule": f"worse when higher by more than {tolerance:.0%}"}  # fmt: skip
    if now is None or before is None or not comparable or before <= 0:
        return row
    row["change"] = round(now / before - 1, 4)
    row["regressed"] = now > before * (1 + tolerance)
    return row


def _lower_is_worse(name: str, current: dict, previous: dict, tolerance: float, *, comparable: bool) -> dict:
    now, before = current.get(name), previous.get(name)
    row = {"figure": name, "current": now, "previous": before, "change": None, "regressed": None,
           "rule": f"worse when lower by more than {tolerance:g}"}  # fmt: skip
    if now is None or before is None or not comparable:
        return row
    row["change"] = round(now - before, 6)
    row["regressed"] = now < before - tolerance
    return row


def _more_is_worse(name: str, current: dict, previous: dict) -> dict:
    now, before = current.get(name), previous.get(name)
    row = {"figure": name, "current": now, "previous": before, "change": None, "regressed": None,
           "rule": "worse when more"}  # fmt: skip
    if now is None or before is None:
        return row
    row["change"] = now - before
    row["regressed"] = now > before
    return row


# --- the verdicts -----------------------------------------------------------------------------------------


def evaluate(requirements: list[str], current: dict, previous: dict | None) -> list[dict[str, Any]]:
    """One verdict per requirement, ``{"expr", "figure", "met", "detail"}``. ``previous``: ``{"job_id",
    "rows"}`` (``compare_with_previous``) or None when the model has no earlier successful job here."""
    verdicts = []
    for expression in requirements:
        name, op, bound = parse(expression)
        if name == NO_REGRESSION:
            verdicts.append(_no_regression(expression, previous))
            continue
        figure = current.get(name)
        if figure is None:
            reason = current.get(f"{name}_source") if name == "accuracy" else "the report gives no such figure"
            verdicts.append({"expr": expression, "figure": None, "met": False, "detail": f"{name} not known, {reason}"})
            continue
        met = bool(OPERATORS[op](figure, bound))
        detail = _figure_text(name, figure, current)
        if name == "latency_ms" and op in ("<", "<=", "==") and not current.get("latency_complete", True):
            met, detail = False, f"{detail}: a lower bound, so an upper limit cannot be established from it"
        verdicts.append({"expr": expression, "figure": figure, "met": met, "detail": detail})
    return verdicts


def _figure_text(name: str, figure: float, current: dict) -> str:
    if name == "speedup":
        return current.get("speedup_text") or f"{figure:.2f}x"
    if name == "accuracy":
        return f"{current.get('accuracy_metric')} {figure:.5f}, {current.get('accuracy_source')}"
    if name == "latency_ms":
        return current.get("latency_text") or f"{figure:.4g} ms, {current.get('latency_source')}"
    if name == "bundle_mb":
        return f"{figure:.3f} MB"
    return f"{figure} nodes on the CPU"


def _no_regression(expression: str, previous: dict | None) -> dict[str, Any]:
    if previous is None:
        return {"expr": expression, "figure": None, "met": True,
                "detail": "no previous successful job of this model on this target: nothing to regress from"}  # fmt: skip
    worse = [row for row in previous["rows"] if row["regressed"]]
    if not worse:
        return {"expr": expression, "figure": [], "met": True,
                "detail": f"no figure worse than job {previous['job_id']}"}  # fmt: skip
    return {"expr": expression, "figure": [row["figure"] for row in worse], "met": False,
            "detail": f"worse than job {previous['job_id']}: " + "; ".join(_change_text(row) for row in worse)}  # fmt: skip


def _change_text(row: dict) -> str:
    change = row["change"]
    delta = f"{change:+.1%}" if row["figure"] in ("latency_ms", "bundle_mb") else f"{change:+g}"
    return f"{row['figure']} {row['current']:g} vs {row['previous']:g} ({delta}; {row['rule']})"


def unmet_line(verdict: dict) -> str:
    """One line for an unmet requirement, as ``flexdsa submit`` prints it: the requirement, the job's figure
    and where it comes from (or why there is none, or what regressed)."""
    name = parse(verdict["expr"])[0]
    figure = verdict.get("figure")
    if name == NO_REGRESSION or figure is None:
        return f"requirement not met: {verdict['expr']}: {verdict['detail']}"
    return f"requirement not met: {verdict['expr']}: {name} is {figure:.4g} ({verdict['detail']})"
