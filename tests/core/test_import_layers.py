"""The compiler core's imports run down its layers (``flexdsa_core.layers``) and close no circle.

* Statically: every import statement of every module of the core, those inside functions and under
  ``TYPE_CHECKING`` included, and ``importlib.import_module`` of a written name. Importing ``a.b.c`` also runs
  ``a/__init__`` and ``a/b/__init__``, so an import reaches those packages too (except the importer's own,
  already running). No module reaches a module of a higher layer, and no circle runs through the core or
  ``bench/`` (which stands above the core: the core never imports it).
* At run time: every module of the core is imported alone, each in a process of its own, top layer first
  (``test_every_module_of_the_core_imports_alone``). One interpreter started for the test loads the
  third-party libraries once and forks the children, two at a time: a fresh interpreter per module pays
  numpy, onnx and onnxruntime each time (1.2 s a module, over a minute for the core on two cores).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from flexdsa_core.layers import LAYERS, layer_of
from tests.import_graph import circles

ROOT = Path(__file__).resolve().parents[2]
CORE = "flexdsa_core"
# Packages whose modules the circle check covers: the core and the benchmarks above it.
PACKAGES = (CORE, "bench")


def _modules(package: str) -> dict[str, Path]:
    """Dotted name -> file of every module of ``package`` (folders without ``__init__.py`` hold scripts run
    elsewhere, e.g. the vendor drivers' common code and the bundle templates: not modules of the package)."""
    found = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        folders = path.relative_to(ROOT).parent
        if not all((ROOT / Path(*folders.parts[: i + 1]) / "__init__.py").is_file() for i in range(len(folders.parts))):
            continue
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported_names(tree: ast.AST, package: str) -> list[str]:
    """Every dotted name ``tree`` imports (relative imports resolved against ``package``), wherever the import
    stands, and the written name of each ``importlib.import_module("...")`` / ``__import__("...")``."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names += [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            function = node.func
            called = function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names.append(node.args[0].value)
    return names


@functools.cache
def import_graph(packages: tuple[str, ...] = PACKAGES) -> dict[str, frozenset[str]]:
    """Module -> the modules of ``packages`` it imports, with the packages above them that the import runs."""
    modules = {name: path for package in packages for name, path in _modules(package).items()}

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for imported in _imported_names(ast.parse(path.read_text()), package):
            target = known(imported)
            while target:
                # The importer's own packages are already running: importing their modules adds no arrow.
                if not f"{name}.".startswith(f"{target}."):
                    graph[name].add(target)
                target = target.rpartition(".")[0]
    return {name: frozenset(targets) for name, targets in graph.items()}


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Each arrow from a module of the core to a module of a higher layer, or out of the core into ``bench``."""
    found = []
    for module, targets in sorted(graph.items()):
        if not _in(module, CORE):
            continue
        for target in sorted(targets):
            if not _in(target, CORE):
                found.append(f"{module} -> {target} (the core imports nothing above it)")
            elif layer_of(target) > layer_of(module):
                found.append(
                    f"{module} ({LAYERS[layer_of(module)][0]}) -> {target} ({LAYERS[layer_of(target)][0]})"
                )
    return found


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def test_every_module_of_the_core_has_a_layer_and_every_entry_a_module():
    modules = _modules(CORE)
    unplaced = []
    for name in modules:
        try:
            layer_of(name)
        except KeyError as error:
            unplaced.append(str(error))
    assert unplaced == []
    relative = {name.removeprefix(CORE).removeprefix(".") for name in modules}
    stale = [entry for _, _, entries in LAYERS for entry in entries if entry not in relative]
    assert stale == [], f"entries of flexdsa_core.layers naming no module: {stale}"


def test_no_arrow_climbs_a_layer():
    assert upward(import_graph()) == []


def test_no_circle_in_the_core_or_the_benchmarks():
    assert circles(import_graph()) == []


def test_the_checks_find_a_planted_arrow_up_and_a_circle():
    graph = {
        "flexdsa_core.accuracy": {"flexdsa_core.options"},  # models -> options: up
        "flexdsa_core.options": {"flexdsa_core.targets", "flexdsa_core.accuracy_target"},  # down
        "flexdsa_core.targets": {"flexdsa_core.accuracy"},  # down, but it closes the circle
        "flexdsa_core.cost": {"bench.run"},  # out of the core
    }
    assert upward(graph) == [
        "flexdsa_core.accuracy (models) -> flexdsa_core.options (options)",
        "flexdsa_core.cost -> bench.run (the core imports nothing above it)",
    ]
    assert circles(graph) == [["flexdsa_core.accuracy", "flexdsa_core.options", "flexdsa_core.targets"]]


def test_an_import_inside_a_function_is_an_arrow():
    tree = ast.parse(
        "def later():\n    from flexdsa_core.targets.spec import x\n    importlib.import_module('flexdsa_core.cli')\n"
    )
    assert _imported_names(tree, CORE) == [
        "flexdsa_core.targets.spec", "flexdsa_core.targets.spec.x", "flexdsa_core.cli",
    ]  # fmt: skip


# Loaded once by the interpreter the children fork from: what every module of the core stands on.
_LIBRARIES = ("numpy", "onnx", "onnx_ir", "onnxruntime", "onnxscript", "pydantic", "sympy", "typer")

# Run as ``python -c``: argv[1] the JSON list of the core's modules in order (the package first), argv[2] the
# folder for the failures, argv[3] the JSON list of libraries to load first. Each child imports one module and
# exits; a failure leaves ``<index>.txt`` (the module's name and the traceback).
_IMPORT_ALONE = r"""
import importlib, json, os, sys, traceback
names, out = json.loads(sys.argv[1]), sys.argv[2]
for library in json.loads(sys.argv[3]):
    try:
        importlib.import_module(library)
    except ImportError:
        pass

def core_loaded():
    return sorted(m for m in sys.modules if m == "flexdsa_core" or m.startswith("flexdsa_core."))

if core_loaded():
    sys.exit(f"the libraries loaded modules of the core: {core_loaded()}")
running = {}

def fork(index, name):
    pid = os.fork()
    if pid == 0:
        try:
            importlib.import_module(name)
        except BaseException:
            with open(os.path.join(out, f"{index}.txt"), "w") as report:
                report.write(f"{name}\n{traceback.format_exc()}")
            os._exit(1)
        os._exit(0)
    running[pid] = name

def reap():
    pid, status = os.wait()
    running.pop(pid)
    return status

# The package alone, from no module of the core; then the package's face, which Python runs before any module of
# it, is the state every other child starts from, exactly as a fresh interpreter importing that module would.
fork(0, names[0])
if reap() != 0:
    sys.exit(0)
importlib.import_module(names[0])
for index, name in enumerate(names[1:], start=1):
    if len(running) >= 2:
        reap()
    fork(index, name)
while running:
    reap()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="each module is imported in a forked process")
def test_every_module_of_the_core_imports_alone():
    """Top layer first, each module in a process of its own: a module that only imports after another one
    did (a circle broken by whichever ran first) fails here. Every import of ``flexdsa_core.x`` runs
    ``flexdsa_core/__init__`` first, so the children fork from an interpreter where only the libraries and
    that package are loaded; the package itself is imported alone before, from no module of the core."""
    names = sorted(_modules(CORE), key=lambda name: (name != CORE, -layer_of(name), name))
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run(
            [sys.executable, "-c", _IMPORT_ALONE, json.dumps(names), out, json.dumps(_LIBRARIES)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]
        failures = [path.read_text() for path in sorted(Path(out).iterdir(), key=lambda p: int(p.stem))]
    assert failures == [], "\n".join(failures)[-8000:]
