"""The bundle's generated scripts are template files (flexdsa_core/targets/render.py): each is real Python that
ruff lints, renders with its placeholders filled and compiles, and is rendered by its vendor's adapter. No
script is kept in a string and no source is copied out of another file."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import jinja2.meta
import pytest

from flexdsa_core import FlexDSAOptimizer, OptimizeOptions
from flexdsa_core.cache import LRUCache
from flexdsa_core.targets.render import render
from flexdsa_core.vendors import PACKAGE, module_name, vendor_folders
from tests.models import fixture

TARGETS = Path(__file__).resolve().parents[3] / "flexdsa_core" / "targets"


def _templates() -> list[tuple[str, Path]]:
    found = [(PACKAGE, path) for path in sorted((TARGETS / "templates").glob("*.py"))]
    for vendor in vendor_folders():
        found += [(module_name(vendor), path) for path in sorted((TARGETS / vendor / "templates").glob("*.py"))]
    return found


TEMPLATES = _templates()


def test_the_vendors_scripts_are_template_files():
    names = {path.name for _, path in TEMPLATES}
    assert {"convert_rknn.py", "compile_qnn.py", "run_qnn.py", "run_npu.py", "build_engine.py",
            "quantize_vitis_ai.py"} <= names  # fmt: skip


@pytest.mark.parametrize(("package", "path"), TEMPLATES, ids=[p.relative_to(TARGETS).as_posix() for _, p in TEMPLATES])
def test_a_template_is_python_and_renders_to_python(package, path):
    text = path.read_text()
    ast.parse(text)  # the template itself: the {{ name }} placeholders stand where Python takes an expression
    names = jinja2.meta.find_undeclared_variables(jinja2.Environment().parse(text))
    assert names, f"{path.name} has no placeholder: it need not be a template"
    rendered = render(package, path.name, **{name: repr(f"<{name}>") for name in names})
    compile(rendered, path.name, "exec")
    assert "{{" not in rendered
    with pytest.raises(jinja2.UndefinedError):  # a value the adapter forgets is an error, not an empty string
        render(package, path.name, **{name: "None" for name in sorted(names)[1:]})


def test_ruff_lints_the_templates():
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    if not Path(ruff).is_file():
        pytest.skip("ruff is not installed")
    done = subprocess.run([ruff, "check", *(str(p) for _, p in TEMPLATES)], capture_output=True, text=True,
                          cwd=TARGETS.parents[1])  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def _scripts_in_strings(source: str) -> int:
    """String constants of ``source`` that read as a Python program: an import line and a function."""
    found = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if re.search(r"^(import \w|from [\w.]+ import )", text, re.M) and re.search(r"^def \w+\(", text, re.M):
                found += 1
    return found


def test_no_module_keeps_a_script_in_a_string():
    modules = [path for path in TARGETS.rglob("*.py") if "templates" not in path.parts]
    assert modules, f"expected the target adapters' modules under {TARGETS}; found none"
    for path in modules:
        assert _scripts_in_strings(path.read_text()) == 0, f"{path.relative_to(TARGETS)} keeps a script in a string"


def test_the_check_finds_a_script_in_a_string():
    assert _scripts_in_strings("S = \'\'\'import sys\n\n\ndef main():\n    return 0\n\'\'\'\n") == 1
    assert _scripts_in_strings('"""A docstring that says: import nothing."""\n') == 0


@pytest.mark.parametrize("target", ["rockchip-rk3588", "qualcomm-sm8650", "amd-xdna2", "xilinx-kv260",
                                    "nvidia-orin-nano"])  # fmt: skip
def test_the_adapter_ships_its_templates_rendered(target):
    """Each vendor's templates (and the shared one, for the two Vitis AI targets) are what its bundle ships."""
    options = OptimizeOptions(measure_latency=False, calibrate=False, allow_synthetic_calibration=True,
                              shape_buckets={"batch": [1]})  # fmt: skip
    result = FlexDSAOptimizer(target).optimize(fixture("resnet"), options, cache=LRUCache())
    spec = result.target
    expected = {path.name for path in (TARGETS / spec.adapter / "templates").glob("*.py")}
    if spec.adapter in ("amd", "xilinx"):
        expected.add(f"quantize_{'quark' if spec.adapter == 'amd' else 'kv260'}.py")
    assert expected
    for name in expected:
        shipped = result.artifacts[name]
        text = (shipped if isinstance(shipped, bytes) else shipped.read_bytes()).decode()
        compile(text, name, "exec")
        assert "{{" not in text and "BUCKETS = [" in text, name
