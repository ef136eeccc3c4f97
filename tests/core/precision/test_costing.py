"""Per-op int8 against fp32 (issue 7): a node whose int8 kernel is measured slower stays float and says so.

The decisions are a pure function of measured times, so they are tested with injected times; the profiling
and the mapping of ONNX Runtime's kernels back to layers are tested on a real quantised model, and the
pipeline's costed model is checked numerically in ONNX Runtime."""

from __future__ import annotations

import io

import numpy as np
import onnx

import flexdsa_core.precision as precision_package
from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.options import AccuracyTarget
from flexdsa_core.ort_runs import run
from flexdsa_core.precision import int8_format
from flexdsa_core.precision.costing import _OTHER, attribute, decide, profile_int8_vs_fp32, quantised_nodes
from flexdsa_core.precision.quantise import _quantize_static

ROUNDS = 12


def _rounds(ms: float, spread: float = 0.02) -> list[float]:
    """``ROUNDS`` timings around ``ms`` milliseconds, a fixed +-spread pattern (no clock, no randomness)."""
    return [ms * 1e-3 * (1 + spread * ((i % 3) - 1)) for i in range(ROUNDS)]



def _patch(monkeypatch, name: str, replacement) -> None:
    """Replace ``name`` in every module of the precision package that imported it (each looks it up in its
    own namespace), failing loudly if none did (the test would then measure nothing it injected)."""
    import importlib
    import pkgutil

    modules = [importlib.import_module(f"{precision_package.__name__}.{m.name}")
               for m in pkgutil.iter_modules(precision_package.__path__)]  # fmt: skip
    holders = [m for m in modules if hasattr(m, name)]
    assert holders, f"no precision module uses {name}"
    for module in holders:
        monkeypatch.setattr(module, name, replacement)

def test_decide_keeps_float_only_where_int8_is_measured_slower():
    timings = {
        "depthwise": (_rounds(1.0), _rounds(1.6)),  # int8 60% slower: float
        "pointwise": (_rounds(2.0), _rounds(0.8)),  # int8 faster: int8
        "reshape": (_rounds(0.010), _rounds(0.0104)),  # within noise of 10%: a tie keeps int8
        "folded": ([0.0] * ROUNDS, _rounds(0.05)),  # no fp32 kernel of its own (fused into a neighbour)
    }
    decisions = decide(timings)
    assert decisions["depthwise"].precision == "float32"
    assert decisions["depthwise"].reason.startswith("measured slower: int8 1.600 ms vs fp32 1.000 ms, ratio 1.60")
    assert decisions["pointwise"].precision == "int8" and decisions["pointwise"].reason.startswith("measured faster")
    assert decisions["reshape"].precision == "int8" and "tie keeps int8" in decisions["reshape"].reason
    assert decisions["folded"].precision == "int8" and "no kernel of its own in the fp32 model" in decisions["folded"].reason
    columns = decisions["depthwise"].columns()
    assert columns["measured"] == "slower" and columns["fp32_ms"] == 1.0 and columns["int8_ms"] == 1.6
    assert columns["int8_vs_fp32_ci"][0] > 1.1
    # Deterministic: the same measurements, in any order, give the same decisions.
    assert decide(dict(reversed(list(timings.items())))) == decisions
    assert list(decisions) == sorted(timings)


def _mlp(width: int = 256) -> bytes:
    rng = np.random.default_rng(0)
    weights = [(rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32) for _ in range(3)]
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("MatMul", ["x", "w0"], ["h0"], name="first"),
            onnx.helper.make_node("Relu", ["h0"], ["r0"], name="relu"),
            onnx.helper.make_node("MatMul", ["r0", "w1"], ["h1"], name="middle"),
            onnx.helper.make_node("MatMul", ["h1", "w2"], ["y"], name="last"),
        ],
        "mlp",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", width])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["batch", width])],
        [onnx.numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=9)
    return model.SerializeToString()


def _samples(width: int = 256, count: int = 16) -> list[dict]:
    rng = np.random.default_rng(5)
    return [{"x": rng.standard_normal((8, width)).astype(np.float32)} for _ in range(count)]


def test_profiling_maps_every_kernel_back_to_its_layer(tmp_path):
    fp32 = tmp_path / "fp32.onnx"
    fp32.write_bytes(_mlp())
    quantized = _quantize_static(
        fp32, tmp_path / "int8.onnx", _samples(), tmp_path / "ranges.json",
        int8_format(FlexDSAOptimizer("cpu-ort").target),
    )  # fmt: skip
    layers = [name for name, _ in quantised_nodes(onnx.load(quantized))]
    assert {"first", "middle", "last"} <= set(layers)
    timings = profile_int8_vs_fp32(fp32, quantized, layers, _samples()[0], tmp_path, rounds=5, warmup=1)
    for name in ("first", "middle", "last"):
        fp32_times, int8_times = timings[name]
        assert len(fp32_times) == len(int8_times) == 5
        assert all(t > 0 for t in fp32_times) and all(t > 0 for t in int8_times), name
    assert not list(tmp_path.glob("profile_*.json"))  # the profiles are read and removed


