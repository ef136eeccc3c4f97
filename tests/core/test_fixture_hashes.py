"""Refactoring guard: every fixture, optimised on a fixed set of targets and precisions, gives models whose
bytes hash to the values in ``fixture_hashes.json``, committed before the compiler core was reshaped
(issue 25). cpu-ort's output depends on the CPU by design (``cpu_class``), so its entries are kept per CPU
class. A change that moves code without meaning to change what it produces must keep this test green;
a change that means to change the output regenerates the file and says why in its commit:

    PYTHONPATH=. python -m tests.core.test_fixture_hashes --write

What pins the output: ``calibrate=False`` makes cpu-ort cost kernels with the roofline instead of timing
them on this machine (a timed choice between two fusions can land either way on a loaded machine, see
``test_determinism.py``), and ``measure_latency=False`` leaves out the whole-model never-slower check (a
timed rollback). Everything left is a function of the model bytes, the options and the code. No vendor
toolchain folder is given, so accelerator targets produce their bundle without compiling it. Only the
``.onnx`` artifacts are hashed: the report holds timings, the manifest hashes the report, and the vendor
scripts' wording is not what this guards.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sys
from pathlib import Path

import pytest

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.cache import LRUCache
from flexdsa_core.options import AccuracyTarget
from tests.models import FIXTURES

pytestmark = pytest.mark.models

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("fixture_hashes.json")
MODELS = {**{name: path for name, path in FIXTURES.items()}, **{
    f"examples/{path.stem}": path for path in sorted((ROOT / "examples").glob("*.onnx"))
}}
# (target, precision): cpu-ort in each precision it takes, and accelerators whose adapters legalise
# differently (Rockchip, Qualcomm, Huawei, NVIDIA).
CONFIGS = [
    ("cpu-ort", "fp32"),
    ("cpu-ort", "int8"),
    ("cpu-ort", "mixed"),
    ("rockchip-rk3588", "fp32"),
    ("qualcomm-sm8650", "int8"),
    ("huawei-ascend310b", "fp32"),
    ("nvidia-orin-nano", "fp16"),
]


def model_hashes(target: str, precision: str, model: Path) -> dict[str, str]:
    """sha256 of each ``.onnx`` artifact of one pinned optimisation."""
    options = OptimizeOptions(
        measure_latency=False, calibrate=False, precision=precision, allow_synthetic_calibration=True,
        # Synthetic samples judge numerics only; a looser target keeps int8 layers in the guarded output
        # where random inputs would otherwise send the search back to float. Every output is judged by cosine
        # (``top1_outputs=[]``): the random-weight classifiers' near-tied logits make top-1 meaningless here.
        accuracy=AccuracyTarget(min_cosine=0.95, min_top1=0.9, top1_outputs=[]), precision_fallback="fp32",
    )
    result = FlexDSAOptimizer(target).optimize(model, options, cache=LRUCache())
    return {
        name: hashlib.sha256(content if isinstance(content, bytes) else content.read_bytes()).hexdigest()
        for name, content in sorted(result.artifacts.items())
        if name.endswith(".onnx")
    }


def cpu_class() -> str:
    """What makes cpu-ort's output differ between machines, by design: the width ONNX Runtime's blocked
    (NCHWc) layout takes, which the offline layout bakes into ``model.onnx`` (AVX-512: 16 floats, else 8), and
    whether int8 GEMMs have a dot-product instruction (without one weights take 7 bits, ``reduce_range``)."""
    from flexdsa_core.precision.formats import cpu_int8_features

    features = cpu_int8_features()
    width = "avx512" if "avx512f" in features["flags"] else "avx2"
    return f"{width}-{'int8dot' if features['int8_dot_product'] else 'no-int8dot'}"


def _key(target: str, precision: str, model: str) -> str:
    """The golden entry of a case: cpu-ort's per CPU class (``cpu_class``), the accelerators' machine-free."""
    suffix = f"@{cpu_class()}" if target == "cpu-ort" else ""
    return f"{target}/{precision}/{model}{suffix}"


CASES = [(t, p, m) for t, p in CONFIGS for m in sorted(MODELS)]


@pytest.mark.parametrize(("target", "precision", "model"), CASES, ids=[_key(*c) for c in CASES])
def test_outputs_match_the_committed_hashes(target, precision, model):
    golden = json.loads(GOLDEN.read_text())
    key = _key(target, precision, model)
    if key not in golden:
        pytest.fail(
            f"no committed hashes for {key}: cpu-ort's output depends on the CPU class ({cpu_class()}), and none "
            "were written on a machine of this class. Check out a commit whose output you trust and run "
            "`PYTHONPATH=. python -m tests.core.test_fixture_hashes --write` there, then commit the entries.",
            pytrace=False,
        )
    expected = golden[key]
    assert model_hashes(target, precision, MODELS[model]) == expected


def test_the_golden_file_covers_every_case():
    """Every case has an entry (cpu-ort's for this machine's CPU class), and no entry names a case that is gone."""
    golden = set(json.loads(GOLDEN.read_text()))
    assert {_key(*c) for c in CASES} <= golden
    assert {key.split("@")[0] for key in golden} == {_key(*c).split("@")[0] for c in CASES}


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.core.test_fixture_hashes --write")
    logging.disable(logging.WARNING)
    # Entries of other CPU classes stay: only this machine's (and the machine-free ones) are written.
    table = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    table.update({_key(*case): model_hashes(case[0], case[1], MODELS[case[2]]) for case in CASES})
    GOLDEN.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(CASES)} cases to {GOLDEN.name} (cpu-ort for {cpu_class()})")
