"""A bundle on disk: its ``manifest.json`` read and checked, every file it lists verified by sha256.

A bundle is a folder or a zip (``GET /jobs/{id}/artifacts/bundle.zip``, ``flexdsa optimize -o``). A zip is
unpacked into a folder first (``unpack``): only the manifest and the files it lists. ``verify`` then checks
that each listed file is there with its size and sha256, so a truncated download or a file changed on the
device is refused before anything is loaded.

A bundle comes from elsewhere, so its names are checked before anything is read or written
(``checked_names``): every listed name is relative, normalised, without ``..``, ``\\``, ``:`` or NUL, and
none is also the folder of another; in a folder, a name resolves (symlinks followed) inside the folder
(``resolved_inside``); in a zip, a listed member is a regular file that appears once, and the members
expand to at most ``UnpackLimits`` (checked from the central directory first, then counted while copying).

The manifest format is ``flexdsa-bundle/1`` (``flexdsa_core.vendor_runs.deploy_manifest``): ``buckets`` (name,
dims, artifacts by role, preferred first), ``files`` (role, sha256, size) and ``runtime`` (policy, where each
dim sits on the inputs, which dims may be padded, pad values, output axes to crop).
"""

from __future__ import annotations

import hashlib
import json
import stat
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flexdsa_runtime.errors import BundleError

FORMAT = "flexdsa-bundle/1"
MANIFEST = "manifest.json"
_CHUNK = 1 << 20
_MANIFEST_LIMIT = 64 << 20  # a manifest of ten thousand files is a few MB


@dataclass(frozen=True)
class UnpackLimits:
    """How far a zip may expand: ``max_bytes`` over the files unpacked, ``max_members`` in its directory.
    The defaults hold a bundle of several models of hundreds of MB each, with room to spare; raise them
    (``Runtime.open(..., unpack_limits=)``) for a genuine bundle beyond them."""

    max_bytes: int = 8 << 30
    max_members: int = 10_000


@dataclass(frozen=True)
class BucketSpec:
    """One bucket of the bundle: the dim values it fixes and its artifacts (preferred first)."""

    name: str
    dims: dict[str, int]
    artifacts: list[dict[str, Any]]
    inputs: list[dict[str, Any]] = field(default_factory=list)
    # Outputs the compiled artifact leaves to the runtime (``flexdsa_runtime.served``).
    served: list[dict[str, Any]] = field(default_factory=list)

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
    def disabled_optimizers(self) -> list[str]:
        """ONNX Runtime graph optimizers the bundle's ONNX models are loaded without: each would make again a
        fusion the compiler was told not to make (the manifest's ``session_options``)."""
        names = (self.manifest.get("session_options") or {}).get("disabled_optimizers") or []
        return [str(name) for name in names]

    @property
    def buckets(self) -> list[BucketSpec]:
        from flexdsa_runtime.served import checked

        return [
            BucketSpec(
                b["name"], dict(b.get("dims", {})), list(b.get("artifacts", [])), list(b.get("inputs", [])),
                checked(b.get("served_by_runtime"), b["name"]),
            )
            for b in self.manifest["buckets"]
        ]

    def path(self, name: str) -> Path:
        """The listed file ``name`` in the bundle's folder (refused when the name could lead out of it)."""
        problem = name_problem(name)
        if problem is not None:
            raise BundleError(f"{MANIFEST} names {name!r}, {problem}: refused.", details={"entry": name})
        return self.folder / name


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be the name of a file in a bundle, or None: it must be a relative, normalised path
    with '/' between its parts, so that it lands inside the bundle's folder on every system."""
    if not isinstance(name, str) or not name:
        return "not a file name"
    if name.startswith("/"):
        return "an absolute path, outside the bundle"
    if any(character in name for character in "\\:\0"):
        return (
            "a name with '\\', ':' or NUL, which Windows reads as another folder or drive, outside the bundle"
        )
    parts = name.split("/")
    if ".." in parts:
        return "a path outside the bundle ('..')"
    if "" in parts or "." in parts:
        return "not a normalised path (an empty or '.' part)"
    return None


def checked_names(manifest: Any) -> list[str]:
    """The manifest's own name and every file it lists, each checked (``name_problem``) and none also the folder
    of another; ``BundleError`` naming the first that is not, before anything is read or written."""
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict):
        raise BundleError(f"{MANIFEST} has no 'files' table: it is not a {FORMAT} manifest.")
    names = [MANIFEST, *files]
    for name in names:
        problem = name_problem(name)
        if problem is not None:
            raise BundleError(
                f"{MANIFEST} lists {name!r}, {problem}: the bundle is refused and nothing of it was written.",
                details={"entry": name},
            )
    folders = {name.rsplit("/", depth)[0] for name in names for depth in range(1, name.count("/") + 1)}
    for name in names:
        if name in folders:
            raise BundleError(
                f"{MANIFEST} lists {name!r} both as a file and as the folder of other files: refused.",
                details={"entry": name},
            )
    return names


def resolved_inside(folder: Path, name: str) -> Path:
    """``folder / name`` with every symlink resolved, refused (``BundleError``) when that leaves ``folder``: a
    symlink in the bundle may point at another of its files, never outside it."""
    root = folder.resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root):
        raise BundleError(
            f"{MANIFEST} lists {name!r}, which resolves to {path}, outside the bundle folder {root} (a symbolic "
            "link leads out of it): the bundle is refused.",
            details={"entry": name, "resolved": str(path)},
        )
    return path


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


