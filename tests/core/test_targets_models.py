"""Every fixture model on every accelerator target: the pipeline succeeds, every op in an accelerator
partition is in the target's table and keeps its constraints, every bucket validates against the
original, the bundle's files parse (Python compiles, JSON/YAML/INI load, shell scripts pass ``bash -n``)
and the manifest's files exist. Vendor toolchains are not needed here (see the per-vendor tests)."""

import configparser
import json
import subprocess

import pytest

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.cache import LRUCache
from flexdsa_core.precision import int8_only
from flexdsa_core.targets import get_adapter, list_targets, load_target
from tests.models import FIXTURES, fixture

ACCELERATORS = [t.name for t in list_targets() if not t.calibrated]
TEXT_MODELS = {"bert", "gpt2", "llama"}
_CACHE = LRUCache()  # shared across the matrix, as a service's kernel cache would be

pytestmark = pytest.mark.models


def _options(model: str, target: str) -> OptimizeOptions:
    buckets = {"batch": [1], "seq": [16]} if model in TEXT_MODELS else {"batch": [1]}
    # The matrix checks legality and bundles, not accuracy: the int8-only DPU may quantise on synthetic inputs.
    synthetic = int8_only(load_target(target))
    return OptimizeOptions(shape_buckets=buckets, measure_latency=False, allow_synthetic_calibration=synthetic)


@pytest.fixture(scope="module")
def results():
    return {}


def _result(results, target: str, model: str):
    if (target, model) not in results:
        results[target, model] = FlexDSAOptimizer(target).optimize(fixture(model), _options(model, target), cache=_CACHE)
    return results[target, model]


@pytest.mark.parametrize("model", list(FIXTURES))
@pytest.mark.parametrize("target", ACCELERATORS)
def test_fixture_on_target(results, target, model, tmp_path):
    result = _result(results, target, model)
    report = result.report
    spec = result.target
    adapter = get_adapter(spec)
    assert report["validation"]["ok"] is True
    assert result.buckets, f"{model} on {target}: expected at least one optimised bucket, got none"
    for bucket in result.buckets:
        part = report["partition"][bucket.name]
        for node in bucket.model.graph:
            if part["placement"][node.name] == "accelerator":
                assert adapter.fallback_reason(node, spec) is None, node.name
        for fallback in part["fallback"]:
            assert fallback["reason"], fallback
        estimate = report["estimates"]["per_bucket"][bucket.name]["on_target"]
        if estimate["roofline_bound_s"] is not None:
            assert estimate["latency_s"] >= estimate["roofline_bound_s"]
    manifest = json.loads(result.artifacts["manifest.json"])
    assert [entry["name"] for entry in manifest["buckets"]] == [b.name for b in result.buckets], manifest["buckets"]
    for entry in manifest["buckets"]:
        assert entry["file"] in result.artifacts
    for name in manifest.get("vendor_files", []):
        assert name in result.artifacts
    for name, content in result.artifacts.items():
        data = content.read_bytes() if hasattr(content, "read_bytes") else content
        if name.endswith(".py"):
            compile(data, name, "exec")
        elif name.endswith(".json"):
            json.loads(data)
        elif name.endswith((".yaml", ".yml")):
            yaml = pytest.importorskip("yaml")
            yaml.safe_load(data)
        elif name.endswith((".ini", ".cfg")) and b"[" in data[:200]:
            configparser.ConfigParser().read_string(data.decode())
        elif name.endswith(".sh"):
            path = tmp_path / name
            path.write_bytes(data)
            subprocess.run(["bash", "-n", str(path)], check=True)
    assert "README.md" in result.artifacts


def test_two_targets_plan_the_same_transformer_differently(results):
    """The same BERT gets different, explained fusion strategies on different parts."""
    plans = {}
    for target in ["cpu-ort", *ACCELERATORS]:
        candidates = _result(results, target, "bert").report["fusions"]["candidates"]
        plans[target] = {c["rule"]: c for c in candidates}
    taken = {t: frozenset(r for r, c in p.items() if c.get("taken")) for t, p in plans.items()}
    assert len(set(taken.values())) >= 2, taken
    for plan in plans.values():
        for candidate in plan.values():
            assert candidate.get("reason"), candidate
