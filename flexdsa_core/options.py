"""What a caller may ask of one optimisation: ``OptimizeOptions``, and ``RequestSpec`` (options + target),
the JSON that ``POST /optimize`` and ``flexdsa optimize`` take.

Unknown keys are refused (``extra="forbid"``) so a typo never silently does nothing.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Objective = Literal["latency", "energy", "balanced"]
Precision = Literal["fp32", "fp16", "int8", "mixed"]


class AccuracyTarget(BaseModel):
    """What a lower-precision model must keep, judged on the calibration samples against the fp32 original.

    ``cosine(a, b) = a.b / (|a| |b|)`` of each output over all samples; top-1 agreement is the share of rows
    (every position but the last axis) whose argmax over the last axis agrees, on classifier outputs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_cosine: float = Field(0.99, ge=0, le=1, description="Every output's cosine with the original.")
    min_top1: float = Field(
        0.99, ge=0, le=1, description="Top-1 agreement with the original on classifier outputs (share of rows)."
    )
    top1_outputs: list[str] | None = Field(
        None,
        description="Outputs whose top-1 is checked. None: classifier outputs, i.e. a float output named like "
        "'logits'/'probs'/'scores', or the only output when it is [batch, classes].",
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
        description="fp32 (default); int8 (cpu-ort: static QDQ or dynamic int8, the faster that meets the "
        "accuracy target); mixed (cpu-ort: int8 with the most sensitive layers kept in float until the target "
        "holds); fp16 (accelerator targets, float16 weights and arithmetic).",
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

    @field_validator("disabled_rules")
    @classmethod
    def _strip(cls, names: list[str]) -> list[str]:
        return sorted({n.strip() for n in names if n.strip()})


class RequestSpec(OptimizeOptions):
    """A whole request: the target (a built-in name, or a custom spec as an object) plus the options."""

    target: str | dict = Field(
        ..., description="Built-in target name (GET /targets) or a custom TargetSpec object."
    )

    def options(self) -> OptimizeOptions:
        return OptimizeOptions.model_validate(self.model_dump(exclude={"target"}))

    def target_spec(self):
        from flexdsa_core.targets import TargetSpec, load_target

        if isinstance(self.target, str):
            return load_target(self.target)
        return TargetSpec.model_validate(self.target)