def unpack(archive: Path, folder: Path, *, limits: UnpackLimits | None = None) -> None:
    """Extract the manifest and the files it lists from the zip ``archive`` into ``folder`` (created). Every
    name, member and size is checked before the first byte is written (see the module's docstring)."""
    limits = limits or UnpackLimits()
    try:
        handle = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, OSError) as err:
        raise BundleError(
            f"{archive} is not a readable zip ({err}).", details={"path": str(archive)}
        ) from None
    with handle:
        infos = handle.infolist()
        if len(infos) > limits.max_members:
            raise BundleError(
                f"{archive} has {len(infos)} members, more than the limit of {limits.max_members} "
                "(UnpackLimits.max_members; raise it if the bundle is genuine): refused.",
                details={"path": str(archive), "members": len(infos)},
            )
        members: dict[str, zipfile.ZipInfo] = {}
        repeated: set[str] = set()
        for info in infos:
            if info.filename in members:
                repeated.add(info.filename)
            members[info.filename] = info
        # A bundle built by the service or zipped by hand may sit one folder down.
        prefix = ""
        if MANIFEST not in members:
            nested = [name for name in members if name.endswith("/" + MANIFEST) and name.count("/") == 1]
            if len(nested) != 1:
                raise BundleError(f"{archive} holds no {MANIFEST}.", details={"path": str(archive)})
            prefix = nested[0][: -len(MANIFEST)]

        def member(name: str) -> zipfile.ZipInfo:
            return _checked_member(archive, members, repeated, prefix, name)

        manifest = _read_manifest_member(archive, handle, member(MANIFEST))
        wanted = [(name, member(name)) for name in checked_names(manifest)]
        _check_total(archive, wanted, limits)
        targets = [resolved_inside(folder, name) for name, _ in wanted]
        folder.mkdir(parents=True, exist_ok=True)
        budget = limits.max_bytes
        for (name, info), target in zip(wanted, targets, strict=True):
            target.parent.mkdir(parents=True, exist_ok=True)
            budget -= _copy_member(archive, handle, name, info, target, budget)


def _checked_member(
    archive: Path, members: dict[str, zipfile.ZipInfo], repeated: set[str], prefix: str, name: str
) -> zipfile.ZipInfo:
    """The zip's member for the listed ``name``: there, once, and a regular file."""
    info = members.get(prefix + name)
    if info is None or info.is_dir():
        raise BundleError(
            f"{archive} lacks {name!r}, which its manifest lists: the download is incomplete.",
            details={"missing": name},
        )
    if prefix + name in repeated:  # which copy an unzipper takes differs from one to the next
        raise BundleError(
            f"{archive} holds {name!r} more than once: refused (a bundle names each file once).",
            details={"entry": name},
        )
    kind = stat.S_IFMT(info.external_attr >> 16)
    if kind not in (0, stat.S_IFREG):
        what = "a symbolic link" if kind == stat.S_IFLNK else "not a regular file"
        raise BundleError(
            f"{archive} holds {name!r} as {what}: refused (a bundle holds regular files only).",
            details={"entry": name},
        )
    return info


def _read_manifest_member(archive: Path, handle: zipfile.ZipFile, info: zipfile.ZipInfo) -> Any:
    if info.file_size > _MANIFEST_LIMIT:
        raise BundleError(
            f"{archive}: {MANIFEST} expands to {info.file_size} bytes, no manifest is that big."
        )
    try:
        with handle.open(info) as source:
            raw = source.read(_MANIFEST_LIMIT + 1)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as err:
        raise BundleError(f"{archive}: {MANIFEST} cannot be read ({err}).") from None
    if len(raw) > info.file_size:
        raise BundleError(f"{archive}: {MANIFEST} is longer than its zip header says: refused.")
    try:
        return json.loads(raw)
    except ValueError as err:
        raise BundleError(f"{archive}: {MANIFEST} is not valid JSON ({err}).") from None


def _check_total(archive: Path, wanted: list[tuple[str, zipfile.ZipInfo]], limits: UnpackLimits) -> None:
    """What the central directory says the listed members expand to, within ``limits.max_bytes``."""
    total = 0
    for name, info in wanted:
        total += info.file_size
        if total > limits.max_bytes:
            raise BundleError(
                f"{archive}: {name!r} expands to {info.file_size} bytes, which takes the bundle to {total} bytes, "
                f"past the limit of {limits.max_bytes} (UnpackLimits.max_bytes; raise it with `unpack_limits=` if "
                "the bundle is genuine): refused before extracting anything.",
                details={"entry": name, "total": total, "limit": limits.max_bytes},
            )


def _copy_member(
    archive: Path, handle: zipfile.ZipFile, name: str, info: zipfile.ZipInfo, target: Path, budget: int
) -> int:
    """Copy one member to ``target``, counting the bytes: no more than its header said (a header that lies
    gets no further than that) nor than the ``budget`` left. Returns the bytes written; on any refusal the
    member's file is removed."""
    written = 0
    try:
        with handle.open(info) as source, target.open("wb") as sink:
            while chunk := source.read(_CHUNK):
                written += len(chunk)
                if written > info.file_size or written > budget:
                    raise BundleError(
                        f"{archive}: {name!r} expands past what its zip header says ({info.file_size} bytes) or "
                        f"past the limit of what is left to unpack ({budget} bytes): refused.",
                        details={"entry": name},
                    )
                sink.write(chunk)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError) as err:
        target.unlink(missing_ok=True)
        raise BundleError(
            f"{archive}: {name!r} is damaged or not what its zip header says ({err}): fetch the bundle again.",
            details={"entry": name},
        ) from None
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return written


def verify(folder: Path, manifest: dict[str, Any]) -> None:
    """Every file the manifest lists is in ``folder`` with its size and sha256, and every bucket's artifacts are
    listed files; raises ``BundleError`` naming the first that is not."""
    files = manifest["files"]
    checked_names(manifest)
    for name, entry in files.items():
        path = resolved_inside(folder, name)
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
