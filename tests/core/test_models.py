"""Real architectures through the whole pipeline on cpu-ort: it succeeds, every output validates against
the original in ONNX Runtime, every op is one the target runs, and the fusions we expect do fire."""

from __future__ import annotations

import json

import onnx
import pytest

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.targets import get_adapter, load_target, op_key
from tests.models import FIXTURES, fixture

pytestmark = pytest.mark.models

# Rules that must be taken on each fixture (a subset: the switcher may take more where they pay).
EXPECTED_FUSIONS = {
    "bert": {"layer_norm", "gelu_erf"},
    "gpt2": {"layer_norm", "gelu_tanh"},
    "llama": {"rms_norm", "silu"},
    "vit": {"layer_norm", "gelu_erf"},
    "resnet": {"conv_bn_fold"},
    "mobilenetv2": {"conv_bn_fold"},
}


@pytest.fixture(scope="module")
def cpu_ort():
    return FlexDSAOptimizer(load_target("cpu-ort"))


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_optimises_and_validates(cpu_ort, name, tmp_path):
    result = cpu_ort.optimize(fixture(name), OptimizeOptions(measure_latency=False))
    report = result.report

    assert report["validation"]["performed"] and report["validation"]["ok"], report["validation"]
    assert report["nodes"]["total_after"] < report["nodes"]["total_before"]
    missing = EXPECTED_FUSIONS[name] - set(report["fusions"]["applied"])
    assert not missing, f"{name}: expected fusions not applied: {missing}"

    target = load_target("cpu-ort")
    adapter = get_adapter(target)
    assert result.buckets, f"{name}: expected at least one optimised bucket, got none"
    for bucket in result.buckets:
        illegal = {
            op_key(node.op_type, node.domain)
            for node in bucket.model.graph
            if not adapter.supports(target, node.op_type, node.domain)
        }
        assert not illegal, f"{name}: ops cpu-ort does not run: {illegal}"

    written = {p.name for p in result.write(tmp_path)}
    assert {"model.onnx", "manifest.json", "report.json", "fusion_plan.json"} <= written
    onnx.checker.check_model(str(tmp_path / "model.onnx"))
    plan = json.loads((tmp_path / "fusion_plan.json").read_text())
    candidates = [c for bucket in plan.values() for c in bucket["candidates"]]
    assert candidates, f"{name}: expected the fusion plan to list its candidates, it lists none"
    assert all("reason" in c for c in candidates)


def test_skip_layer_norm_is_refused_where_measured_slower(cpu_ort):
    """The switcher takes LayerNorm but, on ORT's CPU kernels, not SkipLayerNorm (measured 4-6x slower)."""
    result = cpu_ort.optimize(fixture("bert"), OptimizeOptions(measure_latency=False))
    candidates = [c for c in result.report["fusions"]["candidates"] if c["rule"] == "skip_layer_norm"]
    assert candidates and candidates[0]["matches"] > 0
    assert not candidates[0]["taken"], candidates[0]
    assert "SkipLayerNormalization" in candidates[0]["reason"]


def test_user_can_switch_a_rule_off(cpu_ort):
    result = cpu_ort.optimize(
        fixture("bert"), OptimizeOptions(measure_latency=False, disabled_rules=["layer_norm"])
    )
    assert "layer_norm" not in result.report["fusions"]["applied"]
    after = next(iter(result.report["nodes"]["after"].values()))
    assert "LayerNormalization" not in after
    assert result.report["validation"]["ok"]


def test_latency_is_measured_and_reported(cpu_ort):
    result = cpu_ort.optimize(fixture("resnet"), OptimizeOptions(latency_repeats=5))
    latency = result.report["latency"]
    assert latency["measured"] and latency["before_s"] > 0 and latency["after_s"] > 0
    assert result.report["reproducibility"]["versions"]["onnxruntime"]


def test_unknown_rule_name_is_a_clear_error(cpu_ort):
    from flexdsa_core.errors import InvalidOptionsError

    with pytest.raises(InvalidOptionsError, match="layer_nrom"):
        cpu_ort.optimize(fixture("resnet"), OptimizeOptions(disabled_rules=["layer_nrom"]))
    names = cpu_ort.switchable_rewrites()
    assert "layer_norm" in names["fusions"] and "cse" in names["passes"] and "ort_layout" in names["target"]


def test_scratch_folder_goes_away_with_the_result(cpu_ort, tmp_path):
    import gc

    result = cpu_ort.optimize(fixture("resnet"), OptimizeOptions(measure_latency=False))
    scratch = result.workdir
    assert scratch.is_dir()
    del result
    gc.collect()
    assert not scratch.exists()
    given = tmp_path / "scratch"
    given.mkdir()
    kept = cpu_ort.optimize(fixture("resnet"), OptimizeOptions(measure_latency=False), workdir=given)
    assert kept.workdir == given and given.is_dir()


def test_attention_fuses_once_a_bucket_fixes_the_shapes(cpu_ort):
    """On the dynamic export, Shape nodes read tensors inside attention (the fusion would not remove them);
    in a static bucket those fold away and the whole block becomes one Attention kernel."""
    options = OptimizeOptions(measure_latency=False, shape_buckets={"batch": [1], "seq": [32]})
    report = cpu_ort.optimize(fixture("bert"), options).report
    assert report["shapes"]["buckets"] == ["batch1_seq32"]
    assert {"attention", "multihead_attention"} & set(report["fusions"]["applied"])
    assert report["validation"]["ok"]
