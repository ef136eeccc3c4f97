"""Timing ONNX Runtime kernels on this machine: the pieces the cost model measures with.

A kernel is one node cut out into a one-node model (``_single_node_model``), run in a one-thread session
with its inputs and outputs bound once (``bound_runner``: only the kernel and ORT's dispatch are timed)
on random inputs placed on a 64-byte boundary (``_aligned``). A run is timed in CPU time of the calling
thread (``timed``); a figure is the median of the faster half of the runs (``steady``), less the same
figure for an empty run (``empty_runner``) timed beside it: a kernel alone with ``time_beside_empty``,
a side-by-side comparison in its own rounds (the fixed cost of a run moves with the machine's state, so a
figure of it from another time is not taken off). Measurements are keyed by ``machine_fingerprint`` (the CPU
and the vector extensions ONNX Runtime's kernels choose code paths by) and rooflines of unmeasurable
kernels use this host's SGEMM peak and copy bandwidth (``measure_sgemm_peak``, ``host_rates``).
"""

from __future__ import annotations

import functools
import math
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from flexdsa_core.in_memory import EXTERNAL_MIN_BYTES, declare, session_with
from flexdsa_core.op_costs import TensorInfo

# The timing pieces the cost model (and the precision cache) measure with.
__all__ = [
    "LEVELS",
    "ProbeTooLarge",
    "Timer",
    "bound_runner",
    "empty_runner",
    "host_rates",
    "machine_fingerprint",
    "measure_sgemm_peak",
    "random_array",
    "session_options",
    "single_node_session",
    "steady",
    "thread_empty_runner",
    "time_beside_empty",
    "timed",
]


def session_options(level: ort.GraphOptimizationLevel) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = level
    options.log_severity_level = 4  # a probe that fails is expected (and noted); keep stderr quiet
    return options


