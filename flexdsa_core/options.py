"""What a caller may ask of one optimisation: ``OptimizeOptions``, and ``RequestSpec`` (options + target),
the JSON that ``POST /optimize`` and ``flexdsa optimize`` take.

Unknown keys are refused (``extra="forbid"``) so a typo never silently does nothing.
"""

from __future__ import annotations

import difflib
import typing
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from flexdsa_core.accuracy_target import AccuracyTarget
from flexdsa_core.errors import InvalidOptionsError
from flexdsa_core.requirements import canonical
from flexdsa_core.targets import TargetSpec, list_targets, load_target

Objective = Literal["latency", "energy", "balanced"]
Precision = Literal["fp32", "fp16", "int8", "mixed"]


class HoldOut(BaseModel):
    """How the samples are split between calibrating and judging: the quantiser calibrates on one part and
    every accuracy decision is taken on the other, which it never saw."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    share: float = Field(
        0.5, ge=0.1, le=0.9,
        description="Share of the samples held out to judge on (the rest calibrates); of the groups, when the "
        "calibration file names them (by_groups).",
    )
    order: Literal["shuffled", "as_given"] = Field(
        "shuffled",
        description="shuffled: a seeded permutation decides which samples are held out (samples sorted by class "
        "still land on both sides); as_given: the first part calibrates and the last is held out (keep samples of "
        "one source together, e.g. the crops of one photo or the windows of one recording). With groups, the "
        "groups are shuffled or taken in the order they first appear.",
    )
    folds_below: int = Field(
        16, ge=2, le=256,
        description="With fewer samples than this, k-fold (k = min(samples, 4)): each fold is judged by a model "
        "calibrated on the others, the held-out figure pools them, and the model that ships is calibrated on all.",
    )  # fmt: skip
    by_groups: bool = Field(
        True,
        description="When the calibration file names a source per sample (a 'groups' array: the photo, speaker or "
        "recording each sample came from), hold out whole groups: share and k-fold count groups, and no group is "
        "on both sides, so the figure is on sources the quantiser never saw. false: split samples as without groups.",
    )


class Tolerance(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    atol: float = Field(ge=0)
    rtol: float = Field(ge=0)


class ObservedShape(BaseModel):
    """One shape seen in traffic: the value of each named dynamic dim, and how many requests had it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dims: dict[str, int] = Field(
        ..., min_length=1, description="Named dynamic dim -> its value in these requests, e.g. {'seq': 37}."
    )
    count: int = Field(1, ge=1, description="How many requests had this shape.")

    @field_validator("dims")
    @classmethod
    def _positive(cls, dims: dict[str, int]) -> dict[str, int]:
        bad = {name: value for name, value in dims.items() if value < 1}
        if bad:
            raise ValueError(f"every observed dim value must be >= 1, got {bad}")
        return dims


class OptimizeOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    objective: Objective = Field("latency", description="What the Fusion Switcher minimises on the target.")
    run_budget_s: float = Field(
        120.0,
        gt=0,
        le=3600,
        description="Seconds any one ONNX Runtime run of the pipeline (validation, latency, shape probes) may "
        "take before the job fails with run_budget_exceeded: a Loop with 10^9 iterations never holds a worker.",
    )
    disabled_rules: list[str] = Field(
        default_factory=list,
        description="Names of passes or fusion rules to switch off (see GET /targets/{name}).",
    )
    shape_buckets: dict[str, list[int]] | None = Field(
        None,
        description="Values to specialise each named dynamic dim to, e.g. {'batch': [1], 'seq': [128, 512]}. "
        "None: the target's default (cpu-ort keeps dynamic dims dynamic).",
    )
    observed_shapes: list[ObservedShape] | None = Field(
        None,
        max_length=10_000,
        description="Shapes seen in traffic, with counts, e.g. [{'dims': {'seq': 37, 'batch': 1}, 'count': 120}]. "
        "Every entry names the same dynamic dims of the model (others are refused). When shape_buckets is not "
        "given, the Shape Tracker picks at most max_buckets buckets that minimise the expected cost of the "
        "traffic, each shape padded up to the smallest bucket that fits, under the target's cost model; the "
        "report compares its padding waste with evenly spaced buckets (shapes.from_traffic).",
    )
    max_buckets: int = Field(
        3,
        ge=1,
        le=16,
        description="At most this many buckets (combinations of dim values) when buckets come from "
        "observed_shapes. The largest observed value of each dim is always one of them.",
    )
    input_shapes: dict[str, list[int | str]] | None = Field(
        None, description="Override graph input shapes; strings name symbolic dims."
    )
    validate_outputs: bool = Field(
        True, description="Check every optimised model against the original in ONNX Runtime."
    )
    allow_mismatch: bool = Field(
        False,
        description="Keep an optimised model whose outputs differ beyond tolerance (reported, not failed).",
    )
    rollback_on_mismatch: bool = Field(
        True, description="On a mismatch, bisect the applied rewrites, switch the culprit off and re-run."
    )
    tolerances: dict[str, Tolerance] | None = Field(
        None,
        description="Per-dtype overrides of the validation tolerances, e.g. {'float32': {'atol':1e-4,'rtol':1e-3}}.",
    )
    never_slower: bool = Field(
        True, description="cpu-ort only: measure original vs optimised and drop rewrites that cost time."
    )
    allow_slower: bool = Field(
        False,
        description="cpu-ort: ship an optimised model that is still measured slower than the original (with a "
        "warning) instead of the fastest verified variant.",
    )
    measure_latency: bool = Field(
        True, description="Measure ONNX Runtime CPU latency before/after for the report."
    )
    latency_repeats: int = Field(20, ge=1, le=1000)
    calibrate: bool = Field(
        True, description="cpu-ort: calibrate the cost model by measuring ONNX Runtime kernels here."
    )
    seed: int = Field(0, description="Seed for the random validation inputs.")
    max_fold_bytes: int = Field(
        16 * 1024 * 1024, ge=0, description="Constant folding never creates a tensor larger than this."
    )
    debug_invariants: bool = Field(False, description="Check graph invariants between every stage (slower).")
    precision: Precision = Field(
        "fp32",
        description="fp32 (default); int8 (every target in its own format: on cpu-ort static QDQ or dynamic "
        "int8, the faster that meets the accuracy target; on an accelerator the vendor's format and quantiser); "
        "mixed (int8 with the most sensitive layers kept in float until the target holds); fp16 (accelerators "
        "with float16: float16 weights and arithmetic).",
    )
    accuracy: AccuracyTarget = Field(
        default_factory=AccuracyTarget,
        description="The accuracy a lower precision must keep (cosine per output; top-1 on classifiers).",
    )
    keep_io_types: bool = Field(
        True, description="fp16: keep float32 graph inputs and outputs (casts at the edges)."
    )
    precision_fallback: Literal["fail", "fp32"] = Field(
        "fail",
        description="int8 when no int8 model meets the accuracy target: fail naming the layers that miss it "
        "(default), or ship the fp32 model with a warning.",
    )
    holdout: HoldOut = Field(
        default_factory=HoldOut,
        description="How the calibration samples are split: the quantiser calibrates on part, accuracy is "
        "judged on the rest (k-fold when there are few).",
    )
    allow_synthetic_calibration: bool = Field(
        False,
        description="A target that computes int8 only (xilinx-kv260) quantises every model: without calibration "
        "samples the request is refused, unless this is true; then it is calibrated on seeded random inputs, "
        "which check numerics only (no accuracy claim), with a warning.",
    )

    @field_validator("disabled_rules")
    @classmethod
    def _strip(cls, names: list[str]) -> list[str]:
        return sorted({n.strip() for n in names if n.strip()})


