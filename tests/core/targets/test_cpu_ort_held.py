"""cpu-ort: a fusion rule switched off stays off where the model runs. ONNX Runtime's own graph optimizers make
some of the same fusions when a model is loaded (and in the offline layout pass): MobileNetV2 compiled with
conv_bn_fold and conv_bias_act off used to ship with every BatchNormalization folded and every Clip fused all
the same. The optimizers that would do it are named in the model's metadata and the manifest, and switched off
in every session the compiler and the runtime open (a user's own loader reads them from the manifest)."""

from __future__ import annotations

import collections
import json

import onnx
import onnxruntime as ort
import pytest

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.cache import LRUCache
from flexdsa_core.fusions import discover_rules
from flexdsa_core.in_memory import ORT_DISABLED_OPTIMIZERS
from flexdsa_core.targets.cpu_ort.adapter import ORT_TWINS
from flexdsa_runtime.backends import load_backend
from flexdsa_runtime.bundle import open_bundle
from tests.models import fixture

pytestmark = pytest.mark.models

# Per rule of ``ORT_TWINS``: a fixture where it fuses what ONNX Runtime would fuse again, the op counted, and
# whether the fusion makes that op (FusedConv...) or removes it (a folded BatchNormalization).
WHERE = {
    "conv_bn_fold": ("mobilenetv2", "BatchNormalization", "removes"),
    "conv_bias_act": ("mobilenetv2", "FusedConv", "makes"),
    "gemm_act": ("bert", "FusedGemm", "makes"),
    "bias_gelu": ("bert", "BiasGelu", "makes"),
    "gelu_tanh": ("gpt2", "FastGelu", "makes"),
}
HELD = ["ConvActivationFusion", "ConvBNFusion"]


def _compile(name: str, disabled: list[str], **options):
    return FlexDSAOptimizer("cpu-ort").optimize(
        str(fixture(name)),
        OptimizeOptions(disabled_rules=disabled, calibrate=False, measure_latency=False, **options),
        cache=LRUCache(),
    )


def _artifact(result, name: str) -> bytes:
    content = result.artifacts[name]
    return content if isinstance(content, bytes) else content.read_bytes()


def _loaded_ops(path, tmp_path, disabled: list[str], level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL):
    """The op types of the model at ``path`` as ONNX Runtime holds it once loaded (its optimized graph, saved)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    options.log_severity_level = 3
    options.optimized_model_filepath = str(tmp_path / "loaded.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
    return collections.Counter(n.op_type for n in onnx.load(str(tmp_path / "loaded.onnx")).graph.node)


def test_every_rule_with_a_twin_is_a_rule_and_has_a_fixture_here():
    assert set(WHERE) == set(ORT_TWINS) and set(ORT_TWINS) <= {rule.name for rule in discover_rules()}


@pytest.mark.parametrize("rule", sorted(ORT_TWINS))
def test_each_named_optimizer_is_what_makes_the_rules_fusion_again(rule, tmp_path):
    """The table holds facts of the installed ONNX Runtime: with the rule off, loading our output at
    ORT_ENABLE_EXTENDED makes the fusion anyway; with the named optimizers off too, it does not (ONNX Runtime
    ignores a name it does not know, so only this shows that a name is right)."""
    name, op, how = WHERE[rule]
    result = _compile(name, [rule], allow_slower=True)
    path = tmp_path / "model.onnx"
    path.write_bytes(_artifact(result, "model.portable.onnx" if "model.portable.onnx" in result.artifacts else "model.onnx"))
    shipped = collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)[op]
    extended = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    unheld = _loaded_ops(path, tmp_path, [], extended)[op]
    held = _loaded_ops(path, tmp_path, list(ORT_TWINS[rule]), extended)[op]
    assert (unheld < shipped if how == "removes" else unheld > shipped), (rule, shipped, unheld)
    assert held == shipped and (shipped > 0 or how == "makes"), (rule, shipped, held)


def test_a_switched_off_fusion_stays_off_in_the_bundle_and_where_it_runs(tmp_path):
    result = _compile("mobilenetv2", ["conv_bn_fold", "conv_bias_act"], allow_slower=True)
    assert result.report["validation"]["ok"]
    assert any("ConvBNFusion" in note for note in result.report["legalization"]["dynamic"])
    out = tmp_path / "bundle"
    result.write(out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["session_options"]["disabled_optimizers"] == HELD
    for name in ("model.onnx", "model.portable.onnx"):
        model = onnx.load(str(out / name))
        assert {p.key: p.value for p in model.metadata_props}[ORT_DISABLED_OPTIMIZERS] == ",".join(HELD)
        # Loaded as the manifest says, every BatchNormalization is a kernel of its own (the blocked layout makes
        # it a Conv of its own: 22 + 22) and every Clip is still there.
        loaded = _loaded_ops(out / name, tmp_path, HELD)
        assert loaded["Conv"] + loaded["BatchNormalization"] == 44 and loaded["Clip"] == 15, (name, loaded)
    # Without the names ONNX Runtime folds and fuses them all when it loads the portable model (the blocked one
    # was laid out offline with them held: no fold is left to make).
    unheld = _loaded_ops(out / "model.portable.onnx", tmp_path, [])
    assert unheld["Conv"] + unheld["BatchNormalization"] == 22 and unheld["Clip"] == 0, unheld
    # The runtime loads the bundle's ONNX model with the manifest's names.
    bundle = open_bundle(out)
    assert bundle.disabled_optimizers == HELD
    backend = load_backend(bundle, bundle.buckets[0], "onnxruntime")
    try:
        assert backend.disabled_optimizers == HELD
    finally:
        backend.close()


def test_nothing_is_held_when_no_rule_is_switched_off():
    result = _compile("mobilenetv2", [])
    assert "disabled_optimizers" not in json.loads(_artifact(result, "manifest.json"))["session_options"]
    model = onnx.load_from_string(_artifact(result, "model.onnx"))
    assert ORT_DISABLED_OPTIMIZERS not in {p.key for p in model.metadata_props}
