"""Content-addressed artifact store: a blob's key is the sha256 of its bytes, so identical uploads and
artifacts shared by cached jobs are stored once.

``LocalStore`` keeps blobs at ``<root>/<key[:2]>/<key>`` and writes atomically (a temp file in the same
folder, fsync, then rename), so a reader never sees half a blob and a crash leaves at most a stray temp
file. Deleting a blob is the caller's decision: several rows may point at one key.

``service.storage.s3store.S3Store`` keeps the same keys in an S3-compatible bucket (``FLEXDSA_ARTIFACT_URL=
s3://bucket/prefix``), so API processes and workers on different machines share artifacts without a shared
folder. ``make_store`` picks one from the settings.

Reads are checked against the key: a blob's key is its sha256, so ``fetch_to`` and the S3 store's readers
hash what they read and raise ``ChecksumMismatchError`` rather than hand over bytes that are not the ones
stored. A store that cannot be reached raises ``StoreUnavailableError`` (an ``OSError``: the service's
condition, answered 503 with Retry-After, never the client's fault).
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from pathlib import Path
from typing import BinaryIO

from service.storage.blob_store import (  # noqa: F401 - the store's public names, imported from here by callers
    CHUNK,
    ArtifactStore,
    BlobNotFoundError,
    ChecksumMismatchError,
    StoreUnavailableError,
    check_key,
)

# errno values of a write refused because the disk (or the user's quota on it) is full: the service's
# condition, reported as such (507 in the API, ``insufficient_storage`` for a job), never as a bug.
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class LocalStore(ArtifactStore):
    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, key: str) -> Path:
        check_key(key)
        return self.root / key[:2] / key

    def staging_dir(self) -> Path:
        return self.root / "tmp"

    def _temp(self) -> tuple[BinaryIO, Path]:
        tmp_dir = self.staging_dir()
        tmp_dir.mkdir(exist_ok=True)
        fd, name = tempfile.mkstemp(dir=tmp_dir, prefix="blob-")
        return os.fdopen(fd, "wb"), Path(name)

    def _commit(self, temp_path: Path, key: str) -> str:
        final = self.path(key)
        if final.exists():  # same content already stored
            temp_path.unlink(missing_ok=True)
            return key
        final.parent.mkdir(parents=True, exist_ok=True)
        os.replace(temp_path, final)
        return key

    def put_stream(self, stream: BinaryIO) -> str:
        digest = hashlib.sha256()
        handle, temp_path = self._temp()
        try:
            with handle:
                while chunk := stream.read(CHUNK):
                    digest.update(chunk)
                    handle.write(chunk)
                handle.flush()
                os.fsync(handle.fileno())
            return self._commit(temp_path, digest.hexdigest())
        except BaseException:
            temp_path.unlink(missing_ok=True)
            raise

    def put_file(self, path: Path, key: str | None = None, move: bool = False) -> str:
        path = Path(path)
        if key is not None and self.exists(key):
            if move:
                path.unlink(missing_ok=True)
            return key
        if move and key is not None:
            final = self.path(key)
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.replace(path, final)  # same filesystem: no copy
                return key
            except OSError:
                pass  # another filesystem: copy below
        with open(path, "rb") as source:
            stored = self.put_stream(source)
        if move:
            path.unlink(missing_ok=True)
        return stored

    def open(self, key: str) -> BinaryIO:
        try:
            return open(self.path(key), "rb")
        except FileNotFoundError:
            raise BlobNotFoundError(key) from None

    def size(self, key: str) -> int:
        try:
            return self.path(key).stat().st_size
        except FileNotFoundError:
            raise BlobNotFoundError(key) from None

    def exists(self, key: str) -> bool:
        return self.path(key).is_file()

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)

    def check_writable(self) -> None:
        handle, temp_path = self._temp()
        handle.close()
        temp_path.unlink()


def make_store(settings, *, patient: bool = False) -> ArtifactStore:
    """The store the settings name: ``FLEXDSA_ARTIFACT_URL`` (s3://bucket/prefix) or the local folder.
    ``patient``: a worker's store, which rides out a store outage of up to
    ``FLEXDSA_STORE_OUTAGE_PATIENCE_S`` by retrying; the API's answers 503 at once instead."""
    if settings.artifact_url:
        from service.storage.s3store import S3Store

        return S3Store.from_settings(settings, patient=patient)
    return LocalStore(settings.artifact_dir)
