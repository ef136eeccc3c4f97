"""Built-in targets: specs from ``data/*.json``, adapters found by module name (``ADAPTER`` in each module)."""

from __future__ import annotations

import importlib
import json
from functools import cache
from importlib import resources

from flexdsa_core.errors import TargetNotFoundError
from flexdsa_core.targets.base import BucketModel, Legalized, PlatformAdapter
from flexdsa_core.targets.spec import TargetSpec, op_key

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
]


@cache
def _builtin_specs() -> dict[str, TargetSpec]:
    specs = {}
    for entry in resources.files("flexdsa_core.targets").joinpath("data").iterdir():
        if entry.name.endswith(".json"):
            spec = TargetSpec.model_validate(json.loads(entry.read_text()))
            specs[spec.name] = spec
    return specs


def list_targets() -> list[TargetSpec]:
    return sorted(_builtin_specs().values(), key=lambda s: s.name)


def load_target(name: str) -> TargetSpec:
    try:
        return _builtin_specs()[name]
    except KeyError:
        from flexdsa_core.compare import unknown_target_message

        raise TargetNotFoundError(unknown_target_message(name, sorted(_builtin_specs()))) from None


def get_adapter(target: TargetSpec) -> PlatformAdapter:
    try:
        module = importlib.import_module(f"flexdsa_core.targets.{target.adapter}")
    except ModuleNotFoundError:
        raise TargetNotFoundError(
            f"Target {target.name!r} names adapter {target.adapter!r}, which does not exist "
            f"(expected flexdsa_core/targets/{target.adapter}.py)."
        ) from None
    return module.ADAPTER


def describe_checks(target: TargetSpec, toolchain_root=None) -> str:
    """How a bundle for ``target`` is checked here, in one line (CLI and GET /targets)."""
    checks = ["every model validated against the original in ONNX Runtime"]
    if target.calibrated:
        checks.append("latency measured here (never slower)")
    else:
        checks.append(f"op legality against the sourced {target.name} op table")
    if target.toolchain:
        from flexdsa_core.toolchains import get_toolchain

        toolchain = get_toolchain(target.toolchain)
        ready = toolchain_root is not None and toolchain.is_ready(toolchain_root)
        checks.append(
            toolchain.checks.format(name=target.toolchain)
            + ("" if ready else f" once installed (`{toolchain.install_command()}`)")
        )
    elif not target.calibrated:
        checks.append("vendor scripts checked for syntax (the vendor compiler does not install here)")
    return "; ".join(checks)
