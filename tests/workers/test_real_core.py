"""The worker path with the real compiler core (no stand-in): a job succeeds with the core's artifacts, and
a second model sharing layers with the first gets kernel-cache hits across pipeline processes."""

from __future__ import annotations

import numpy as np
import pytest

from service.cache.stats import read_cache_stats
from tests.workers.conftest import create_job, load_job
from workers.execute import execute_job

pytestmark = pytest.mark.services

SPEC = {"target": "cpu-ort", "measure_latency": False}


def mlp(widths: list[int]) -> bytes:
    """MatMul+Add+Relu layers of the given widths; equal (in, out) pairs are the same kernel."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, name = [], [], "x"
    for index, (fan_in, fan_out) in enumerate(zip(widths, widths[1:], strict=False)):
        w, b = f"w{index}", f"b{index}"
        inits += [numpy_helper.from_array(rng.standard_normal((fan_in, fan_out)).astype(np.float32), w),
                  numpy_helper.from_array(rng.standard_normal(fan_out).astype(np.float32), b)]
        nodes += [helper.make_node("MatMul", [name, w], [f"m{index}"]),
                  helper.make_node("Add", [f"m{index}", b], [f"a{index}"]),
                  helper.make_node("Relu", [f"a{index}"], [f"r{index}"])]
        name = f"r{index}"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, widths[0]])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, [4, widths[-1]])], inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10).SerializeToString()


def test_real_core_job_and_kernel_cache_hits_across_models(settings, monkeypatch):
    pytest.importorskip("flexdsa_core.optimizer")
    monkeypatch.delenv("FLEXDSA_TEST_OPTIMIZER")  # the real core, not the stand-in

    first = create_job(settings, mlp([64, 128, 64, 32]), spec=SPEC)
    assert execute_job(first, settings=settings, worker_id="t1") == "succeeded", load_job(settings, first).error
    job = load_job(settings, first)
    names = {a.name for a in job.artifacts}
    assert {"manifest.json", "report.json", "fusion_plan.json"} <= names
    first_cache = job.report_summary["cache"]

    # Same first two layers, a different head: a fresh pipeline process finds those kernels in Redis.
    second = create_job(settings, mlp([64, 128, 64, 16]), spec=SPEC)
    assert execute_job(second, settings=settings, worker_id="t1") == "succeeded", load_job(settings, second).error
    second_cache = load_job(settings, second).report_summary["cache"]
    assert second_cache["hits"] > first_cache["hits"], (first_cache, second_cache)

    stats = read_cache_stats(settings)
    assert stats["hits"] >= second_cache["hits"] and stats["hits_by_layer"].get("redis", 0) > 0
    assert stats["entries"] > 0


def _npz(**arrays) -> bytes:
    import io

    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def test_real_core_takes_the_calibration_blob_and_fails_a_misfit_clearly(settings, monkeypatch):
    """The calibration file travels like the model (blob -> the job's folder -> the core); samples that
    reach a worker without the API's check and do not fit fail the job with the reason, not a crash."""
    pytest.importorskip("flexdsa_core.optimizer")
    monkeypatch.delenv("FLEXDSA_TEST_OPTIMIZER")  # the real core, not the stand-in
    spec = {**SPEC, "precision": "int8", "precision_fallback": "fp32"}
    samples = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)  # 4 runs of batch 4

    good = create_job(settings, mlp([64, 32, 16]), spec=spec, calibration=_npz(x=samples))
    assert execute_job(good, settings=settings, worker_id="t1") == "succeeded", load_job(settings, good).error
    precision = load_job(settings, good).report_summary["precision"]
    assert precision["requested"] == "int8" and precision["calibration"] == "uploaded"

    wrong = create_job(settings, mlp([64, 32, 16]), spec=spec, calibration=_npz(x=samples[:, :63]))
    assert execute_job(wrong, settings=settings, worker_id="t1") == "failed"
    error = load_job(settings, wrong).error
    assert error["code"] == "invalid_calibration" and "'x' dim 1 is 63, the model fixes it to 64" in error["message"]