LEVELS = {
    "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


class ProbeTooLarge(Exception):
    """A probe input past ``_PROBE_INPUT_BUDGET_BYTES``: estimate instead of allocating it."""


# One probe input above this is a hostile or mistyped shape (or a huge layer): it is estimated, not run.
_PROBE_INPUT_BUDGET_BYTES = 256 * 1024 * 1024


# Random values drawn per probe input at most; a larger input repeats them (a 154 MB LM-head operand took
# 0.4 s to draw whole). Kernel time does not depend on which positive values a float tensor holds.
_RANDOM_BLOCK = 1 << 16


def random_array(shape: Sequence[int], dtype: str, rng: np.random.Generator) -> np.ndarray:
    np_dtype = np.dtype(dtype)
    if math.prod(shape) * np_dtype.itemsize > _PROBE_INPUT_BUDGET_BYTES:
        raise ProbeTooLarge(f"probe input of shape {list(shape)} is over the budget")
    out = _aligned_empty(tuple(shape), np_dtype)
    if np_dtype.kind == "f":
        # Positive and away from zero: no NaN from Log/Sqrt/Div, no denormals to slow anything down.
        flat = out.reshape(-1)
        block = rng.uniform(0.5, 1.5, size=min(flat.size, _RANDOM_BLOCK)).astype(np_dtype)
        for start in range(0, flat.size, block.size):
            flat[start : start + block.size] = block[: flat.size - start]
    else:
        # Integers feed indices, masks and lengths: zeros are in range for all of them.
        out[...] = 0
    return out


ALIGNMENT = 64  # bytes: a cache line, and what ONNX Runtime's own allocator gives its tensors


def _aligned_empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    buffer = np.empty(math.prod(shape) * dtype.itemsize + ALIGNMENT, dtype=np.uint8)
    offset = (-buffer.ctypes.data) % ALIGNMENT
    return buffer[offset : offset + math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)


def _aligned(array: np.ndarray) -> np.ndarray:
    """A copy of ``array`` starting on a 64-byte boundary. ONNX Runtime reads bound inputs where they lie,
    and numpy only promises 16 bytes: vector kernels then ran at one of two speeds depending on where the
    allocator happened to put the input, and a decision could follow that (seen: SkipLayerNormalization
    measured 1.05x or 1.5x the unfused pair in two cold runs of the same model)."""
    aligned = _aligned_empty(array.shape, array.dtype)
    aligned[...] = array
    return aligned


def bound_runner(session: ort.InferenceSession, feeds: Mapping[str, np.ndarray]) -> Callable[[], None]:
    """One run of the session with inputs and outputs bound once, so that only the kernel (and ORT's
    dispatch) is timed, never allocation or copies."""
    binding = session.io_binding()
    for name, array in feeds.items():
        binding.bind_cpu_input(name, array)
    for output in session.get_outputs():
        binding.bind_output(output.name)
    session.run_with_iobinding(binding)  # warm-up; ORT allocates the outputs
    for output, value in zip(session.get_outputs(), binding.get_outputs(), strict=True):
        binding.bind_ortvalue_output(output.name, value)  # reuse them: no allocation inside the timing
    return lambda: session.run_with_iobinding(binding)


def _time_session(
    session: ort.InferenceSession, feeds: Mapping[str, np.ndarray], budget_s: float
) -> list[float]:
    return _time_runner(bound_runner(session, feeds), budget_s)


Timer = Callable[[Callable[[], object]], float]


def _time_runner(run: Callable[[], None], budget_s: float, timer: Timer | None = None) -> list[float]:
    """Seconds per run: at least 5 runs, as many as fit the budget (at most 50); a kernel slower than
    the budget runs twice."""
    return time_beside_empty(run, None, budget_s, timer)[0]


def time_beside_empty(
    run: Callable[[], None], empty: Callable[[], None] | None, budget_s: float, timer: Timer | None = None
) -> tuple[list[float], list[float]]:
    """``_time_runner``'s runs and, when ``empty`` is given, the empty run timed beside every run
    (alternating which goes first): the kernel's seconds and the fixed cost of a run from the same moments,
    since that cost moves with the machine's state (issue 8)."""
    timer = timer or timed
    warm = timer(run)
    if empty is not None:
        timer(empty)
    least = 5 if warm < budget_s / 5 else 2
    runs: list[float] = []
    empties: list[float] = []
    started = time.perf_counter()
    while len(runs) < least or (len(runs) < 50 and time.perf_counter() - started < budget_s):
        empty_first = empty is not None and len(runs) % 2 == 1
        if empty_first:
            empties.append(timer(empty))
        runs.append(timer(run))
        if empty is not None and not empty_first:
            empties.append(timer(empty))
    return runs, empties


_per_thread = threading.local()


def thread_empty_runner() -> Callable[[], None]:
    """This thread's empty runner (``empty_runner``), made once per thread: no binding is shared."""
    runner = getattr(_per_thread, "empty", None)
    if runner is None:
        runner = _per_thread.empty = empty_runner()
    return runner


def _single_node_model(
    node_proto: onnx.NodeProto,
    inputs: Sequence[tuple[str, TensorInfo | None, np.ndarray | ir.TensorProtocol | None]],
    outputs: Sequence[str],
    opsets: Mapping[str, int],
    weights: dict | None = None,
) -> onnx.ModelProto:
    """The node as a model, its constant inputs as initializers; with ``weights`` given, the large ones are
    declared in memory and put there (``in_memory.session_with`` hands them to ONNX Runtime)."""
    graph_inputs, initializers = [], []
    for name, info, constant in inputs:
        if info is None or not name:
            continue
        if constant is not None and weights is not None and _nbytes(constant) >= EXTERNAL_MIN_BYTES:
            weights[name] = constant
            initializers.append(declare(name, _dtype_of(constant), constant.shape))
        elif constant is not None:
            array = constant if isinstance(constant, np.ndarray) else constant.numpy()
            initializers.append(onnx.numpy_helper.from_array(np.asarray(array), name))
        else:
            elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype))
            graph_inputs.append(onnx.helper.make_tensor_value_info(name, elem, list(info.shape)))
    graph_outputs = []
    for name in outputs:
        value_info = onnx.ValueInfoProto()
        value_info.name = name
        graph_outputs.append(value_info)
    graph = onnx.helper.make_graph([node_proto], "kernel", graph_inputs, graph_outputs, initializers)
    opset_ids = [onnx.helper.make_opsetid(domain, version) for domain, version in opsets.items()]
    return onnx.helper.make_model(graph, opset_imports=opset_ids, ir_version=10)


def single_node_session(
    node_proto: onnx.NodeProto,
    inputs: Sequence[tuple[str, TensorInfo | None, np.ndarray | ir.TensorProtocol | None]],
    outputs: Sequence[str],
    opsets: Mapping[str, int],
    level: ort.GraphOptimizationLevel,
) -> ort.InferenceSession:
    """A one-thread session of the node alone (``_single_node_model``), its large constants read from memory:
    through a protobuf a 154 MB weight cost 1.1-1.3 s a session (several copies), in memory one."""
    weights: dict = {}
    model = _single_node_model(node_proto, inputs, outputs, opsets, weights)
    return session_with(model, weights, session_options(level))


def _nbytes(constant) -> int:
    return int(constant.nbytes)


def _dtype_of(constant) -> np.dtype:
    return constant.dtype if isinstance(constant, np.ndarray) else constant.dtype.numpy()


