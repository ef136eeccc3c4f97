"""A job loads only its own target's adapter: listing targets reads every vendor's toolchain, not its adapter
(``vendors.lazy_exports``). Each other vendor's adapter, with its templates and legalisations, would cost a
one-node job's memory for nothing (about 3 MiB for the five of them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from flexdsa_core.targets import get_adapter, list_targets, load_target
from flexdsa_core.vendors import lazy_exports, vendor_folders

ROOT = Path(__file__).resolve().parents[3]

# In a fresh interpreter: list every target and build cpu-ort's registry, then say which adapter modules loaded.
PROBE = """
import json, sys
from flexdsa_core.registry import Registry
from flexdsa_core.targets import list_targets
names = [t.name for t in list_targets()]
Registry("cpu-ort").check()
print(json.dumps({"targets": names,
                  "adapters": sorted(m for m in sys.modules if m.startswith("flexdsa_core.targets.")
                                     and m.endswith(".adapter"))}))
"""


def test_listing_targets_and_building_one_registry_loads_only_that_adapter():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, check=True)
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert {"cpu-ort", "rockchip-rk3588", "amd-xdna2", "qualcomm-sm8650"} <= set(seen["targets"])
    assert seen["adapters"] == ["flexdsa_core.targets.cpu_ort.adapter"]


@pytest.mark.parametrize("target", [t.name for t in list_targets()])
def test_every_vendor_still_exports_its_adapter(target):
    spec = load_target(target)
    adapter = get_adapter(spec)
    package = sys.modules[f"flexdsa_core.targets.{spec.adapter}"]
    assert package.ADAPTER is adapter
    assert spec.adapter in vendor_folders()


def test_a_name_the_package_does_not_export_is_an_attribute_error():
    getter = lazy_exports("flexdsa_core.targets.cpu_ort", ADAPTER="adapter")
    with pytest.raises(AttributeError, match="no attribute 'TOOLCHAIN'"):
        getter("TOOLCHAIN")
