"""A rockchip bundle as the toolchain ships it, made without the toolchain: ``mixed_bundle``'s folder (the sensitive
MLP under precision mixed, 32 calibration samples in ``dataset.txt``) with a placeholder ``model.batch1.rknn`` and
its build record written by the driver's own ``build_record`` over the bundle's calibration files, the manifest then
completed again over every file as the optimiser completes it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from flexdsa_core.targets import load_target
from flexdsa_core.vendor_runs.deploy_manifest import complete_manifest
from tests.core.targets import _bundle_checks as checks

DRIVER = Path(__file__).resolve().parents[2] / "flexdsa_core" / "targets" / "rockchip" / "driver.py"
RKNN = "model.batch1.rknn"
CONFIG = {"target_platform": "rk3588", "optimization_level": 3, "quantized_dtype": "w8a8",
          "quantized_algorithm": "mmse", "quantized_method": "channel"}  # fmt: skip


def driver():
    spec = importlib.util.spec_from_file_location("rockchip_driver_for_runtime_tests", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sample_files(folder: Path) -> list[str]:
    """The bundle's calibration samples (one input, ``x``), in ``dataset.txt``'s order."""
    return [line.strip() for line in (folder / "dataset.txt").read_text().splitlines() if line.strip()]


def shipped(
    folder: Path, *, precision: str = "int8", calibrated=range(24), judged=range(24, 32), **options
) -> dict:
    """Make ``folder`` a bundle that ships ``model.batch1.rknn`` built at ``precision`` on the samples
    ``calibrated`` and judged on ``judged`` (indices into dataset.txt); ``options`` go to the record as the driver's
    options would (``hybrid_steps``, ``hybrid_mapped``, ``auto_hybrid``). Returns the record."""
    report = checks.mixed_bundle("rockchip-rk3588", folder)
    files = sample_files(folder)
    rows = [{"x": str(folder / files[i])} for i in calibrated]
    record = driver().build_record(
        RKNN, ["x"], [[1, 16]],
        {"dtype": "int8" if precision == "int8" else "float16", "config": CONFIG, "dataset": rows, **options},
        [{"x": str(folder / files[i])} for i in judged],
    )  # fmt: skip
    (folder / RKNN).write_bytes(b"placeholder: the .rknn the toolchain compiled")
    write_record(folder, record, report)
    return record


def write_record(folder: Path, record: dict, report: dict | None = None) -> None:
    """Write ``record`` beside the .rknn and complete the manifest again over every file (new checksums)."""
    (folder / (RKNN + ".build.json")).write_text(json.dumps(record, indent=1))
    recomplete(folder, report)


def recomplete(folder: Path, report: dict | None = None) -> None:
    report = report or json.loads((folder / "report.json").read_text())
    artifacts = {p.relative_to(folder).as_posix(): p for p in folder.rglob("*") if p.is_file()}
    artifacts["manifest.json"] = (folder / "manifest.json").read_bytes()
    (folder / "manifest.json").write_bytes(
        complete_manifest(artifacts, report, load_target("rockchip-rk3588"))
    )
