"""Cost formulas per op, Cost arithmetic, the roofline, and measured kernels cached once."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from flexdsa_core.cache import LRUCache
from flexdsa_core.cost import Cost
from flexdsa_core.cost_model import CostModel
from flexdsa_core.kernel_timing import measure_sgemm_peak
from flexdsa_core.op_costs import OpView, TensorInfo, op_cost
from flexdsa_core.op_costs import work as op_work
from flexdsa_core.significance import MIN_ROUNDS
from flexdsa_core.targets import TargetSpec, load_target

NPU = TargetSpec(
    name="tiny-npu",
    vendor="test",
    adapter="accelerator",
    peak_ops_per_s={"float32": 1e12},
    mem_bandwidth_bytes_per_s=1e10,
    power_w=5.0,
    launch_overhead_s=1e-6,
)


def _model(text: str, **weights: tuple[int, ...]) -> ir.Model:
    proto = onnx.parser.parse_model(text)
    rng = np.random.default_rng(0)
    for name, shape in weights.items():
        array = rng.standard_normal(shape).astype(np.float32)
        proto.graph.initializer.append(onnx.numpy_helper.from_array(array, name))
    return ir.serde.deserialize_model(proto)


def _t(*shape: int, dtype: str = "float32") -> TensorInfo:
    return TensorInfo(tuple(shape), dtype)


def _view(op: str, inputs, outputs, domain: str = "", **attrs) -> OpView:
    return OpView(op, domain, attrs, tuple(inputs), tuple(outputs))


# -- formulas -------------------------------------------------------------------------------------


def test_matmul_flops_are_2mnk():
    m, k, n = 64, 256, 32
    cost = op_work(_view("MatMul", [_t(m, k), _t(k, n)], [_t(m, n)]))
    assert cost.flops == 2 * m * n * k
    assert cost.bytes == 4 * (m * k + k * n + m * n)


def test_batched_matmul_counts_every_batch():
    cost = op_work(_view("MatMul", [_t(8, 12, 128, 64), _t(8, 12, 64, 128)], [_t(8, 12, 128, 128)]))
    assert cost.flops == 2 * 8 * 12 * 128 * 128 * 64


def test_gemm_with_bias_and_transposed_a():
    m, k, n = 16, 48, 24
    view = _view("Gemm", [_t(k, m), _t(k, n), _t(n)], [_t(m, n)], transA=1)
    assert op_work(view).flops == 2 * m * n * k + m * n


def test_fused_conv_adds_bias_and_activation():
    # 3x3 conv, 16 -> 32 channels, group 1, 8x8 output, with bias and Relu.
    x, w, b, y = _t(1, 16, 10, 10), _t(32, 16, 3, 3), _t(32), _t(1, 32, 8, 8)
    out = 32 * 8 * 8
    plain = op_work(_view("Conv", [x, w, b], [y]))
    fused = op_work(_view("FusedConv", [x, w, b], [y], domain="com.microsoft", activation="Relu"))
    assert plain.flops == 2 * out * 16 * 9 + out
    assert fused.flops == plain.flops + out


def test_depthwise_conv_uses_channels_per_group():
    x, w, y = _t(1, 32, 10, 10), _t(32, 1, 3, 3), _t(1, 32, 8, 8)
    assert op_work(_view("Conv", [x, w], [y], group=32)).flops == 2 * 32 * 8 * 8 * 9


def test_unlisted_op_is_one_op_per_output_element():
    view = _view("SomeVendorOp", [_t(4, 5)], [_t(4, 5), _t(2)], domain="vendor.x")
    cost = op_work(view)
    assert cost.flops == 4 * 5 + 2
    assert cost.bytes == 4 * (20 + 20 + 2)


def test_registry_takes_new_ops():
    @op_cost("test.domain::Triple")
    def _triple(view: OpView) -> Cost:
        return Cost(flops=3 * view.out_elems, bytes=view.io_bytes)

    assert op_work(_view("Triple", [_t(10)], [_t(10)], domain="test.domain")).flops == 30


def test_reshape_moves_bytes_but_does_no_arithmetic():
    cost = op_work(_view("Reshape", [_t(2, 6), _t(2, dtype="int64")], [_t(3, 4)]))
    assert cost.flops == 0 and cost.bytes == 48 + 16 + 48


# -- Cost arithmetic ------------------------------------------------------------------------------


def test_costs_add_up():
    a = Cost(flops=10, bytes=100, seconds=1e-3, joules=2e-3, kernels=1, measured=1)
    b = Cost(flops=5, bytes=50, seconds=2e-3, joules=1e-3, kernels=2)
    total = a + b
    assert total == Cost(flops=15, bytes=150, seconds=3e-3, joules=3e-3, kernels=3, measured=1)
    assert sum([a, b]) == total
    assert total.basis == "partly measured"


def test_unavailable_energy_stays_unavailable():
    total = Cost(seconds=1.0, joules=None, kernels=1) + Cost(seconds=1.0, joules=2.0, kernels=1)
    assert total.joules is None and total.seconds == 2.0


# -- the roofline (vendor targets) -----------------------------------------------------------------

MATMUL = """
<ir_version: 10, opset_import: ["" : 18]>
g (float[batch,seq,256] x) => (float[batch,seq,64] y)
{
  y = MatMul(x, w)
}
"""


def test_roofline_is_the_slower_of_compute_and_memory_plus_launch():
    model = _model(MATMUL, w=(256, 64))
    cost = CostModel(NPU).node_cost(model.graph.node(0))
    flops = 2 * 1 * 128 * 64 * 256  # batch -> 1, seq -> 128
    nbytes = 4 * (128 * 256 + 256 * 64 + 128 * 64)
    assert cost.flops == flops and cost.bytes == nbytes
    assert cost.seconds == pytest.approx(max(flops / 1e12, nbytes / 1e10) + 1e-6)
    assert cost.joules == pytest.approx(5.0 * (flops / 1e12 + nbytes / 1e10 + 1e-6))
    assert cost.measured == 0 and cost.basis == "estimate"


def test_shape_bucket_sets_symbolic_dims():
    model = _model(MATMUL, w=(256, 64))
    cost = CostModel(NPU, dims={"batch": 4, "seq": 512}).node_cost(model.graph.node(0))
    assert cost.flops == 2 * 4 * 512 * 64 * 256


def test_no_power_figure_means_no_energy_and_missing_figures_are_noted():
    bare = NPU.model_copy(update={"power_w": None, "mem_bandwidth_bytes_per_s": None})
    cost_model = CostModel(bare)
    cost = cost_model.node_cost(_model(MATMUL, w=(256, 64)).graph.node(0))
    assert cost.joules is None
    assert not cost_model.energy_available
    assert any("no sourced memory bandwidth" in note for note in cost_model.notes)


def test_uncalibrated_cpu_ort_does_not_measure_or_guess():
    cost_model = CostModel(load_target("cpu-ort"), calibrate=False)
    cost = cost_model.node_cost(_model(MATMUL, w=(256, 64)).graph.node(0))
    assert cost.measured == 0 and cost.seconds == pytest.approx(2e-6)  # launch only: no sourced figures
    assert any("no sourced float32 peak" in note for note in cost_model.notes)


def test_unknown_intermediate_shapes_are_found_by_running_the_nodes():
    text = """
    <ir_version: 10, opset_import: ["" : 18]>
    g (float[1,32,64] x) => (float[1,32,16] y)
    {
      t = Relu(x)
      y = MatMul(t, w)
    }
    """
    model = _model(text, w=(64, 16))
    cost = CostModel(NPU).graph_cost(model)
    assert cost.kernels == 2
    assert cost.flops == 32 * 64 + 2 * 32 * 16 * 64


def test_symbolic_dims_are_lowered_when_the_model_refuses_128():
    # A table of 64 positions: seq = 128 cannot run, so the cost model costs seq at 64 and says so.
    text = """
    <ir_version: 10, opset_import: ["" : 18]>
    g (float[batch,seq,8] x) => (float[batch,seq,8] y)
    {
      y = Add(x, table)
    }
    """
    cost_model = CostModel(NPU)
    cost = cost_model.graph_cost(_model(text, table=(1, 64, 8)))
    assert cost.flops == 64 * 8
    assert any("costed at 64" in note for note in cost_model.notes)
    assert cost_model.describe()["representative_dims"]["other"] == 64


# -- measured kernels (cpu-ort) ----------------------------------------------------------------------

TWO_LAYERS = """
<ir_version: 10, opset_import: ["" : 18]>
g (float[1,64,128] x) => (float[1,64,128] y) <float[1,64,128] h>
{
  h = MatMul(x, w1)
  y = MatMul(h, w2)
}
"""


def test_identical_layers_are_measured_once_and_shared_across_jobs():
    cache = LRUCache()
    model = _model(TWO_LAYERS, w1=(128, 128), w2=(128, 128))  # different weights, same kernel
    first = CostModel(load_target("cpu-ort"), cache=cache)
    cost = first.graph_cost(model)
    assert cost.measured == 2 and cost.seconds > 0
    assert (first.stats.misses, first.stats.hits) == (1, 1)
    assert len(cache) == 1

    second = CostModel(load_target("cpu-ort"), cache=cache)  # another job, same cache
    again = second.graph_cost(model)
    assert (second.stats.misses, second.stats.hits) == (0, 2)
    assert second.measure_seconds == 0.0 and second.stats.seconds_saved > 0
    assert again.seconds == cost.seconds


def test_cache_key_ignores_weight_values_but_not_shapes():
    cost_model = CostModel(load_target("cpu-ort"))
    a, b = _model(TWO_LAYERS, w1=(128, 128), w2=(128, 128)).graph
    assert cost_model.kernel_key(a) == cost_model.kernel_key(b)
    wide = _model(MATMUL, w=(256, 64)).graph.node(0)
    assert cost_model.kernel_key(wide) != cost_model.kernel_key(a)


def test_a_seeded_measurement_is_used_as_is():
    cost_model = CostModel(load_target("cpu-ort"))
    node = _model(MATMUL, w=(256, 64)).graph.node(0)
    cost_model.cache.put(cost_model.kernel_key(node), b'{"seconds": 0.5, "measure_s": 1.5}')
    cost = cost_model.node_cost(node)
    assert cost.seconds == pytest.approx(0.5 + 2e-6)
    assert cost_model.stats.hits == 1 and cost_model.stats.seconds_saved == 1.5


def test_compare_times_two_sets_side_by_side_and_remembers():
    cost_model = CostModel(load_target("cpu-ort"))
    first, second = _model(TWO_LAYERS, w1=(128, 128), w2=(128, 128)).graph
    pair = cost_model.compare([first], [first, second])
    assert pair is not None and 0 < pair[0] < pair[1]
    assert cost_model.compare([first], [first, second]) == pair  # the same close call is timed once
    assert CostModel(NPU).compare([first], [second]) is None  # nothing to time on an estimated target


ADD_LAYER_NORM = """
<ir_version: 10, opset_import: ["" : 17]>
block (float[1,128,64] x, float[1,128,64] skip) => (float[1,128,64] y) {
    total = Add(x, skip)
    y = LayerNormalization<axis = -1, epsilon = 0.00001>(total, gamma, beta)
}
"""


def _add_layer_norm_and_its_fusion() -> tuple[list[ir.Node], list[ir.Node]]:
    model = _model(ADD_LAYER_NORM, gamma=(64,), beta=(64,))
    x, skip = model.graph.inputs
    gamma, beta = model.graph.initializers["gamma"], model.graph.initializers["beta"]
    fused = ir.node(
        "SkipLayerNormalization",
        [x, skip, gamma, beta],
        {"epsilon": 1e-5},
        domain="com.microsoft",
        num_outputs=4,
    )
    return list(model.graph), [fused]


def test_a_fixed_cost_per_run_that_moves_between_comparisons_moves_no_decision(monkeypatch):
    """The fixed cost of one run (Python, ONNX Runtime's dispatch) moves with the machine's state: seen at 5 us,
    then 10 us minutes later. Taken off each kernel, a figure of it from another time moved a comparison of
    two kernels against one from ~2.5x to below 1x (issue 8); the comparison times it in its own rounds.

    The kernels run for real, but each run reports a fixed figure per kernel (with the same seeded jitter in both
    comparisons) plus ``extra``: two separately timed comparisons of kernels this small differ by more than any
    tolerance (seen: 2.3x then 3.9x), while here only the fixed cost differs, so the two ratios must agree."""
    from flexdsa_core import cost_model as module

    # Seconds per run, the fixed cost included: the work is 1-2 us, the fixed cost 5 us, as measured.
    figures = {"empty": 5e-6, "Add": 6e-6, "LayerNormalization": 7e-6, "SkipLayerNormalization": 6.5e-6}
    real_runner, real_empty = CostModel._kernel_runner, module.empty_runner

    def tagged(run, name):
        def tagged_run():
            run()

        tagged_run.kernel = name
        return tagged_run

    monkeypatch.setattr(
        CostModel, "_kernel_runner", lambda self, node, *a: tagged(real_runner(self, node, *a), node.op_type)
    )
    monkeypatch.setattr(module, "empty_runner", lambda: tagged(real_empty(), "empty"))
    extra, rng = [0.0], [np.random.default_rng(0)]

    def timer(function) -> float:  # every run, the empty one included, costs ``extra`` more
        function()
        return figures[function.kernel] * (1 + 0.03 * rng[0].standard_normal()) + extra[0]

    def compare():
        rng[0] = np.random.default_rng(0)
        return CostModel(load_target("cpu-ort"), cache=LRUCache(), timer=timer).compare_paired(
            unfused, fused, opsets={"": 17, "com.microsoft": 1}
        )

    unfused, fused = _add_layer_norm_and_its_fusion()
    quiet = compare()
    extra[0] = 20e-6
    busy = compare()
    assert quiet is not None and busy is not None
    # (1 + 1.5 + 2 x 2 us launch) against (1.5 + 2 us): the fused kernel's work over the unfused pair's.
    assert quiet.ratio == pytest.approx(3.5 / 6.5, rel=0.1), quiet
    assert busy.verdict == quiet.verdict, (quiet, busy)
    assert busy.ratio == pytest.approx(quiet.ratio, rel=0.02), (quiet, busy)


def test_measure_sgemm_peak_is_a_plausible_rate():
    peak = measure_sgemm_peak(seconds=0.05, size=256)
    assert 1e8 < peak < 1e13


# Two machines as alike as the issue found them: same name, same core count, one without AVX-512 VNNI.
_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC
flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c avx512f avx512bw{extra} hypervisor
"""


def test_fingerprint_includes_the_vector_extensions_read_from_cpuinfo():
    from flexdsa_core.kernel_timing import _machine_fingerprint

    with_vnni = _machine_fingerprint(_CPUINFO.format(extra=" avx512_vnni"))
    without = _machine_fingerprint(_CPUINFO.format(extra=""))
    assert with_vnni != without
    assert "avx512_vnni" in with_vnni and "AMD EPYC" in with_vnni
    # Flags no kernel depends on do not split the cache.
    assert _machine_fingerprint(_CPUINFO.format(extra=" constant_tsc")) == without
    arm = "processor\t: 0\nFeatures\t: fp asimd evtstrm aes crc32 asimddp sve\n"
    assert _machine_fingerprint(arm).endswith("isa=asimd,asimddp,sve")


@pytest.mark.parametrize("flag", ["avx512_vnni", "avx_vnni", "amx_int8", "avx512_bf16"])
def test_machines_differing_in_one_vector_flag_never_share_a_measurement(monkeypatch, flag):
    from flexdsa_core import cost_model as module
    from flexdsa_core.kernel_timing import _machine_fingerprint

    shared = LRUCache()
    node = _model(MATMUL, w=(256, 64)).graph.node(0)
    fingerprints = {
        "first": _machine_fingerprint(_CPUINFO.format(extra=f" {flag}")),
        "second": _machine_fingerprint(_CPUINFO.format(extra="")),
    }
    keys = {}
    for machine, fingerprint in fingerprints.items():
        monkeypatch.setattr(module, "machine_fingerprint", lambda fingerprint=fingerprint: fingerprint)
        keys[machine] = CostModel(load_target("cpu-ort"), cache=shared).kernel_key(node)
    assert keys["first"] != keys["second"]

    # The first machine's measurement is in the shared cache; the second must measure for itself.
    shared.put(keys["first"], b'{"seconds": 0.5, "measure_s": 1.5}')
    second = CostModel(load_target("cpu-ort"), cache=shared)
    cost = second.node_cost(node)
    assert second.stats.hits == 0 and second.stats.misses == 1
    assert cost.seconds != pytest.approx(0.5 + 2e-6)


def test_a_kernel_alone_takes_the_fixed_cost_of_a_run_from_its_own_moments():
    """A kernel measured alone subtracts the empty run's cost timed beside its own runs: when that fixed cost
    moves (the machine's state; 5 then 10 us seen here), a figure of it from earlier in the process would be
    off by the difference (issue 8). Seeded clock: the kernel and the empty run run for real, each reports a
    fixed figure plus what the machine's state adds to every run; the figure must not move with that state.
    How close it stays on a real clock is measured by ``python -m bench.mechanics`` (kernel fixed cost)."""
    from flexdsa_core.kernel_timing import thread_empty_runner

    kernel_s, empty_s, extra = 30e-6, 5e-6, [0.0]

    def timer(function) -> float:  # every run, the empty one included, costs ``extra`` more
        function()
        return (empty_s if function is thread_empty_runner() else kernel_s) + extra[0]

    node = _model(MATMUL, w=(256, 64)).graph.node(0)
    quiet = CostModel(load_target("cpu-ort"), cache=LRUCache(), timer=timer).node_cost(node).seconds
    extra[0] = 50e-6
    busy = CostModel(load_target("cpu-ort"), cache=LRUCache(), timer=timer).node_cost(node).seconds
    assert quiet == pytest.approx(kernel_s - empty_s + load_target("cpu-ort").launch_overhead_s), quiet
    assert busy == pytest.approx(quiet), (quiet, busy)  # not off by the 50 us the fixed cost moved


def _fixed_timer(seconds_in_order: list[float], jitter: list[float]):
    """A clock that gives each distinct function it times (in the order first seen: the empty run, then the
    kernels) a fixed figure, the second side's kernel scaled by ``jitter`` round after round."""
    seen: dict[int, int] = {}
    calls = [0]

    def timer(function) -> float:
        index = seen.setdefault(id(function), len(seen))
        calls[0] += 1
        seconds = seconds_in_order[index]
        if index == len(seconds_in_order) - 1:
            seconds *= jitter[calls[0] % len(jitter)]
        return seconds

    return timer


def test_a_comparison_stops_once_the_threshold_its_caller_asks_about_is_settled():
    """A fused kernel at 0.88-0.92 of the unfused pair: whether it is significantly *faster* sits on the 0.9
    threshold and keeps the timing going; whether it is significantly *slower* (all a rewrite that leaves
    fewer kernels turns on) is plain after the first look."""
    unfused, fused = _add_layer_norm_and_its_fusion()
    opsets = {"": 17, "com.microsoft": 1}
    # empty run 1 us; Add 40 us, LayerNormalization 60 us; SkipLayerNormalization 91 us * 0.97-1.03
    figures = [1e-6, 41e-6, 61e-6, 91e-6]
    answers = {}
    for question in ("both", "slower"):
        cost_model = CostModel(
            load_target("cpu-ort"), cache=LRUCache(), timer=_fixed_timer(figures, [0.967, 1.033])
        )
        answers[question] = cost_model.compare_paired(unfused, fused, opsets=opsets, question=question)
    both, slower = answers["both"], answers["slower"]
    assert both.verdict == slower.verdict == "tie"
    assert slower.rounds == MIN_ROUNDS < both.rounds, (slower, both)


def test_a_fresh_comparison_is_the_one_the_next_job_reads_from_the_cache():
    """The cache keeps ratios to 4 places; a bound within rounding of a threshold must not decide one way in
    the job that timed it and the other in the next one that reads it."""
    unfused, fused = _add_layer_norm_and_its_fusion()
    opsets = {"": 17, "com.microsoft": 1}
    cache = LRUCache()
    fresh = CostModel(load_target("cpu-ort"), cache=cache).compare_paired(unfused, fused, opsets=opsets)
    read = CostModel(load_target("cpu-ort"), cache=cache).compare_paired(unfused, fused, opsets=opsets)
    assert fresh == read and fresh.low == round(fresh.low, 4)


def test_a_shape_probe_reads_constant_node_weights_from_memory(monkeypatch):
    """A weight written as a Constant node (paddle2onnx writes all of its so) goes to the probe's session as an
    in-memory initializer, not as bytes in its protobuf (ppocr_rec on nvidia-orin-nano: the whole model's
    weights serialised into one probe, 26 MiB of the job's peak); the shapes found are the same."""
    from flexdsa_core import cost_model

    rng = np.random.default_rng(0)
    weight = ir.tensor(rng.standard_normal((256, 512)).astype(np.float32), name="w")
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["n", 256]))
    constant = ir.node("Constant", [], attributes={"value": weight}, outputs=[ir.Value(name="w")])
    matmul = ir.node("MatMul", [x, constant.outputs[0]], outputs=[ir.Value(name="h")])
    relu = ir.node("Relu", [matmul.outputs[0]], outputs=[ir.Value(name="y")])
    protos = []
    real_session_with = cost_model.session_with

    def recording(proto, weights, options):
        protos.append((proto, dict(weights)))
        return real_session_with(proto, weights, options)

    monkeypatch.setattr(cost_model, "session_with", recording)
    found = CostModel(load_target("cpu-ort"), calibrate=False).infer_shapes([constant, matmul, relu])
    [(proto, weights)] = protos
    assert [n.op_type for n in proto.graph.node] == ["MatMul", "Relu"]
    assert proto.ByteSize() < 2048 and list(weights) == ["w"]
    assert found[relu.outputs[0]].shape[1:] == (512,) and found[matmul.outputs[0]].shape == found[relu.outputs[0]].shape


def test_shapes_whose_symbolic_dims_the_plan_binds_are_not_probed():
    """A fusion's nodes whose outputs carry only dims the plan binds (an input's ``batch`` carried through) are
    sized from their own shapes at the plan's values, without a run; a dim the plan does not bind still is."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(["batch", 8]))
    relu = ir.node("Relu", [x], outputs=[ir.Value(name="y", type=ir.TensorType(ir.DataType.FLOAT),
                                                  shape=ir.Shape(["batch", 8]))])  # fmt: skip
    model = CostModel(load_target("cpu-ort"), calibrate=False, dims={"batch": 3})
    found = model.infer_shapes([relu])
    assert found[relu.outputs[0]].shape == (3, 8) and model.probe_stats["run"] == 0
    relu.outputs[0].shape = ir.Shape(["batch", "unk__1"])  # a dim nobody bound: only a run can size it
    found = model.infer_shapes([relu])
    assert model.probe_stats["run"] == 1 and found[relu.outputs[0]].shape == (3, 8)
