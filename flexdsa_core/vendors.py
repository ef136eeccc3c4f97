"""The vendor folders under ``targets/``: one package per vendor, found by discovery. Below both the targets
(which find a vendor's specs and adapter here) and the toolchains (which find its driver here), so it lives
beside them rather than inside ``targets/``, whose package imports the toolchain machinery.

A vendor folder holds its spec(s) (``*.json``), its adapter (the package exports ``ADAPTER``, a built-in one
lazily: ``lazy_exports``), its legalisations,
and where a vendor compiler installs, its toolchain (``toolchain.py`` exporting ``TOOLCHAIN``), the driver run in
the toolchain's own environment (``driver.py``) and the bundle's generated scripts as template files
(``templates/``). Nothing names a vendor by string: a spec's adapter is the folder it sits in, its toolchain the
one whose ``targets`` list it. Reads folders only (``targets/`` as a folder of this package, never imported
here); importing a vendor is left to the caller (``importlib``).

The registered adapters (``adapter_names``) are the vendor folders plus the shared ones, modules of ``targets/``
that serve custom specs of any vendor (``SHARED_ADAPTERS``). A spec's ``adapter`` must be one of them: the
name picks a module to import, so it is never taken as written by a request.

A vendor package kept outside ``targets/`` (a plug-in, a test's toy target) is laid out the same way and
registered by its importable name (``targets.register_vendor``, which also forgets the specs read so far):
``REGISTERED`` holds them, and from then on it is found like a folder of ``targets/``.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from functools import cache
from importlib import resources
from importlib.abc import Traversable

PACKAGE = "flexdsa_core.targets"
# ``targets/`` as a folder of this package: read without importing ``PACKAGE``, which sits above this module.
_TARGETS = resources.files(__package__).joinpath("targets")
# Modules of targets/ exporting an ADAPTER for custom specs of any vendor (a generic accelerator with a CPU
# beside it); the vendor folders are found by discovery.
SHARED_ADAPTERS = ("accelerator",)
# Vendor packages outside targets/, by folder name -> importable package name (``register``).
REGISTERED: dict[str, str] = {}


@cache
def vendor_folders() -> dict[str, Traversable]:
    """Folder name -> folder, for every sub-package of ``targets/`` that holds a spec (``*.json``)."""
    found = {}
    for entry in _TARGETS.iterdir():
        if entry.is_dir() and entry.joinpath("__init__.py").is_file():
            if any(item.name.endswith(".json") for item in entry.iterdir()):
                found[entry.name] = entry
    for name, package in REGISTERED.items():
        found[name] = resources.files(package)
    return dict(sorted(found.items()))


def register(package: str) -> str:
    """Add the vendor package ``package`` (importable, e.g. ``tests.core.targets.toy``), laid out like a folder of
    ``targets/``: its spec(s) ``*.json`` and an ``__init__`` exporting ``ADAPTER``. Returns its vendor name
    (the package's last part), which its specs' ``adapter`` becomes. A name a built-in folder has is refused."""
    name = package.rpartition(".")[2]
    folder = resources.files(package)
    if REGISTERED.get(name, package) != package or (name not in REGISTERED and name in vendor_folders()):
        raise ValueError(f"vendor {name!r} is already registered; a registered package needs a name of its own")
    if not any(item.name.endswith(".json") for item in folder.iterdir()):
        raise ValueError(f"vendor package {package!r} holds no spec (*.json)")
    REGISTERED[name] = package
    vendor_folders.cache_clear()
    return name


def unregister(name: str) -> None:
    """Forget a vendor package ``register`` added (a test's toy target, after the test)."""
    REGISTERED.pop(name, None)
    vendor_folders.cache_clear()


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
    return REGISTERED.get(vendor, f"{PACKAGE}.{vendor}") + (f".{submodule}" if submodule else "")


def lazy_exports(package: str, **exports: str) -> Callable[[str], object]:
    """A vendor package's module ``__getattr__`` (PEP 562): each name in ``exports`` (``ADAPTER="adapter"``) is
    read from that submodule on first use. Listing targets reads every vendor's ``TOOLCHAIN`` and a job its own
    target's ``ADAPTER``; importing the package for either loads no other adapter (with its templates and
    legalisations: about 3 MiB of a one-node job's memory for the five other vendors)."""

    def __getattr__(name: str) -> object:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)

    return __getattr__