# The request's keys that are not pipeline options: what the service does around the job.
REQUEST_ONLY = frozenset({"target", "cache", "model_name", "requirements"})


class RequestSpec(OptimizeOptions):
    """A whole request: the target (a built-in name, or a custom spec as an object) plus the options."""

    target: str | dict = Field(
        ..., description="Built-in target name (GET /targets) or a custom TargetSpec object."
    )
    cache: Literal["use", "refresh"] = Field(
        "use",
        description="use: an identical earlier job of the tenant (same model, spec, target, toolchain state and "
        "compiler version) answers at once with its artifacts; refresh: run the pipeline again regardless (the "
        "new run then answers later identical requests).",
    )
    # --- gates and lineage (issue 35): read by the service when the job ends, never by the pipeline ---
    model_name: str | None = Field(
        None,
        min_length=1,
        max_length=255,
        description="The model this job is a version of (default: the uploaded file's name without its suffix): "
        "a job compares itself with this model's previous successful job on the same target.",
    )
    requirements: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="What the finished job must reach, e.g. ['speedup>=1.2', 'accuracy>=0.99', 'no_regression'] "
        "(figures: speedup, accuracy, latency_ms, bundle_mb, cpu_nodes; see flexdsa_core/requirements.py). A job "
        "that misses one still succeeds, with requirements[].met false; flexdsa submit exits 3.",
    )

    @field_validator("requirements")
    @classmethod
    def _readable_requirements(cls, expressions: list[str]) -> list[str]:
        return [canonical(expression) for expression in expressions]

    def options(self) -> OptimizeOptions:
        return OptimizeOptions.model_validate(self.model_dump(exclude=REQUEST_ONLY))

    def target_spec(self):
        """The built-in target named, or the custom spec given. A custom spec never takes a built-in's name:
        the name is what users, reports and comparisons know a target by, so another spec under it would pass
        for the built-in (``InvalidOptionsError``, 422)."""
        if isinstance(self.target, str):
            return load_target(self.target)
        spec = TargetSpec.model_validate(self.target)
        if spec.name in {builtin.name for builtin in list_targets()}:
            raise InvalidOptionsError(
                f"{spec.name!r} is a built-in target; give your custom target another name (or send "
                f'"target": "{spec.name}" for the built-in itself).',
                details={"loc": ["target", "name"], "name": spec.name},
            )
        return spec


def known_keys(loc: tuple | list) -> list[str]:
    """The keys a spec object accepts at ``loc`` (the path of an unknown key, its last item the key itself):
    the fields of ``RequestSpec`` or of the nested options object the path leads into; [] where none is known."""
    model: type[BaseModel] | None = RequestSpec
    for part in list(loc)[:-1]:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return []
        model = next(
            (t for t in (field.annotation, *typing.get_args(field.annotation))
             if isinstance(t, type) and issubclass(t, BaseModel)),
            None,
        )  # fmt: skip
        if model is None:
            return []
    return sorted(model.model_fields)


def did_you_mean(loc: tuple | list) -> str | None:
    """The accepted key closest to a mistyped one (``shape_bucket`` -> ``shape_buckets``), or None."""
    if not loc or not isinstance(loc[-1], str):
        return None
    close = difflib.get_close_matches(loc[-1], known_keys(loc), n=1, cutoff=0.6)
    return close[0] if close else None
