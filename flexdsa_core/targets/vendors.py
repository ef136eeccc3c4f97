"""The vendor folders under ``targets/``: one package per vendor, found by discovery.

A vendor folder holds its spec(s) (``*.json``), its adapter (the package exports ``ADAPTER``), its legalisations,
and where a vendor compiler installs, its toolchain (``toolchain.py`` exporting ``TOOLCHAIN``), the driver run in
the toolchain's own environment (``driver.py``) and the bundle's generated scripts as template files
(``templates/``). Nothing names a vendor by string: a spec's adapter is the folder it sits in, its toolchain the
one whose ``targets`` list it. Reads folders only; importing a vendor is left to the caller (``importlib``), so
this module sits below the spec types and the toolchain machinery that both use it.

The registered adapters (``adapter_names``) are the vendor folders plus the shared ones, modules of ``targets/``
that serve custom specs of any vendor (``SHARED_ADAPTERS``). A spec's ``adapter`` must be one of them: the
name picks a module to import, so it is never taken as written by a request.
"""

from __future__ import annotations

import difflib
from functools import cache
from importlib import resources
from importlib.abc import Traversable

PACKAGE = "flexdsa_core.targets"
# Modules of targets/ exporting an ADAPTER for custom specs of any vendor (a generic accelerator with a CPU
# beside it); the vendor folders are found by discovery.
SHARED_ADAPTERS = ("accelerator",)


@cache
def vendor_folders() -> dict[str, Traversable]:
    """Folder name -> folder, for every sub-package of ``targets/`` that holds a spec (``*.json``)."""
    found = {}
    for entry in resources.files(PACKAGE).iterdir():
        if entry.is_dir() and entry.joinpath("__init__.py").is_file():
            if any(item.name.endswith(".json") for item in entry.iterdir()):
                found[entry.name] = entry
    return dict(sorted(found.items()))


def adapter_names() -> list[str]:
    """Every name a spec's ``adapter`` may take: the vendor folders and the shared adapters."""
    return sorted({*vendor_folders(), *SHARED_ADAPTERS})


def unknown_adapter_message(name: str) -> str:
    known = adapter_names()
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown adapter {name!r}{hint}; a target's adapter is one of: {', '.join(known)}"


def spec_files(folder: Traversable) -> list[Traversable]:
    return sorted(
        (item for item in folder.iterdir() if item.name.endswith(".json")), key=lambda item: item.name
    )


def has_toolchain(folder: Traversable) -> bool:
    return folder.joinpath("toolchain.py").is_file()


def module_name(vendor: str, submodule: str | None = None) -> str:
    return f"{PACKAGE}.{vendor}" + (f".{submodule}" if submodule else "")
