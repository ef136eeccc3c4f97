"""A custom target's ``adapter`` names one of the registered adapters, never a module to import.

The attack: ``adapter`` is free text that ``get_adapter`` turned into ``flexdsa_core.targets.<adapter>`` and
imported, so a request could import any module under ``targets/``: a vendor's ``driver.py``, written to run in
the vendor toolchain's own environment only (it puts its folder on ``sys.path`` and imports siblings as
top-level modules). Now a name outside the vendor folders and the shared adapters is refused when the spec is
read, with the valid names, and ``get_adapter`` imports nothing for it even when a spec skipped validation.
"""

import sys

import pytest
from pydantic import ValidationError

from flexdsa_core import RequestSpec, TargetSpec, load_target
from flexdsa_core.errors import TargetNotFoundError
from flexdsa_core.targets import get_adapter
from flexdsa_core.vendors import adapter_names

HOSTILE = ["os", "..evil", "rockchip.driver", "qualcomm.driver", "toolchain_run", "rockchip/../base", ""]


def _custom(adapter: str) -> dict:
    data = load_target("cpu-ort").model_dump(mode="json")
    data.update(name="my-board", adapter=adapter)
    return data


def test_the_registered_adapters_are_the_vendor_folders_and_the_shared_one():
    assert adapter_names() == [
        "accelerator", "amd", "cpu_ort", "huawei", "nvidia", "qualcomm", "rockchip", "xilinx",
    ]  # fmt: skip


@pytest.mark.parametrize("adapter", HOSTILE)
def test_an_unregistered_adapter_is_refused_and_nothing_is_imported(adapter):
    load_target("cpu-ort")  # built-ins and toolchains discovered before the snapshot
    before = set(sys.modules)
    with pytest.raises(ValidationError) as refused:
        RequestSpec.model_validate({"target": _custom(adapter)}).target_spec()
    message = str(refused.value)
    assert f"unknown adapter {adapter!r}" in message
    assert "accelerator, amd, cpu_ort, huawei, nvidia, qualcomm, rockchip, xilinx" in message
    # A spec that skipped validation (``model_construct``) still imports nothing.
    unchecked = TargetSpec.model_construct(
        **{**load_target("cpu-ort").model_dump(), "name": "my-board", "adapter": adapter}
    )
    with pytest.raises(TargetNotFoundError, match=f"unknown adapter {adapter!r}"):
        get_adapter(unchecked)
    assert set(sys.modules) == before


def test_a_misspelt_adapter_is_told_the_closest_name():
    with pytest.raises(ValidationError, match="did you mean 'accelerator'"):
        RequestSpec.model_validate({"target": _custom("acelerator")}).target_spec()


@pytest.mark.parametrize("adapter", ["accelerator", "rockchip", "cpu_ort"])
def test_a_registered_adapter_is_taken(adapter):
    target = RequestSpec.model_validate({"target": _custom(adapter)}).target_spec()
    assert get_adapter(target) is not None
