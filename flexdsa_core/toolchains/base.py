"""One vendor toolchain: its own virtual environment, installed on request, and a driver run in it.

Layout under the toolchain root (``~/.cache/flexdsa/toolchains`` by default, or the service's setting)::

    <root>/<name>/venv/          the environment (``python -m venv`` + pip)
    <root>/<name>/ready.json     written last by ``install``: versions of what was installed

A toolchain is *ready* only when ``ready.json`` exists and names the same requirements as the code
(a changed pin means reinstall), so a half-finished install never counts.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from flexdsa_core.errors import FlexDSAError

DEFAULT_TIMEOUT_S = 1800.0
# The cosine to the original model's outputs that a vendor simulator's or emulator's outputs must reach: vendor
# compilers run float graphs in fp16, so the bar is an accuracy target, not fp32 tolerances.
MIN_COSINE = 0.99


class ToolchainError(FlexDSAError):
    """A vendor toolchain is missing, failed to install, or its compiler failed on the model."""

    code = "toolchain_failed"


@dataclass(frozen=True)
class ToolchainStatus:
    name: str
    ready: bool
    path: str
    versions: dict[str, str] = field(default_factory=dict)
    detail: str = ""

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "ready": self.ready,
            "path": self.path,
            "versions": self.versions,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class Toolchain:
    """``requirements`` are installed in order, one pip call per group (e.g. the CPU torch wheel first,
    so that the vendor package's own torch requirement is already met and no CUDA build is fetched)."""

    name: str
    description: str
    targets: tuple[str, ...]
    requirements: tuple[tuple[str, ...], ...]
    driver: str  # path of the driver script, beside the toolchain in its vendor folder (targets/<vendor>/driver.py)
    # Distribution names whose installed versions ready.json records and status() shows.
    version_of: tuple[str, ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    # How a bundle is checked with it, for `flexdsa targets` and GET /targets ({name}: the toolchain's name).
    checks: str = "compiled and run by the vendor toolchain {name!r}"

    # -- where ------------------------------------------------------------------------------------
    def home(self, root: Path) -> Path:
        return Path(root) / self.name

    def python(self, root: Path) -> Path:
        return self.home(root) / "venv" / "bin" / "python"

    def driver_path(self) -> Path:
        return Path(self.driver)

    def install_command(self) -> str:
        """What a user runs to make this toolchain ready (printed in bundles when it is not)."""
        return f"flexdsa toolchains install {self.name}"

    # -- state ------------------------------------------------------------------------------------
    def status(self, root: Path) -> ToolchainStatus:
        marker = self.home(root) / "ready.json"
        path = str(self.home(root))
        if not marker.is_file():
            return ToolchainStatus(self.name, False, path, detail=f"not installed: run `{self.install_command()}`")
        try:
            recorded = json.loads(marker.read_text())
        except (OSError, ValueError):
            return ToolchainStatus(self.name, False, path, detail="ready.json unreadable: reinstall")
        if recorded.get("requirements") != [list(group) for group in self.requirements]:
            return ToolchainStatus(
                self.name, False, path, detail=f"installed with other pins: run `{self.install_command()}`"
            )
        if not self.python(root).exists():
            return ToolchainStatus(self.name, False, path, detail="environment missing: reinstall")
        return ToolchainStatus(self.name, True, path, recorded.get("versions", {}), "ready")

    def is_ready(self, root: Path | None) -> bool:
        return root is not None and self.status(root).ready

    # -- install ----------------------------------------------------------------------------------
    def install(self, root: Path, *, log: Callable[[str], None] = print, python: str | None = None) -> ToolchainStatus:
        """Create (or recreate) the environment and install the pinned requirements into it."""
        home = self.home(root)
        venv = home / "venv"
        (home / "ready.json").unlink(missing_ok=True)
        if venv.exists():
            shutil.rmtree(venv)
        home.mkdir(parents=True, exist_ok=True)
        log(f"[{self.name}] creating {venv}")
        _run([python or sys.executable, "-m", "venv", str(venv)], log)
        pip = [str(self.python(root)), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        for group in self.requirements:
            log(f"[{self.name}] pip install {' '.join(group)}")
            _run([*pip, *group], log)
        versions = self._versions(root)
        (home / "ready.json").write_text(
            json.dumps(
                {"requirements": [list(g) for g in self.requirements], "versions": versions,
                 "installed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                indent=2,
            )
        )  # fmt: skip
        return self.status(root)

    def _versions(self, root: Path) -> dict[str, str]:
        if not self.version_of:
            return {}
        code = (
            "import json, importlib.metadata as m\n"
            f"names = {list(self.version_of)!r}\n"
            "out = {}\n"
            "for n in names:\n"
            "    try: out[n] = m.version(n)\n"
            "    except m.PackageNotFoundError: out[n] = None\n"
            "print(json.dumps(out))\n"
        )
        done = subprocess.run([str(self.python(root)), "-c", code], capture_output=True, text=True, check=True)
        return json.loads(done.stdout)

    # -- run --------------------------------------------------------------------------------------
    def run(self, root: Path, request: dict, *, workdir: Path, timeout_s: float | None = None) -> dict:
        """Run the driver on ``request`` in the toolchain's environment; returns its ``result.json``.

        Raises ``ToolchainError`` (with the tail of the driver's log) when it is not ready, crashes,
        times out or answers ``ok: false``."""
        status = self.status(root)
        if not status.ready:
            raise ToolchainError(f"Toolchain {self.name!r} is not ready ({status.detail}).")
        folder = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=workdir))
        request_path, result_path = folder / "request.json", folder / "result.json"
        request_path.write_text(json.dumps(request, indent=2, default=str))
        command = [str(self.python(root)), str(self.driver_path()), str(request_path), str(result_path)]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout_s or self.timeout_s, cwd=folder,
                preexec_fn=_vendor_address_space, env=vendor_environment(self.python(root), folder),
            )
        except subprocess.TimeoutExpired:
            raise ToolchainError(
                f"The {self.name} toolchain did not finish within {timeout_s or self.timeout_s:.0f} s."
            ) from None
        log_tail = (done.stdout + done.stderr)[-4000:]
        if not result_path.is_file():
            raise ToolchainError(
                f"The {self.name} toolchain exited with status {done.returncode} without a result. "
                f"Last lines of its log:\n{log_tail}"
            )
        result = json.loads(result_path.read_text())
        result.setdefault("log_tail", log_tail)
        if not result.get("ok"):
            raise ToolchainError(
                f"The {self.name} toolchain failed: {result.get('error') or 'no reason given'}",
                details={"log_tail": log_tail},
            )
        return result


def vendor_environment(python: Path, folder: Path) -> dict[str, str]:
    """The whole environment a vendor compiler runs in: its own interpreter's folder first on a default PATH,
    and its run's folder as home and temporary folder. Nothing of the caller's: the compiler parses the
    untrusted model, and the service's secrets (database URL, object-store keys, operator token) are not its
    business. Made up here, never read from the caller (the core reads no environment variables)."""
    return {
        "PATH": os.pathsep.join((str(python.parent), os.defpath)),
        "HOME": str(folder),
        "TMPDIR": str(folder),
        "LANG": "C.UTF-8",
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
    }


def _vendor_address_space() -> None:
    """A vendor compiler (torch, its own runtime) gets back the address space a job process may have capped
    for the model's work (a soft limit): its needs are the toolchain's, not the model's."""
    try:
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def _run(command: list[str], log: Callable[[str], None]) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        raise ToolchainError(f"`{' '.join(command)}` failed (exit {done.returncode}):\n{tail}")
