"""Per-op int8 against fp32 figures in the kernel cache (issues 7 and 8): a compile whose layers were all
measured before on this machine does not profile; the figures are shared by identical layers, never across
CPUs whose vector extensions differ or across int8 formats. Real ONNX Runtime profiles throughout; the
profiles are counted by ``precision.costing.PROFILES``, which ``profile_int8_vs_fp32`` itself increments."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions, load_target
from flexdsa_core.cache import LRUCache
from flexdsa_core.kernel_timing import _machine_fingerprint
from flexdsa_core.precision import Int8Format, int8_format
from flexdsa_core.precision.cache import (
    CACHED,
    MEASURED,
    CostingScope,
    cached_profile,
    layer_signatures,
    timing_keys,
)
from flexdsa_core.precision.costing import PROFILES, decide, profile_int8_vs_fp32, quantised_nodes
from flexdsa_core.precision.quantise import _quantize_static
from tests.core.test_precision import _clear_images, _npz
from tests.models import fixture

ROUNDS = 9
WIDTH = 64
CPUINFO = "model name\t: AMD EPYC\nflags\t\t: fpu sse4_1 sse4_2 avx avx2 fma f16c\n"


def _chain(width: int = WIDTH) -> bytes:
    """x -> MatMul -> Relu, four times, square weights: the second and third MatMul sit in the same
    surroundings (two steps each way) at the same shapes; the first reads the graph input, the last's Relu
    writes the output."""
    rng = np.random.default_rng(0)
    nodes, weights, current = [], [], "x"
    for index in range(4):
        weights.append(onnx.numpy_helper.from_array(
            (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32), f"w{index}"
        ))  # fmt: skip
        nodes.append(
            onnx.helper.make_node("MatMul", [current, f"w{index}"], [f"h{index}"], name=f"matmul{index}")
        )
        nodes.append(onnx.helper.make_node("Relu", [f"h{index}"], [f"r{index}"], name=f"relu{index}"))
        current = f"r{index}"
    graph = onnx.helper.make_graph(
        nodes, "chain",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", width])],
        [onnx.helper.make_tensor_value_info(current, onnx.TensorProto.FLOAT, ["batch", width])], weights,
    )  # fmt: skip
    return onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=9
    ).SerializeToString()


def _feed(count: int = 8) -> list[dict]:
    rng = np.random.default_rng(3)
    return [{"x": rng.standard_normal((4, WIDTH)).astype(np.float32)} for _ in range(count)]


def _quantised(tmp_path: Path, fmt: Int8Format, name: str = "int8") -> tuple[Path, Path, list[str]]:
    fp32 = tmp_path / "fp32.onnx"
    fp32.write_bytes(_chain())
    int8 = _quantize_static(fp32, tmp_path / f"{name}.onnx", _feed(), tmp_path / f"{name}_ranges.json", fmt)
    return fp32, int8, [n for n, _ in quantised_nodes(onnx.load(int8))]


def _cpu_format() -> Int8Format:
    return int8_format(FlexDSAOptimizer("cpu-ort").target)


def _scope(fmt: Int8Format, machine: str | None = None) -> CostingScope:
    return CostingScope(
        fmt.as_dict(), ROUNDS, 1, load_target("cpu-ort"), "test", machine or _machine_fingerprint(CPUINFO)
    )


def _costed(fp32, int8, layers, tmp_path, cache, scope):
    return cached_profile(
        fp32, int8, layers, _feed()[0], tmp_path, cache=cache, scope=scope, profile=profile_int8_vs_fp32
    )


def test_identical_layers_share_one_figure_and_a_warm_run_does_not_profile(tmp_path):
    fp32, int8, layers = _quantised(tmp_path, _cpu_format())
    assert {"matmul1", "matmul2"} <= set(layers)
    cache, scope = LRUCache(), _scope(_cpu_format())
    before = PROFILES["int8_vs_fp32"]
    timings, sources = _costed(fp32, int8, layers, tmp_path, cache, scope)
    assert PROFILES["int8_vs_fp32"] == before + 1
    # matmul2 is matmul1 again (same shapes, format and surroundings): one figure, labelled as such.
    assert sources["matmul1"] == MEASURED and sources["matmul2"] == f"{MEASURED}: identical to matmul1"
    assert timings["matmul2"] == timings["matmul1"]
    # The ends differ in their surroundings: matmul0 reads the graph input, matmul3's Relu writes the output.
    assert sources["matmul0"] == sources["matmul3"] == MEASURED
    assert all(len(fp32_s) == len(int8_s) == ROUNDS for fp32_s, int8_s in timings.values())

    again, again_sources = _costed(fp32, int8, layers, tmp_path, cache, scope)
    assert PROFILES["int8_vs_fp32"] == before + 1  # every figure from the cache: no profile
    assert set(again_sources.values()) == {CACHED}
    assert again == timings and decide(again) == decide(timings)


def test_a_partial_hit_profiles_keeps_the_cached_figures_and_stores_the_misses(tmp_path):
    fp32, int8, layers = _quantised(tmp_path, _cpu_format())
    scope, full = _scope(_cpu_format()), LRUCache()
    timings, _ = _costed(fp32, int8, layers, tmp_path, full, scope)
    keys = timing_keys(layer_signatures(onnx.load(fp32), onnx.load(int8), layers, _feed()[0]), scope)
    partial = LRUCache()
    for layer, key in keys.items():
        if layer != "matmul0":
            partial.put(key, full.get(key))
    before = PROFILES["int8_vs_fp32"]
    mixed, sources = _costed(fp32, int8, layers, tmp_path, partial, scope)
    assert PROFILES["int8_vs_fp32"] == before + 1
    assert sources["matmul0"] == MEASURED and all(sources[n] == CACHED for n in layers if n != "matmul0")
    assert all(
        mixed[n] == timings[n] for n in layers if n != "matmul0"
    )  # the hits' figures, not this profile's
    assert json.loads(partial.get(keys["matmul0"]))["fp32_s"] == mixed["matmul0"][0]


def test_machines_differing_in_one_vector_extension_do_not_share_figures(tmp_path):
    fmt = _cpu_format()
    fp32, int8, layers = _quantised(tmp_path, fmt)
    avx2 = _machine_fingerprint(CPUINFO)
    vnni = _machine_fingerprint(CPUINFO.replace("f16c", "f16c avx512_vnni"))
    assert avx2 != vnni and avx2.split("/isa=")[0] == vnni.split("/isa=")[0]
    signatures = layer_signatures(onnx.load(fp32), onnx.load(int8), layers, _feed()[0])
    assert not set(timing_keys(signatures, _scope(fmt, avx2)).values()) & set(
        timing_keys(signatures, _scope(fmt, vnni)).values()
    )

    cache = LRUCache()
    _costed(fp32, int8, layers, tmp_path, cache, _scope(fmt, avx2))
    before = PROFILES["int8_vs_fp32"]
    _, sources = _costed(fp32, int8, layers, tmp_path, cache, _scope(fmt, vnni))
    assert PROFILES["int8_vs_fp32"] == before + 1 and CACHED not in sources.values()


def test_an_other_int8_format_does_not_share_figures(tmp_path):
    per_channel = _cpu_format()
    per_tensor = Int8Format(
        "per-tensor u8s8 QDQ", "uint8", False, per_channel.reduce_range, True, per_channel=False
    )
    fp32, int8_a, layers = _quantised(tmp_path, per_channel, "a")
    _, int8_b, layers_b = _quantised(tmp_path, per_tensor, "b")
    assert layers == layers_b
    feed = _feed()[0]
    sig_a = layer_signatures(onnx.load(fp32), onnx.load(int8_a), layers, feed)
    sig_b = layer_signatures(onnx.load(fp32), onnx.load(int8_b), layers, feed)
    # The quantised graph itself tells them apart (the weight's scale per channel or one), not only the format.
    assert sig_a["matmul1"]["int8_inputs"][1] != sig_b["matmul1"]["int8_inputs"][1]
    same_format = _scope(per_channel)
    assert not set(timing_keys(sig_a, same_format).values()) & set(timing_keys(sig_b, same_format).values())

    cache = LRUCache()
    _costed(fp32, int8_a, layers, tmp_path, cache, _scope(per_channel))
    before = PROFILES["int8_vs_fp32"]
    _, sources = _costed(fp32, int8_b, layers, tmp_path, cache, _scope(per_tensor))
    assert PROFILES["int8_vs_fp32"] == before + 1 and CACHED not in sources.values()


@pytest.mark.models
def test_a_second_int8_compile_with_the_same_cache_does_not_profile_and_decides_alike(tmp_path):
    calibration = _npz(pixel_values=_clear_images(16))
    options = OptimizeOptions(precision="int8")
    cache = LRUCache()
    sections, costed, shipped = [], [], []
    for attempt in ("cold", "warm"):
        before = dict(PROFILES)
        (tmp_path / attempt).mkdir()
        result = FlexDSAOptimizer("cpu-ort").optimize(
            fixture("resnet"), options, calibration=calibration, cache=cache, workdir=tmp_path / attempt
        )
        section = result.report["precision"]
        # Cold: the per-op profile and the fp32 time shares, once each; warm: no ONNX Runtime profile at all.
        profiled = {what: PROFILES[what] - before.get(what, 0) for what in ("int8_vs_fp32", "time_shares")}
        assert profiled == (
            {"int8_vs_fp32": 1, "time_shares": 1}
            if attempt == "cold"
            else {"int8_vs_fp32": 0, "time_shares": 0}
        )
        sections.append(section)
        shipped.append(result.model_bytes())
        costed.append(
            [path.read_bytes() for path in (tmp_path / attempt).glob("precision-0-*/static_costed.onnx")]
        )
    cold, warm = sections
    assert cold["op_costing"]["profiled"] and not warm["op_costing"]["profiled"]
    assert warm["op_costing"]["figures"] == {"measured": 0, "kernel_cache": cold["op_costing"]["quantisable"]}
    assert {row.get("timing_source", "").split(":")[0] for row in cold["layers"]} == {MEASURED}
    assert {row.get("timing_source") for row in warm["layers"]} == {CACHED}
    columns = ("layer", "precision", "fp32_ms", "int8_ms", "measured", "reason", "time_share")
    assert [[row.get(c) for c in columns] for row in warm["layers"]] == [
        [row.get(c) for c in columns] for row in cold["layers"]
    ]
    assert costed[0] == costed[1]  # the model with the ops measured slower kept float: the same bytes
    # The candidates are the same models, so their whole-model rounds are read back and the same one ships;
    # where none was as fast as fp32 nothing was kept, and the fallback is timed afresh.
    int8_shipped = cold["shipped"] != "fp32"
    assert not cold["timing"]["from_kernel_cache"] and warm["timing"]["from_kernel_cache"] == int8_shipped
    if int8_shipped:
        assert warm["shipped"] == cold["shipped"] and shipped[0] == shipped[1]
        assert [c["time_ratio_vs_fp32"] for c in warm["candidates"]] == [
            c["time_ratio_vs_fp32"] for c in cold["candidates"]
        ]


def test_a_layer_whose_shapes_are_not_known_is_measured_every_time_and_says_why(tmp_path):
    """A MatMul reading a com.microsoft Gelu without value_info: ONNX shape inference cannot see through the
    contrib op, so the MatMul has no signature; it is measured on every run and labelled so, never cached."""
    rng = np.random.default_rng(0)
    weights = [
        onnx.numpy_helper.from_array((rng.standard_normal((WIDTH, WIDTH)) / 8).astype(np.float32), f"w{i}")
        for i in range(2)
    ]
    graph = onnx.helper.make_graph(
        [
            onnx.helper.make_node("MatMul", ["x", "w0"], ["h"], name="known"),
            onnx.helper.make_node("Gelu", ["h"], ["g"], name="gelu", domain="com.microsoft"),
            onnx.helper.make_node("MatMul", ["g", "w1"], ["y"], name="unknown"),
        ],
        "contrib",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", WIDTH])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        weights,
    )
    opsets = [onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("com.microsoft", 1)]
    fp32 = tmp_path / "fp32.onnx"
    onnx.save(onnx.helper.make_model(graph, opset_imports=opsets, ir_version=9), fp32)
    int8 = _quantize_static(fp32, tmp_path / "int8.onnx", _feed(), tmp_path / "ranges.json", _cpu_format())
    layers = [n for n, _ in quantised_nodes(onnx.load(int8))]
    assert {"known", "unknown"} <= set(layers)
    signatures = layer_signatures(onnx.load(fp32), onnx.load(int8), layers, _feed()[0])
    assert isinstance(signatures["known"], dict)
    assert signatures["unknown"] == "the shape of 'g' is not known at the profiled inputs"

    cache, scope = LRUCache(), _scope(_cpu_format())
    _costed(fp32, int8, layers, tmp_path, cache, scope)
    before = PROFILES["int8_vs_fp32"]
    _, sources = _costed(fp32, int8, layers, tmp_path, cache, scope)
    assert PROFILES["int8_vs_fp32"] == before + 1  # one layer without a key: the model is profiled again
    assert sources["known"] == CACHED
    assert (
        sources["unknown"] == f"{MEASURED} (not cached: the shape of 'g' is not known at the profiled inputs)"
    )
