"""flexdsa_runtime stands alone on a device: numpy plus whichever runtime is present. Importing it (every
module, the backends included) loads none of the compiler, the service, torch or onnx; its source imports
only the standard library, numpy and the vendor runtimes; and none of our other packages import it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "flexdsa_runtime"
FORBIDDEN = (
    "flexdsa_core", "service", "workers", "stack", "torch", "onnx", "onnx_ir", "onnxscript", "fastapi",
    "sqlalchemy", "celery", "redis", "pydantic", "httpx",
)  # fmt: skip
# Third-party modules the runtime may import: numpy always, the rest only where installed (lazily).
ALLOWED_THIRD_PARTY = {"numpy", "onnxruntime", "onnxruntime_qnn", "rknnlite", "rknn"}


def _modules() -> list[str]:
    return [
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for path in sorted(RUNTIME.rglob("*.py"))
    ]


def test_importing_the_runtime_loads_nothing_of_the_compiler_or_the_service():
    code = (
        "import sys, importlib\n"
        f"for name in {_modules()!r}: importlib.import_module(name)\n"
        f"print(','.join(m for m in {FORBIDDEN!r} if m in sys.modules))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert loaded.stdout.strip() == "", f"flexdsa_runtime imported {loaded.stdout.strip()}"


def test_the_runtime_source_imports_only_the_standard_library_numpy_and_vendor_runtimes():
    offenders = []
    for path in RUNTIME.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top == "flexdsa_runtime" or top in sys.stdlib_module_names or top in ALLOWED_THIRD_PARTY:
                    continue
                offenders.append(f"{path.relative_to(ROOT)}: {name}")
    assert offenders == []


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_no_other_package_imports_the_runtime():
    users = [
        str(path.relative_to(ROOT))
        for package in ("flexdsa_core", "service", "workers", "stack")
        for path in (ROOT / package).rglob("*.py")
        if "flexdsa_runtime" in _imports(path)
    ]
    assert users == []
