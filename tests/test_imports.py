"""The import graph of our packages: no circle anywhere (a module never reaches itself through its imports,
lazy ones inside functions included), and every arrow points down the layers ``flexdsa_core`` <- ``service``
<- ``workers`` <- ``stack`` (the composition root, where the embedded worker is plugged into the API)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.import_graph import circles

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("flexdsa_core", "service", "workers", "stack")
# The layers, lowest first: a module may import its own layer and those below it, never one above.
LAYERS = ("flexdsa_core", "service", "workers", "stack")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            for target in targets:
                resolved = resolve(target)
                if resolved and resolved != name:
                    graph[name].add(resolved)
    return graph


def test_no_import_circle():
    assert circles(_graph()) == []


def test_the_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    def layer(module: str) -> int:
        return LAYERS.index(module.split(".")[0])

    return sorted((a, b) for a, targets in graph.items() for b in targets if layer(b) > layer(a))


def test_every_arrow_points_down_the_layers():
    """flexdsa_core <- service <- workers <- stack: the core imports none of the others, the service never
    the workers (jobs go out by task name, the embedded worker is handed in by the composition root)."""
    assert _upward(_graph()) == []


def test_the_check_finds_an_upward_arrow():
    assert _upward({"service.jobs": {"workers.dispatch"}, "workers.app": {"service.jobs"}}) == [
        ("service.jobs", "workers.dispatch")
    ]


# The optimizer's stages, which the targets serve and must never reach back into: a target (spec, adapter,
# legalisations) and what is run with it (vendor_runs/: estimate, exploration, toolchain run, manifest) are
# leaves the stages call, so what both need sits in targets/ or below.
STAGES = ("flexdsa_core.optimizer", "flexdsa_core.subgraph_mapper", "flexdsa_core.precision",
          "flexdsa_core.fusion_switcher", "flexdsa_core.registry", "flexdsa_core.verify", "flexdsa_core.optimize_run",
          "flexdsa_core.compilation", "flexdsa_core.pipeline", "flexdsa_core.bundle")  # fmt: skip
TARGET_PACKAGES = ("flexdsa_core.targets", "flexdsa_core.toolchains", "flexdsa_core.vendor_runs")


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == package or module.startswith(f"{package}.") for package in packages)


def _up_from_targets(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted(
        (a, b) for a, targets in graph.items() if _within(a, TARGET_PACKAGES) for b in targets if _within(b, STAGES)
    )


def test_no_arrow_runs_up_from_the_targets_into_the_stages():
    """targets/, toolchains/ and vendor_runs/ import neither the optimizer nor its stages (lazy imports inside
    functions included): the Subgraph Mapper's device names live in targets.spec, accuracy scoring in accuracy."""
    assert _up_from_targets(_graph()) == []


def test_the_check_finds_an_arrow_up_from_the_targets():
    graph = {"flexdsa_core.targets.accelerator": {"flexdsa_core.subgraph_mapper"},
             "flexdsa_core.targets.rockchip": {"flexdsa_core.precision.formats"},
             "flexdsa_core.optimizer": {"flexdsa_core.targets"}}  # fmt: skip
    assert _up_from_targets(graph) == [
        ("flexdsa_core.targets.accelerator", "flexdsa_core.subgraph_mapper"),
        ("flexdsa_core.targets.rockchip", "flexdsa_core.precision.formats"),
    ]


# A vendor is one folder (targets/<vendor>/: spec, adapter, legalisations, toolchain, driver, templates), found
# by discovery: nothing outside it imports into it (the core asks get_adapter / get_toolchain), and no vendor
# imports another's folder (what two vendors share, such as _vitis_ai, sits in targets/ beside them).
def _vendor_packages() -> tuple[str, ...]:
    from flexdsa_core.vendors import module_name, vendor_folders

    return tuple(module_name(vendor) for vendor in vendor_folders())


def _into_vendors(graph: dict[str, set[str]], vendors: tuple[str, ...]) -> list[tuple[str, str]]:
    def vendor_of(module: str) -> str | None:
        return next((v for v in vendors if module == v or module.startswith(f"{v}.")), None)

    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if vendor_of(b) is not None and vendor_of(a) != vendor_of(b))  # fmt: skip


def test_a_vendor_is_reached_only_through_discovery():
    vendors = _vendor_packages()
    assert {"flexdsa_core.targets.rockchip", "flexdsa_core.targets.cpu_ort"} <= set(vendors)
    assert _into_vendors(_graph(), vendors) == []


def test_the_check_finds_an_arrow_into_a_vendor():
    vendors = ("flexdsa_core.targets.qualcomm", "flexdsa_core.targets.xilinx")
    graph = {"flexdsa_core.vendor_runs.deploy_manifest": {"flexdsa_core.targets.qualcomm.adapter"},
             "flexdsa_core.targets.xilinx.adapter": {"flexdsa_core.targets.qualcomm", "flexdsa_core.targets.base"},
             "flexdsa_core.targets.qualcomm": {"flexdsa_core.targets.qualcomm.adapter"}}  # fmt: skip
    assert _into_vendors(graph, vendors) == [
        ("flexdsa_core.targets.xilinx.adapter", "flexdsa_core.targets.qualcomm"),
        ("flexdsa_core.vendor_runs.deploy_manifest", "flexdsa_core.targets.qualcomm.adapter"),
    ]