def steady(runs: Sequence[float]) -> float:
    """The median of the faster half of the runs (their lower quartile)."""
    ordered = sorted(runs)
    return statistics.median(ordered[: max(1, (len(ordered) + 1) // 2)])


def empty_runner() -> Callable[[], None]:
    """A run that does nothing (Identity on one float), bound and warmed up: the fixed cost of ``run``.
    A fresh one each call (a few ms), so that no two threads share one binding."""
    node = onnx.helper.make_node("Identity", ["x"], ["y"])
    info = TensorInfo((1,), "float32")
    session = single_node_session(node, [("x", info, None)], ["y"], {"": 17}, LEVELS["basic"])
    return bound_runner(session, {"x": np.ones(1, np.float32)})


# The instruction-set extensions ONNX Runtime's CPU kernels (MLAS) pick code paths by. Two CPUs with the same
# name and core count can differ in these (two "AMD EPYC" machines, one with AVX-512 VNNI, one AVX2 only:
# int8 BERT-base ran 2.98x faster than fp32 on the first, 1.8x on the second), so they are part of the fingerprint; flags no kernel looks at are left out so they cannot split the cache.
# x86 names as /proc/cpuinfo "flags" spells them; ARM as its "Features" line does (asimddp = dot product).
_KERNEL_ISA_FLAGS = frozenset(
    {"sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq", "avx512vl",
     "avx512cd", "avx512_vnni", "avx512vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "avx_vnni_int8",
     "avx_ne_convert", "amx_tile", "amx_int8", "amx_bf16", "amx_fp16", "amx_complex",
     "neon", "asimd", "asimdhp", "asimddp", "dotprod", "fphp", "sve", "sve2", "i8mm", "svei8mm", "bf16",
     "svebf16", "sme"}
)  # fmt: skip


@functools.cache
def _machine_fingerprint(cpuinfo: str | None = None) -> str:
    """Measurements belong to this CPU: a shared cache must not hand them to a different machine.

    ``platform/arch/model name/cores/isa=<kernel-relevant flags, sorted>``, read from ``cpuinfo`` (the text
    of /proc/cpuinfo; read from there when None, never from the environment)."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as source:
                cpuinfo = source.read()
        except OSError:
            cpuinfo = ""
    model_name, flags = "", None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key == "model name" and not model_name:
            model_name = value.strip()
        elif key in ("flags", "features") and flags is None:  # the first CPU's; x86 "flags", ARM "Features"
            flags = set(value.split()) & _KERNEL_ISA_FLAGS
    model_name = model_name or platform.processor() or ""
    isa = ",".join(sorted(flags)) if flags else "unknown"
    return f"{platform.system()}/{platform.machine()}/{model_name}/{os.cpu_count()}/isa={isa}"


def machine_fingerprint() -> str:
    """This machine's fingerprint (``_machine_fingerprint``): what a measurement here is only valid for."""
    return _machine_fingerprint()


def measure_sgemm_peak(seconds: float = 1.0, *, size: int = 1024) -> float:
    """Single-thread fp32 GEMM throughput of this machine in FLOP/s: ONNX Runtime MatMul of two
    ``size`` x ``size`` matrices (B constant, as a weight is), the best run within ``seconds``."""
    rng = np.random.default_rng(0)
    node = onnx.helper.make_node("MatMul", ["a", "b"], ["y"])
    a_info = TensorInfo((size, size), "float32")
    weight = rng.standard_normal((size, size)).astype(np.float32)
    session = single_node_session(
        node, [("a", a_info, None), ("b", a_info, weight)], ["y"], {"": 17}, LEVELS["basic"]
    )
    runs = _time_session(session, {"a": rng.standard_normal((size, size)).astype(np.float32)}, seconds)
    return 2.0 * size**3 / min(runs)


@functools.cache
def host_rates() -> tuple[float, float]:
    """(FLOP/s, bytes/s) of this host on one thread, for kernels that cannot be measured alone."""
    peak = measure_sgemm_peak(0.2, size=512)
    source = np.ones(8 * 1024 * 1024, dtype=np.float32)
    target = np.empty_like(source)
    best = min(timed(lambda: np.copyto(target, source)) for _ in range(5))
    return peak, 2 * source.nbytes / best


def timed(function: Callable[[], object]) -> float:
    """CPU seconds of this thread spent in ``function``. A one-thread ONNX Runtime session runs its
    kernels on the calling thread, so this is the kernel's time; unlike wall time it does not include
    the time the thread sat preempted on a busy shared machine (a 2 ms MatMul read 22 ms of wall time
    under load, 2.1 ms of thread time)."""
    tick = time.thread_time()
    function()
    return time.thread_time() - tick
