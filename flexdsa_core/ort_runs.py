"""ONNX Runtime runs for validation and timing: comparing an optimised model with the original, and CPU latency.

``compare`` runs the original and an optimised model on the same seeded inputs and checks every output
element with ``|got - want| <= atol + rtol * |want|`` (numpy ``allclose`` semantics) against per-dtype
tolerances; integer and bool outputs must match exactly. Both run at ORT_DISABLE_ALL so that only our
rewrites are under test, not ONNX Runtime's own fusions.

``measure_latency`` times several models interleaved, round-robin in one process (timings drift between
processes and over time, so every round runs every model once and the medians are compared).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from flexdsa_core.dims import is_batch_dim
from flexdsa_core.errors import RunBudgetExceededError, UnsupportedModelError, ValidationFailedError
from flexdsa_core.in_memory import InMemoryModel

ModelSource = bytes | str | Path

# (atol, rtol) per output dtype. fp32 leaves room for re-association inside fused kernels
# (LayerNorm/GELU/attention compute in a different order than the decomposed graph).
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float32": (1e-4, 1e-3),
    "float64": (1e-7, 1e-6),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}
# Symbolic dims take these values during validation unless a bucket fixes them.
DEFAULT_VALIDATION_DIMS = {"batch": 2}
DEFAULT_OTHER_DIM = 8


def second_shape_dims(at: dict[str, int]) -> dict[str, int]:
    """The second, small validation shape of a bucket whose dims stay symbolic (at ``at``): batch dims
    (``dims.is_batch_dim``) at 2, others at ``DEFAULT_OTHER_DIM``, except that a dim the bucket holds at 1
    goes to 2 at most: a batch ONNX does not name (tf2onnx's ``unk__``) went to 8, so magika's second run
    took 8x its bucket's activations, the one run of the job above them. Still a shape other than the
    bucket's."""
    dims = {}
    for name, value in at.items():
        default = DEFAULT_VALIDATION_DIMS["batch"] if is_batch_dim(name) else DEFAULT_OTHER_DIM
        dims[name] = min(default, 2) if value == 1 else default
    return dims
# Elements compared per slice (``_check_output``).
_CHECK_SLICE = 1 << 16
# Random inputs past this size are a hostile or mistyped shape, not something to allocate.
MAX_INPUT_BYTES = 1 << 30
# Every ONNX Runtime run of the pipeline stops after this many seconds unless the caller sets another budget
# (``OptimizeOptions.run_budget_s``, applied with ``run_budget``): no model may hold a worker for longer.
DEFAULT_RUN_BUDGET_S = 120.0
_run_budget: contextvars.ContextVar[tuple[float, str]] = contextvars.ContextVar(
    "run_budget", default=(DEFAULT_RUN_BUDGET_S, "")
)


@contextlib.contextmanager
def run_budget(seconds: float, hint: str = "") -> Iterator[None]:
    """Within this block every ``guarded_run`` stops after ``seconds``; ``hint`` says what to change."""
    token = _run_budget.set((float(seconds), hint))
    try:
        yield
    finally:
        _run_budget.reset(token)


@contextlib.contextmanager
def watchdog(what: str) -> Iterator[ort.RunOptions]:
    """Run options that ONNX Runtime itself aborts on (``RunOptions.terminate``, checked between kernels and
    inside Loop/Scan bodies) once the current budget has passed, for every run made with them inside this
    block; a run so stopped raises ``RunBudgetExceededError``, an allocation no host can make
    ``UnsupportedModelError``. One timer for the whole block, so timed runs pay nothing for it."""
    budget_s, hint = _run_budget.get()
    run_options = ort.RunOptions()
    timer = threading.Timer(budget_s, setattr, (run_options, "terminate", True))
    timer.daemon = True
    timer.start()
    try:
        yield run_options
    except Exception as err:
        if "Failed to allocate memory" in str(err):  # a shape no host can hold: the model's, not ours
            raise UnsupportedModelError(
                f"{what}: ONNX Runtime could not allocate a tensor of this model on these inputs "
                f"({str(err).rsplit('Failed to allocate memory', 1)[-1].strip()[:120]}). Give smaller "
                "input_shapes / shape_buckets, or check the model's shape inputs.",
                details={"what": what},
            ) from None
        if run_options.terminate:
            raise RunBudgetExceededError(
                f"{what} ran past its {budget_s:.0f} s budget in ONNX Runtime (a Loop or Scan with a huge trip "
                "count, or shapes far larger than intended, can do that). "
                + (hint or "Give smaller input_shapes / shape_buckets, raise run_budget_s, or set "
                   "validate_outputs=false and measure_latency=false."),
                details={"budget_s": budget_s, "what": what},
            ) from None
        raise
    finally:
        timer.cancel()


def guarded_run(sess, names, feeds: dict, *, what: str):
    """One ``sess.run`` under the current budget (``watchdog``)."""
    with watchdog(what) as run_options:
        return sess.run(names, feeds, run_options)


def owned(value):
    """``value`` in memory of its own. ONNX Runtime's outputs are numpy views of its allocator's memory: one
    output kept (a reference output, a sample's result) keeps every chunk the session's arena grew to alive
    after the session is gone (magika at batch 8: a 40 MiB chunk per kept run). A copy holds only its bytes;
    the values are the same."""
    if isinstance(value, np.ndarray) and value.base is not None:
        return value.copy()
    return value


@dataclass
class OutputCheck:
    name: str
    dtype: str
    shape: list[int]
    max_abs: float
    max_rel: float
    atol: float
    rtol: float
    ok: bool
    detail: str = ""

    def as_dict(self) -> dict:
        return {k: (round(v, 9) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


@dataclass
class ValidationResult:
    bucket: str
    ok: bool
    outputs: list[OutputCheck] = field(default_factory=list)
    input_shapes: dict[str, list[int]] = field(default_factory=dict)
    # Dims left symbolic are checked at a second, small shape too: that check (its ``ok`` is in this one's).
    second_shape: ValidationResult | None = None

    def as_dict(self) -> dict:
        found = {
            "bucket": self.bucket,
            "ok": self.ok,
            "input_shapes": self.input_shapes,
            "outputs": [o.as_dict() for o in self.outputs],
        }
        if self.second_shape is not None:
            second = self.second_shape.as_dict()
            del second["bucket"]
            found["second_shape"] = second
        return found

    def describe_failure(self) -> str:
        bad = [o for o in self.outputs if not o.ok]
        text = "; ".join(
            f"output {o.name!r}: {o.detail or f'max abs err {o.max_abs:.3g} (atol {o.atol:g}), max rel err {o.max_rel:.3g} (rtol {o.rtol:g})'}"
            for o in bad
        )
        if self.second_shape is not None and not self.second_shape.ok:
            second = f"at the second shape {self.second_shape.input_shapes}: {self.second_shape.describe_failure()}"
            text = f"{text}; {second}" if text else second
        return text


def session(
    model: ModelSource | InMemoryModel, *, level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL, threads: int = 1
):
    """A CPU session: of a file, of bytes, or of an ``InMemoryModel`` (weights read where they are)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    if isinstance(model, InMemoryModel):
        return model.session(options)
    source = str(model) if isinstance(model, Path) else model
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _gather_vocab_sizes(model: onnx.ModelProto) -> dict[str, int]:
    """Integer inputs used as Gather indices: the table's first dim bounds their values (token ids)."""
    sizes = {init.name: list(init.dims) for init in model.graph.initializer}
    bounds: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type == "Gather" and len(node.input) == 2 and node.input[0] in sizes:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            dims = sizes[node.input[0]]
            if dims and axis == 0:
                previous = bounds.get(node.input[1], dims[0])
                bounds[node.input[1]] = min(previous, dims[0])
    return bounds


def proto_without_weights(model: ir.Model) -> onnx.ModelProto:
    """The graph's inputs and Gather tables' shapes, enough to build validation inputs, without copying weights."""
    proto = onnx.ModelProto()
    graph = proto.graph
    for value in model.graph.inputs:
        graph.input.append(ir.serde.serialize_value(value))
    for name, init in model.graph.initializers.items():
        tensor = graph.initializer.add()
        tensor.name = name
        if init.shape is not None:
            tensor.dims.extend(int(d) for d in init.shape)
    for node in model.graph:
        if node.op_type == "Gather" and node.domain == "":
            copy = graph.node.add()
            copy.op_type = "Gather"
            copy.input.extend(v.name if v is not None else "" for v in node.inputs)
            axis = node.attributes.get("axis")
            if axis is not None:
                copy.attribute.append(onnx.helper.make_attribute("axis", axis.as_int()))
    return proto


def make_inputs(
    model: onnx.ModelProto, *, seed: int = 0, dims: dict[str, int] | None = None
) -> dict[str, np.ndarray]:
    """Seeded random inputs: normal floats, token ids within the embedding table for index inputs, ones
    for integer masks, small non-negative integers otherwise. ``model`` may be loaded without weights."""
    dims = {**DEFAULT_VALIDATION_DIMS, **(dims or {})}
    rng = np.random.default_rng(seed)
    initializers = {init.name for init in model.graph.initializer}
    vocab = _gather_vocab_sizes(model)
    feeds: dict[str, np.ndarray] = {}
    total_bytes = 0
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor_type = value.type.tensor_type
        shape = []
        for dim in tensor_type.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value > 0:
                shape.append(dim.dim_value)
            else:
                name = dim.dim_param
                shape.append(
                    dims.get(name, next((v for k, v in dims.items() if k in name.lower()), DEFAULT_OTHER_DIM))
                )
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        total_bytes += math.prod(shape) * np.dtype(dtype).itemsize
        if total_bytes > MAX_INPUT_BYTES:
            raise UnsupportedModelError(
                f"Validation would need {total_bytes / 1e9:.1f} GB of inputs (input {value.name!r} has shape "
                f"{shape}). Give smaller shapes with shape_buckets or input_shapes, or set validate_outputs=false.",
                details={"input": value.name, "shape": shape},
            )
        if dtype == np.bool_:
            feeds[value.name] = rng.integers(0, 2, size=shape).astype(bool)
        elif np.issubdtype(dtype, np.integer):
            if value.name in vocab:
                feeds[value.name] = rng.integers(0, vocab[value.name], size=shape).astype(dtype)
            elif "mask" in value.name.lower():
                feeds[value.name] = np.ones(shape, dtype=dtype)
            else:
                feeds[value.name] = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _check_output(name, want: np.ndarray, got: np.ndarray, tolerances) -> OutputCheck:
    def result(
        max_abs: float, max_rel: float, atol: float, rtol: float, ok: bool, detail: str = ""
    ) -> OutputCheck:
        return OutputCheck(name, str(want.dtype), list(want.shape), max_abs, max_rel, atol, rtol, ok, detail)

    inf = float("inf")
    if want.shape != got.shape:
        return result(inf, inf, 0, 0, False, f"shape {list(got.shape)} instead of {list(want.shape)}")
    if not np.issubdtype(want.dtype, np.floating):
        mismatches = int(np.count_nonzero(want != got))
        detail = f"{mismatches} of {want.size} values differ (exact match required)" if mismatches else ""
        return result(float(mismatches), 0.0, 0, 0, mismatches == 0, detail)
    atol, rtol = tolerances.get(str(want.dtype), DEFAULT_TOLERANCES.get(str(want.dtype), (1e-4, 1e-3)))
    # In float64, a slice at a time: the same figures as on the whole arrays, but the temporaries stay in
    # cache (GPT-2's [1, 128, 50257] logits took 0.4 s a check as whole float64 copies, 0.1 s so).
    want_flat, got_flat = want.reshape(-1), got.reshape(-1)
    max_abs = max_rel = 0.0
    ok = True
    for start in range(0, want_flat.size, _CHECK_SLICE):
        w = want_flat[start : start + _CHECK_SLICE].astype(np.float64)
        g = got_flat[start : start + _CHECK_SLICE].astype(np.float64)
        finite = np.isfinite(w)
        if not (finite == np.isfinite(g)).all():
            return result(
                inf,
                inf,
                atol,
                rtol,
                False,
                "non-finite values (NaN/inf) appear where the original has none, or vice versa",
            )
        if not finite.all():
            w, g = w[finite], g[finite]
        if not w.size:
            continue
        diff = np.abs(w - g)
        magnitude = np.abs(w)
        max_abs = max(max_abs, float(diff.max()))
        max_rel = max(max_rel, float((diff / np.maximum(magnitude, 1e-12)).max()))
        ok = ok and bool(np.all(diff <= atol + rtol * magnitude))
    return result(max_abs, max_rel, atol, rtol, ok)


def run(
    model: ModelSource | InMemoryModel | ort.InferenceSession,
    feeds: dict[str, np.ndarray],
    *,
    what: str = "validation",
) -> dict[str, np.ndarray]:
    """``model``'s outputs on ``feeds`` at ORT_DISABLE_ALL; a session already made for it (``session``) is
    used as it is, so that one model checked at two shapes is loaded once."""
    sess = model if isinstance(model, ort.InferenceSession) else session(model)
    names = [o.name for o in sess.get_outputs()]
    outputs = guarded_run(sess, names, feeds, what=what)
    return {name: owned(value) for name, value in zip(names, outputs, strict=True)}


def compare(
    original: ModelSource | InMemoryModel | ort.InferenceSession,
    optimized: ModelSource | InMemoryModel | ort.InferenceSession,
    feeds: dict[str, np.ndarray],
    *,
    bucket: str = "dynamic",
    tolerances: dict[str, tuple[float, float]] | None = None,
    reference: dict[str, np.ndarray] | None = None,
) -> ValidationResult:
    """Compare every output of ``optimized`` with ``original`` (or precomputed ``reference`` outputs)."""
    tolerances = tolerances or {}
    want = reference if reference is not None else run(original, feeds)
    try:
        got = run(optimized, feeds)
    except Exception as err:  # ONNX Runtime rejecting our output is a validation failure, with its words
        raise ValidationFailedError(
            f"ONNX Runtime cannot run the optimised model (bucket {bucket}): {err}"
        ) from err
    checks = []
    for name, value in want.items():
        if name not in got:
            checks.append(
                OutputCheck(
                    name,
                    str(value.dtype),
                    list(value.shape),
                    float("inf"),
                    float("inf"),
                    0,
                    0,
                    False,
                    "output missing from the optimised model",
                )
            )
            continue
        checks.append(_check_output(name, value, got[name], tolerances))
    return ValidationResult(
        bucket=bucket,
        ok=all(c.ok for c in checks),
        outputs=checks,
        input_shapes={k: list(v.shape) for k, v in feeds.items()},
    )


def measure_latency(
    models: dict[str, ModelSource],
    feeds: dict[str, np.ndarray],
    *,
    repeats: int = 20,
    warmup: int = 3,
    level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    threads: int = 1,
    max_seconds: float = 30.0,
    interleave: bool = True,
) -> dict[str, float]:
    """Median seconds per run for each model (``latency_samples``' medians)."""
    samples = latency_samples(
        models, feeds, repeats=repeats, warmup=warmup, level=level, threads=threads,
        max_seconds=max_seconds, interleave=interleave,
    )  # fmt: skip
    return {name: statistics.median(values) for name, values in samples.items()}


def latency_samples(
    models: dict[str, ModelSource],
    feeds: dict[str, np.ndarray],
    *,
    repeats: int = 20,
    warmup: int = 3,
    level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    threads: int = 1,
    max_seconds: float = 30.0,
    interleave: bool = True,
) -> dict[str, list[float]]:
    """Seconds of each run of each model, measured interleaved (round-robin) in this process: the i-th
    sample of every model comes from the same round, so they can be compared pairwise.

    ``interleave=False`` measures one model at a time and frees its session first: for models whose
    weights would not fit in memory twice (more drift between the figures, said in the report)."""
    if not interleave:
        samples = {}
        for name, source in models.items():
            samples.update(
                latency_samples(
                    {name: source},
                    feeds,
                    repeats=repeats,
                    warmup=warmup,
                    level=level,
                    threads=threads,
                    max_seconds=max_seconds / len(models),
                )  # fmt: skip
            )
        rounds = min(len(values) for values in samples.values())
        return {name: values[:rounds] for name, values in samples.items()}
    rounds = LatencyRounds(models, feeds, warmup=warmup, level=level, threads=threads)
    return rounds.more(repeats, max_seconds=max_seconds)


class LatencyRounds:
    """The models loaded once and timed in interleaved rounds on demand: ``more(n)`` adds n rounds to
    ``samples``, the i-th sample of every model from the same round. A measurement that needs more rounds
    to settle goes on in the same sessions (no second load, no second warm-up)."""

    def __init__(
        self,
        models: dict[str, ModelSource | InMemoryModel],
        feeds: dict[str, np.ndarray],
        *,
        warmup: int = 3,
        level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
        threads: int = 1,
    ) -> None:
        """``models``: each a file, bytes or an ``InMemoryModel`` (its weights read from memory)."""
        sessions = {name: session(source, level=level, threads=threads) for name, source in models.items()}
        self.sessions = sessions
        self.feeds = feeds
        self.samples: dict[str, list[float]] = {name: [] for name in sessions}
        with watchdog("latency measurement") as run_options:
            for sess in sessions.values():
                for _ in range(warmup):
                    sess.run(None, feeds, run_options)

    @property
    def rounds(self) -> int:
        return min((len(values) for values in self.samples.values()), default=0)

    def more(self, repeats: int, *, max_seconds: float = 30.0) -> dict[str, list[float]]:
        with watchdog("latency measurement") as run_options:  # one budget for the whole measurement
            deadline = time.perf_counter() + max_seconds
            order = list(self.sessions.items())
            for _ in range(repeats):
                # Alternating order: neither model always runs first (caches warm, clocks ramp up in between).
                for name, sess in order if self.rounds % 2 == 0 else reversed(order):
                    start = time.perf_counter()
                    sess.run(None, self.feeds, run_options)
                    self.samples[name].append(time.perf_counter() - start)
                if time.perf_counter() > deadline and self.rounds >= 5:
                    break
        return self.samples
