"""What the bench measures in ONNX Runtime: interleaved latency of many sessions, FLOPs, an SGEMM peak.

Latency. Timings of one session drift by up to 25 % between processes and over minutes, so every
session is created first and then run round-robin: each round runs every variant once, in a rotated
order, and a variant's ratio to the original is the median over rounds of its per-round ratio
(paired, so drift common to a round cancels). An A/A control, a second session of the unchanged
original, shows how large the noise is. Sessions: CPU provider, 1 intra-op and 1 inter-op thread,
sequential execution, no spinning.

FLOPs. 2·M·N·K for each MatMul and Gemm, 2·(C_in/groups)·k_h·k_w per output element for each Conv, at the
bench shapes (dims fixed, then ONNX shape inference with data propagation). Everything else is ignored:
this is the usual "GEMM FLOPs" count, good for achieved GFLOP/s, not a full op census.

Peak. A single-thread SGEMM (ONNX Runtime MatMul, 1024³, fp32) timed in the same rounds, fastest round,
as the ceiling the achieved GFLOP/s are read against.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

LEVELS = {
    "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "enable_all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}


def session(path: str, level: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = LEVELS[level]
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


# ---------------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------------

_NUMPY_DTYPE = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
}


def make_inputs(sess: ort.InferenceSession, dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for ``sess`` with symbolic dims set from ``dims``: token ids below 100 (every
    vocabulary has them), an all-ones attention mask, zero token types, standard-normal floats."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for meta in sess.get_inputs():
        shape = []
        for dim in meta.shape:
            if isinstance(dim, int):
                shape.append(dim)
            elif dim in dims:
                shape.append(dims[dim])
            else:
                raise ValueError(
                    f"input {meta.name!r} has dim {dim!r}, not one of the bench dims {sorted(dims)}"
                )
        dtype = _NUMPY_DTYPE[meta.type]
        name = meta.name.lower()
        if "mask" in name or dtype is np.bool_:
            feeds[meta.name] = np.ones(shape, dtype)
        elif np.issubdtype(dtype, np.integer):
            zeros = "token_type" in name or "segment" in name
            feeds[meta.name] = np.zeros(shape, dtype) if zeros else rng.integers(0, 100, shape).astype(dtype)
        else:
            feeds[meta.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


# ---------------------------------------------------------------------------------------------------
# Interleaved latency
# ---------------------------------------------------------------------------------------------------


@dataclass
class Timed:
    """One variant's session and its per-round wall times (seconds)."""

    key: str
    sess: ort.InferenceSession
    feeds: dict[str, np.ndarray]
    times: list[float] = field(default_factory=list)

    def run_once(self) -> float:
        start = time.perf_counter()
        self.sess.run(None, self.feeds)
        elapsed = time.perf_counter() - start
        self.times.append(elapsed)
        return elapsed


def round_robin(variants: list[Timed], rounds: int, warmup: int, progress=None) -> None:
    """Warm every session up, then run ``rounds`` rounds of every variant once, order rotated each round
    so no variant always runs first (or right after the heaviest)."""
    for _ in range(warmup):
        for variant in variants:
            variant.run_once()
    for variant in variants:
        variant.times.clear()
    count = len(variants)
    for index in range(rounds):
        shift = index % count
        for variant in variants[shift:] + variants[:shift]:
            variant.run_once()
        if progress:
            progress(index + 1, rounds)


def paired_ratio(times: list[float], reference: list[float]) -> float:
    """Median over rounds of times[i] / reference[i]."""
    return statistics.median(t / r for t, r in zip(times, reference, strict=True))


def spread(times: list[float]) -> float:
    """Interquartile range relative to the median: how noisy one variant's timings were."""
    q1, _, q3 = statistics.quantiles(times, n=4)
    return (q3 - q1) / statistics.median(times)


# ---------------------------------------------------------------------------------------------------
# FLOPs
# ---------------------------------------------------------------------------------------------------


def _fix_dims(model: onnx.ModelProto, dims: dict[str, int]) -> None:
    for value in model.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in dims:
                dim.dim_value = dims[dim.dim_param]


def _shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    shapes = {}
    for value in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = [d.dim_value for d in dims]
    for init in model.graph.initializer:
        shapes[init.name] = list(init.dims)
    return shapes


def _infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    # ONNX's own inference loses dims through exported shape arithmetic (Shape/Gather/Concat/Reshape);
    # ONNX Runtime's symbolic inference evaluates it, and with the inputs fixed every dim comes out concrete.
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

        return SymbolicShapeInference.infer_shapes(model, auto_merge=True)
    except Exception:  # noqa: BLE001 - fall back to what ONNX's inference can give
        return onnx.shape_inference.infer_shapes(model, data_prop=True)


def count_flops(path: str, dims: dict[str, int]) -> tuple[int, int]:
    """(FLOPs of MatMul/Gemm/Conv at ``dims``, number of such nodes whose shapes stayed unknown)."""
    model = onnx.load(path)
    _fix_dims(model, dims)
    model = _infer_shapes(model)
    shapes = _shapes(model)
    unknown_shapes = sum(
        1
        for node in model.graph.node
        if node.op_type in ("MatMul", "Gemm", "Conv")
        and not all(name in shapes for name in [*node.input[:2], node.output[0]])
    )
    total = 0
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm", "Conv"):
            continue
        try:
            a, b, out = shapes[node.input[0]], shapes[node.input[1]], shapes[node.output[0]]
        except KeyError:
            continue
        if node.op_type == "MatMul":
            total += 2 * int(np.prod(out)) * a[-1]
        elif node.op_type == "Gemm":
            trans_a = next((attr.i for attr in node.attribute if attr.name == "transA"), 0)
            total += 2 * int(np.prod(out)) * (a[0] if trans_a else a[1])
        else:  # Conv: weight (C_out, C_in/groups, k...)
            total += 2 * int(np.prod(out)) * int(np.prod(b[1:]))
    return total, unknown_shapes


# ---------------------------------------------------------------------------------------------------
# Single-thread SGEMM peak
# ---------------------------------------------------------------------------------------------------


def sgemm_session(size: int = 1024) -> tuple[ort.InferenceSession, dict[str, np.ndarray], int]:
    """A one-thread session of one fp32 size³ MatMul, its feeds, and its FLOPs."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["c"])],
        "sgemm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [size, size])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [size, size])],
        [
            numpy_helper.from_array(
                np.random.default_rng(1).standard_normal((size, size)).astype(np.float32), "b"
            )
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    feeds = {"a": np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)}
    return sess, feeds, 2 * size**3


def sgemm_peak(size: int = 1024, repeats: int = 15) -> dict:
    """GFLOP/s of one fp32 size³ MatMul in ONNX Runtime on one thread (fastest of ``repeats``). The bench
    also runs this session inside every model's round-robin, so each model has a peak taken under the
    same machine load as its own timings."""
    sess, feeds, flops = sgemm_session(size)
    timed = Timed("sgemm", sess, feeds)
    round_robin([timed], repeats, warmup=3)
    seconds = min(timed.times)
    return {"size": size, "seconds": seconds, "gflops": flops / seconds / 1e9}
