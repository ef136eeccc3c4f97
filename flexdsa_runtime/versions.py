"""Bundle versions on disk, switched atomically: what ``Runtime.update`` stands on.

Layout under the store's root::

    versions/<version>/   a complete bundle, every file verified against its manifest before it got this name
    CURRENT               the version in service, one line, replaced atomically (write, fsync, rename)
    staging/<random>/     a bundle being unpacked or copied; never read, removed at the next start

``install`` unpacks or copies into ``staging`` (every name checked first, so a hostile bundle writes nothing
outside its staging folder, or nothing at all), flushes every file to disk, verifies the checksums, and only
then renames the folder into ``versions/`` (a rename within one filesystem is atomic: the folder appears
complete or not at all). ``switch`` rewrites ``CURRENT`` the same way. So a process killed at any point
leaves ``CURRENT`` naming a complete, verified version: the old one until the new one is fully in place,
the new one after. ``open_current`` verifies the checksums again before anything is loaded.
"""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

from flexdsa_runtime.bundle import (
    MANIFEST,
    Bundle,
    UnpackLimits,
    checked_names,
    open_bundle,
    read_manifest,
    resolved_inside,
    unpack,
    verify,
)
from flexdsa_runtime.errors import BundleError

POINTER = "CURRENT"


def _fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    for path in sorted(folder.rglob("*"), reverse=True):
        _fsync_path(path, directory=path.is_dir())
    _fsync_path(folder, directory=True)


def copy_bundle(source: Path, folder: Path) -> None:
    """The manifest and the files it lists, copied from the bundle folder ``source`` into ``folder``. Every name
    is checked and resolved first (``bundle.checked_names``, ``bundle.resolved_inside``): a name that could
    lead out of ``folder``, or a file whose symlinks lead out of ``source``, refuses the whole bundle before
    anything is written. Symlinks that stay inside ``source`` are followed (a deploy tool may share one file
    between names); what is copied is always a regular file."""
    manifest, _ = read_manifest(source)
    plan = []
    for name in checked_names(manifest):
        origin = resolved_inside(source, name)
        if not origin.is_file():
            raise BundleError(
                f"{name} is missing from {source} (listed in its manifest).", details={"missing": name}
            )
        plan.append((origin, resolved_inside(folder, name)))
    folder.mkdir(parents=True, exist_ok=True)
    for origin, target in plan:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(origin, target)


class VersionStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.versions = self.root / "versions"
        self.staging = self.root / "staging"
        self.versions.mkdir(parents=True, exist_ok=True)
        self.staging.mkdir(parents=True, exist_ok=True)

    def clean_staging(self) -> None:
        """Remove what an interrupted install left (nothing there is ever read)."""
        for leftover in self.staging.iterdir():
            shutil.rmtree(leftover, ignore_errors=True)
        for leftover in self.root.glob(f"{POINTER}.tmp-*"):
            leftover.unlink(missing_ok=True)

    def current(self) -> str | None:
        pointer = self.root / POINTER
        if not pointer.is_file():
            return None
        version = pointer.read_text().strip()
        return version or None

    def folder(self, version: str) -> Path:
        return self.versions / version

    def install(self, source: Path, *, limits: UnpackLimits | None = None) -> str:
        """Put the bundle at ``source`` (folder or zip, unpacked within ``limits``) into the store, verified;
        returns its version. The version in service does not change (``switch`` does that)."""
        source = Path(source)
        work = self.staging / uuid.uuid4().hex
        try:
            if source.is_dir():
                copy_bundle(source, work)
            else:
                unpack(source, work, limits=limits)
            _fsync_tree(work)
            manifest, digest = read_manifest(work)
            verify(work, manifest)
            version = digest[:16]
            final = self.folder(version)
            if final.exists():
                try:
                    verify(final, read_manifest(final)[0])
                    return version  # already installed and intact
                except BundleError:  # damaged on disk: replace it with the fresh copy
                    shutil.rmtree(final)
            os.rename(work, final)
            _fsync_path(self.versions, directory=True)
            return version
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def switch(self, version: str) -> None:
        """Make ``version`` (installed) the one in service: ``CURRENT`` replaced in one atomic rename."""
        if not (self.folder(version) / MANIFEST).is_file():
            raise BundleError(f"version {version} is not installed in {self.root}.")
        temporary = self.root / f"{POINTER}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        with temporary.open("w") as handle:
            handle.write(version + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.root / POINTER)
        _fsync_path(self.root, directory=True)

    def open_current(self, *, check: bool = True) -> Bundle:
        version = self.current()
        if version is None:
            raise BundleError(f"{self.root} has no version in service yet: install a bundle first.")
        return open_bundle(self.folder(version), check=check)

    def prune(self, keep: int = 2) -> list[str]:
        """Remove installed versions beyond the ``keep`` most recent, never the one in service."""
        current = self.current()
        installed = sorted(self.versions.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True)
        removed = []
        for folder in installed[keep:]:
            if folder.name != current:
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder.name)
        return removed