def test_attribution_of_quantise_dequantise_and_renamed_kernels():
    source = onnx.load_from_string(_mlp())
    layers = ["first", "middle", "last"]
    owners = attribute(
        ["first", "r0_QuantizeLinear", "h1_DequantizeLinear", "middle_token_3", "y_nchwc", "Shape_9"], source, layers
    )
    assert owners["first"] == "first"
    assert owners["r0_QuantizeLinear"] == "middle"  # entering int8: the quantised reader
    assert owners["h1_DequantizeLinear"] == "middle"  # leaving int8: the writer
    assert owners["middle_token_3"] == "middle"  # ONNX Runtime's layout transformer renamed it
    assert owners["y_nchwc"] == "last"  # named after its output tensor
    assert owners["Shape_9"] == _OTHER


def test_an_op_measured_slower_in_int8_stays_float_with_its_reason(monkeypatch, tmp_path):
    """Injected measurements: 'middle' is 2x slower in int8, the others faster. The costed candidate keeps
    'middle' float, the table says 'measured slower' with the times, and the model validates in ORT."""
    injected = {"first": (_rounds(1.0), _rounds(0.5)), "middle": (_rounds(1.0), _rounds(2.0)),
                "last": (_rounds(1.0), _rounds(0.5))}  # fmt: skip

    def measured(fp32, int8, layers, feed, workdir, *, rounds, warmup=3):
        return {name: injected.get(name, (_rounds(0.01), _rounds(0.01))) for name in layers}

    real_quantize, built = _quantize_static, {}

    def keep_a_copy(fp32, out, *args, **nodes):  # the real quantiser; its output kept for the checks below
        real_quantize(fp32, out, *args, **nodes)
        built[out.name] = (tmp_path / out.name).write_bytes(out.read_bytes()) and tmp_path / out.name
        return out

    _patch(monkeypatch, "profile_int8_vs_fp32", measured)
    _patch(monkeypatch, "_quantize_static", keep_a_copy)
    buffer = io.BytesIO()
    np.savez(buffer, x=np.concatenate([s["x"] for s in _samples()]))
    model = _mlp()
    result = FlexDSAOptimizer("cpu-ort").optimize(
        model, OptimizeOptions(precision="int8", accuracy=AccuracyTarget(top1_outputs=[]), latency_repeats=9),
        calibration=buffer.getvalue(),
    )  # fmt: skip
    section = result.report["precision"]
    assert section["op_costing"]["measured_slower"] == 1
    table = {row["layer"]: row for row in section["layers"]}
    assert section["layers_model"] == "static_qdq_costed"
    assert table["middle"]["precision"] == "float32"
    assert table["middle"]["reason"].startswith("kept float: measured slower: int8 2.000 ms vs fp32 1.000 ms")
    assert table["middle"]["measured"] == "slower" and table["middle"]["int8_ms"] == 2.0
    assert table["first"]["precision"] == "int8" and "measured faster" in table["first"]["reason"]
    costed = next(c for c in section["candidates"] if c["name"] == "static_qdq_costed")
    assert costed["meets_target"], costed["accuracy"]
    # The costed model itself: 'middle' reads no int8 weight, the others do; numerics against the original.
    quantized = onnx.load(built["static_costed.onnx"])
    dequantized = {n.output[0] for n in quantized.graph.node if n.op_type == "DequantizeLinear"}
    nodes = {n.name: n for n in quantized.graph.node}
    assert nodes["middle"].input[1] not in dequantized
    assert nodes["first"].input[1] in dequantized and nodes["last"].input[1] in dequantized
    feed = _samples(count=1)[0]
    want, got = run(model, feed)["y"], run(quantized.SerializeToString(), feed)["y"]
    cosine = float(want.ravel() @ got.ravel() / (np.linalg.norm(want) * np.linalg.norm(got)))
    assert cosine >= 0.99


def test_mixed_tries_the_kept_float_layers_back_by_measured_gain_and_keeps_them_only_within_the_target(monkeypatch):
    """Injected measurements make every layer of the sensitive MLP faster in int8. Mixed keeps the
    huge-range layers float by sensitivity, then tries each back in int8 for its gain: the target fails, so
    they stay float, and the search records the attempts."""
    from tests.core.test_precision import NOT_A_CLASSIFIER, _mlp_calibration, _sensitive_mlp

    def measured(fp32, int8, layers, feed, workdir, *, rounds, warmup=3):
        return {name: (_rounds(1.0), _rounds(0.5)) for name in layers}

    _patch(monkeypatch, "profile_int8_vs_fp32", measured)
    result = FlexDSAOptimizer("cpu-ort").optimize(
        _sensitive_mlp(), OptimizeOptions(precision="mixed", accuracy=NOT_A_CLASSIFIER, latency_repeats=9),
        calibration=_mlp_calibration(),
    )  # fmt: skip
    section = result.report["precision"]
    assert section["op_costing"]["measured_slower"] == 0
    search = section["search"]
    # 'widen' writes the huge-range tensor: quantised (its output too) it fails as well, so two stay float.
    assert search["keep_float"] == 2 and search["scope"] == "weight layers"
    assert [(e["layer"], e["gain_ms"], e["ok"]) for e in search["readmitted"]] == [
        ("sensitive", 0.5, False), ("widen", 0.5, False)  # equal gains: in sensitivity order
    ]
    assert all(e["loss"] > 0.01 for e in search["readmitted"])
    table = {row["layer"]: row for row in section["layers"]}
    assert table["sensitive"]["precision"] == "float32" and "kept float: rank 1" in table["sensitive"]["reason"]
    assert table["first"]["precision"] == "int8" and "measured faster" in table["first"]["reason"]
    assert next(c for c in section["candidates"] if c["name"] == "mixed")["meets_target"]
