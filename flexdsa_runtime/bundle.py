"""A bundle on disk: its ``manifest.json`` read and checked, every file it lists verified by sha256.

A bundle is a folder or a zip (``GET /jobs/{id}/artifacts/bundle.zip``, ``flexdsa optimize -o``). A zip is
unpacked into a folder first (``unpack``): only the manifest and the files it lists, refusing names that
would land outside the folder. ``verify`` then checks that each listed file is there with its size and
sha256, so a truncated download or a file changed on the device is refused before anything is loaded.

The manifest format is ``flexdsa-bundle/1`` (``flexdsa_core.targets.deploy_manifest``): ``buckets`` (name,
dims, artifacts by role, preferred first), ``files`` (role, sha256, size) and ``runtime`` (policy, where each
dim sits on the inputs, which dims may be padded, pad values, output axes to crop).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from flexdsa_runtime.errors import BundleError

FORMAT = "flexdsa-bundle/1"
MANIFEST = "manifest.json"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class BucketSpec:
    """One bucket of the bundle: the dim values it fixes and its artifacts (preferred first)."""

    name: str
    dims: dict[str, int]
    artifacts: list[dict[str, Any]]
    inputs: list[dict[str, Any]] = field(default_factory=list)

    def artifact(self, *roles: str) -> dict[str, Any] | None:
        """The first artifact of one of ``roles`` (in ``roles`` order), or None."""
        for role in roles:
            for artifact in self.artifacts:
                if artifact["role"] == role:
                    return artifact
        return None


@dataclass(frozen=True)
class Bundle:
    folder: Path
    manifest: dict[str, Any]
    manifest_sha256: str

    @property
    def version(self) -> str:
        """The bundle's identity: the first 16 hex digits of its manifest's sha256 (which names every file's)."""
        return self.manifest_sha256[:16]

    @property
    def target(self) -> str:
        return self.manifest.get("target", "")

    @property
    def runtime(self) -> dict[str, Any]:
        return self.manifest["runtime"]

    @property
    def buckets(self) -> list[BucketSpec]:
        return [
            BucketSpec(
                b["name"], dict(b.get("dims", {})), list(b.get("artifacts", [])), list(b.get("inputs", []))
            )
            for b in self.manifest["buckets"]
        ]

    def path(self, name: str) -> Path:
        return self.folder / name


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _safe_member(name: str) -> bool:
    path = PurePosixPath(name)
    return bool(name) and not path.is_absolute() and ".." not in path.parts and "\\" not in name


def read_manifest(folder: Path) -> tuple[dict[str, Any], str]:
    path = folder / MANIFEST
    if not path.is_file():
        raise BundleError(
            f"{folder} has no {MANIFEST}: give the folder `flexdsa optimize -o` wrote, or the job's bundle.zip.",
            details={"folder": str(folder)},
        )
    raw = path.read_bytes()
    try:
        manifest = json.loads(raw)
    except ValueError as err:
        raise BundleError(f"{MANIFEST} is not valid JSON ({err}).") from None
    if manifest.get("format") != FORMAT or "runtime" not in manifest or "files" not in manifest:
        raise BundleError(
            f"{MANIFEST} is not a {FORMAT} manifest (format {manifest.get('format')!r}): the bundle was made by a "
            "Flex-DSA without the deploy contract (no checksums, no run-time policy). Optimise the model again.",
            details={"format": manifest.get("format")},
        )
    return manifest, hashlib.sha256(raw).hexdigest()


def unpack(archive: Path, folder: Path) -> None:
    """Extract the manifest and the files it lists from the zip ``archive`` into ``folder`` (created)."""
    try:
        handle = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as err:
        raise BundleError(
            f"{archive} is not a readable zip ({err}).", details={"path": str(archive)}
        ) from None
    with handle:
        members = {info.filename: info for info in handle.infolist() if not info.is_dir()}
        # A bundle built by the service or zipped by hand may sit one folder down.
        prefix = ""
        if MANIFEST not in members:
            nested = [name for name in members if name.endswith("/" + MANIFEST) and name.count("/") == 1]
            if len(nested) != 1:
                raise BundleError(f"{archive} holds no {MANIFEST}.", details={"path": str(archive)})
            prefix = nested[0][: -len(MANIFEST)]
        manifest = json.loads(handle.read(prefix + MANIFEST))
        wanted = [MANIFEST, *manifest.get("files", {})]
        unsafe = [name for name in wanted if not _safe_member(name)]
        if unsafe:  # before anything is written
            raise BundleError(f"{MANIFEST} lists {unsafe[0]!r}, a path outside the bundle: refused.")
        folder.mkdir(parents=True, exist_ok=True)
        for name in wanted:
            info = members.get(prefix + name)
            if info is None:
                raise BundleError(
                    f"{archive} lacks {name!r}, which its manifest lists: the download is incomplete.",
                    details={"missing": name},
                )
            target = folder / name
            target.parent.mkdir(parents=True, exist_ok=True)
            with handle.open(info) as source, target.open("wb") as sink:
                shutil.copyfileobj(source, sink, _CHUNK)


def verify(folder: Path, manifest: dict[str, Any]) -> None:
    """Every file the manifest lists is in ``folder`` with its size and sha256, and every bucket's artifacts are
    listed files; raises ``BundleError`` naming the first that is not."""
    files = manifest["files"]
    for name, entry in files.items():
        if not _safe_member(name):
            raise BundleError(f"{MANIFEST} lists {name!r}, a path outside the bundle: refused.")
        path = folder / name
        if not path.is_file():
            raise BundleError(
                f"{name} is missing from the bundle (listed in {MANIFEST}).", details={"missing": name}
            )
        size = path.stat().st_size
        if size != entry["size"]:
            raise BundleError(
                f"{name} has {size} bytes, the manifest says {entry['size']}: the file is truncated or replaced.",
                details={"file": name, "size": size, "expected": entry["size"]},
            )
        found = sha256_file(path)
        if found != entry["sha256"]:
            raise BundleError(
                f"{name} does not match its checksum (sha256 {found[:16]}..., manifest {entry['sha256'][:16]}...): "
                "the file was changed or corrupted; fetch the bundle again.",
                details={"file": name, "sha256": found, "expected": entry["sha256"]},
            )
    for bucket in manifest["buckets"]:
        for artifact in bucket.get("artifacts", []):
            if artifact["file"] not in files:
                raise BundleError(
                    f"bucket {bucket['name']!r} names {artifact['file']!r}, which the manifest does not list."
                )


def open_bundle(folder: Path, *, check: bool = True) -> Bundle:
    """The bundle in ``folder``, its files verified unless ``check`` is false."""
    manifest, digest = read_manifest(folder)
    if check:
        verify(folder, manifest)
    return Bundle(folder, manifest, digest)
