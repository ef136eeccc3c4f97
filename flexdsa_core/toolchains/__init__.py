"""Vendor toolchains: each vendor compiler in a virtual environment of its own, run as a subprocess.

Vendor compilers (rknn-toolkit2, onnxruntime-qnn, amd-quark) pin old numpy/onnx/protobuf, so none may
enter the project's environment and the core never imports them. A toolchain is declared in its vendor's folder
(``targets/<vendor>/toolchain.py`` exporting ``TOOLCHAIN``, found by discovery like fusion rules and targets):
the pip requirements of its environment and the vendor's ``driver.py`` beside it, run *inside* that
environment. What is shared sits here: the ``Toolchain`` machinery (``base``) and what every driver imports
(``drivers/_driver_common.py``).

The contract between the core and a driver is one JSON file each way::

    <venv>/bin/python targets/<vendor>/driver.py request.json result.json

``request.json``: ``{"action": "compile", "target": {...TargetSpec...}, "out_dir": "...",
"buckets": [{"name": "b1", "onnx": "/abs/model.b1.onnx", "inputs": {"x": "/abs/x.npy"}}], "options": {...}}``.

``result.json``: ``{"ok": true, "versions": {...}, "buckets": [{"name": "b1", "artifacts": ["model.b1.rknn"],
"placement": {"node name": "accelerator" | "cpu"}, "outputs": {"y": "/abs/y.npy"}, "log": "..."}],
"error": null}``. Artifacts are file names inside ``out_dir``; ``placement`` is what the vendor tool
decided, keyed by the ONNX node names it was given; ``outputs`` are its outputs on the given inputs
(simulator or emulator), compared by the core with the original model's.
"""

from __future__ import annotations

import importlib
from functools import cache

from flexdsa_core.toolchains.base import Toolchain, ToolchainError, ToolchainStatus
from flexdsa_core.vendors import has_toolchain, module_name, vendor_folders

__all__ = ["Toolchain", "ToolchainError", "ToolchainStatus", "discover_toolchains", "get_toolchain"]


@cache
def discover_toolchains() -> dict[str, Toolchain]:
    found: dict[str, Toolchain] = {}
    for vendor, folder in vendor_folders().items():
        if has_toolchain(folder):
            toolchain = importlib.import_module(module_name(vendor, "toolchain")).TOOLCHAIN
            if toolchain.name in found:
                raise ToolchainError(
                    f"Toolchain {toolchain.name!r} is declared twice (second in targets/{vendor}/)."
                )
            found[toolchain.name] = toolchain
    return dict(sorted(found.items()))


def get_toolchain(name: str) -> Toolchain:
    toolchains = discover_toolchains()
    if name not in toolchains:
        raise ToolchainError(f"Unknown toolchain {name!r}. Known: {', '.join(toolchains) or 'none'}.")
    return toolchains[name]
