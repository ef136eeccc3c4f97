"""The compiler core is a pure library: importing it (and running its CLI module) pulls in no service stack."""

import subprocess
import sys
from pathlib import Path

FORBIDDEN = ("fastapi", "starlette", "celery", "sqlalchemy", "redis", "kombu", "service", "workers")


def test_core_imports_no_service_packages():
    code = (
        "import sys, flexdsa_core, flexdsa_core.optimizer, flexdsa_core.cli;"
        f"print(','.join(m for m in {FORBIDDEN!r} if m in sys.modules))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert loaded == "", f"flexdsa_core imported {loaded}"


def test_core_source_reads_no_environment():
    core = Path(__file__).resolve().parents[2] / "flexdsa_core"
    offenders = [
        str(path.relative_to(core))
        for path in core.rglob("*.py")
        if "os.environ" in path.read_text() or "os.getenv" in path.read_text()
    ]
    assert offenders == []
