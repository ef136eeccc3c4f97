"""Built-in targets, one folder per vendor (``targets/<vendor>/``, see ``vendors``): the specs are its ``*.json``,
its adapter the ``ADAPTER`` its package exports, its toolchain the one whose ``targets`` name the spec.
``register_vendor`` adds a vendor package kept elsewhere (a plug-in, a test's toy target), laid out the same.
"""

from __future__ import annotations

import importlib
import json
from functools import cache

from flexdsa_core.compare import unknown_target_message
from flexdsa_core.errors import TargetNotFoundError
from flexdsa_core.targets.base import BucketModel, Legalized, PlatformAdapter
from flexdsa_core.targets.spec import TargetSpec, op_key
from flexdsa_core.toolchains import discover_toolchains, get_toolchain
from flexdsa_core.vendors import (
    adapter_names,
    module_name,
    register,
    spec_files,
    unknown_adapter_message,
    unregister,
    vendor_folders,
)

__all__ = [
    "BucketModel",
    "Legalized",
    "PlatformAdapter",
    "TargetSpec",
    "describe_checks",
    "get_adapter",
    "list_targets",
    "load_target",
    "op_key",
    "register_vendor",
    "unregister_vendor",
]


@cache
def _builtin_specs() -> dict[str, TargetSpec]:
    serving = {
        name: toolchain.name for toolchain in discover_toolchains().values() for name in toolchain.targets
    }
    specs = {}
    for vendor, folder in vendor_folders().items():
        for entry in spec_files(folder):
            data = json.loads(entry.read_text())
            told = sorted({"adapter", "toolchain"} & set(data))
            if told:
                raise ValueError(
                    f"{vendor}/{entry.name} names {told}: the folder and the toolchain's targets say that"
                )
            data.update(adapter=vendor, toolchain=serving.get(data.get("name")))
            spec = TargetSpec.model_validate(data)
            if spec.name in specs:
                raise ValueError(f"target {spec.name!r} is defined twice (second in {vendor}/{entry.name})")
            specs[spec.name] = spec
    return specs


def register_vendor(package: str) -> str:
    """Add the vendor package ``package`` (an importable name) as if it were a folder of ``targets/``: its specs
    are listed and loaded by name, its ``ADAPTER`` (with the pipeline it lists) serves them. Returns the vendor
    name. The specs read so far are forgotten, so the next ``load_target`` sees the new ones."""
    name = register(package)
    _builtin_specs.cache_clear()
    return name


def unregister_vendor(name: str) -> None:
    """Undo ``register_vendor`` (a test's toy target, after the test)."""
    unregister(name)
    _builtin_specs.cache_clear()


def list_targets() -> list[TargetSpec]:
    return sorted(_builtin_specs().values(), key=lambda s: s.name)


def load_target(name: str) -> TargetSpec:
    try:
        return _builtin_specs()[name]
    except KeyError:
        raise TargetNotFoundError(unknown_target_message(name, sorted(_builtin_specs()))) from None


def get_adapter(target: TargetSpec) -> PlatformAdapter:
    """The adapter of a built-in target's vendor folder; a custom spec may also name a shared one
    (``accelerator``: a generic accelerator with a CPU beside it). Only a registered name is imported, even
    for a spec built without validation (``model_construct``)."""
    if target.adapter not in adapter_names():
        raise TargetNotFoundError(f"Target {target.name!r}: {unknown_adapter_message(target.adapter)}.")
    module = importlib.import_module(module_name(target.adapter))
    if getattr(module, "ADAPTER", None) is None:
        raise TargetNotFoundError(
            f"Target {target.name!r} names adapter {target.adapter!r}, whose module exports no ADAPTER: a "
            f"vendor folder or shared adapter module (flexdsa_core/targets/{target.adapter}) must export one."
        )
    return module.ADAPTER


def describe_checks(target: TargetSpec, toolchain_root=None) -> str:
    """How a bundle for ``target`` is checked here, in one line (CLI and GET /targets)."""
    checks = ["every model validated against the original in ONNX Runtime"]
    if target.calibrated:
        checks.append("latency measured here (never slower)")
    else:
        checks.append(f"op legality against the sourced {target.name} op table")
    if target.toolchain:
        toolchain = get_toolchain(target.toolchain)
        ready = toolchain_root is not None and toolchain.is_ready(toolchain_root)
        checks.append(
            toolchain.checks.format(name=target.toolchain)
            + ("" if ready else f" once installed (`{toolchain.install_command()}`)")
        )
    elif not target.calibrated:
        checks.append("vendor scripts checked for syntax (the vendor compiler does not install here)")
    return "; ".join(checks)
