"""What every artifact store is: the ``ArtifactStore`` interface, its key rule (a blob's key is the sha256
of its bytes) and its errors. ``service.storage.store`` has the local folder and ``make_store``;
``service.storage.s3store`` the S3-compatible bucket. Kept apart so that neither store module imports the other."""

from __future__ import annotations

import hashlib
import re
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

CHUNK = 1024 * 1024
_KEY = re.compile(r"^[0-9a-f]{64}$")


class BlobNotFoundError(KeyError):
    pass


class StoreUnavailableError(OSError):
    """The artifact store could not be reached or refused to work (connection refused, timeout, a 5xx, no
    credentials). Nothing was stored or read; the same call succeeds once the store is back."""


class ChecksumMismatchError(ValueError):
    """The bytes read for ``key`` do not hash to it: the stored blob is corrupt or was replaced."""

    def __init__(self, key: str, actual: str) -> None:
        super().__init__(
            f"blob {key[:12]}... in the artifact store does not match its sha256 (read {actual[:12]}...): "
            "the stored copy is corrupt or was replaced"
        )
        self.key = key
        self.actual = actual


class ArtifactStore(ABC):
    # Whether downloads are answered with a redirect to a presigned URL at the store (S3) rather than
    # streamed through the API.
    redirects: bool = False
    # Whether an upload's staged file becomes the stored blob itself (renamed into place), so staging must
    # be durable; a remote store copies it and makes its own copy durable.
    keeps_staged_files: bool = True

    @abstractmethod
    def put_stream(self, stream: BinaryIO) -> str:
        """Store everything read from ``stream``; return its sha256 key."""

    def put_bytes(self, data: bytes) -> str:
        import io

        return self.put_stream(io.BytesIO(data))

    @abstractmethod
    def put_file(self, path: Path, key: str | None = None, move: bool = False) -> str:
        """Store a local file. ``key``: its sha256 when the caller already hashed it (trusted).
        ``move``: the file may be consumed (renamed into place or deleted) rather than copied."""

    @abstractmethod
    def open(self, key: str) -> BinaryIO: ...

    def iter_chunks(self, key: str, chunk_size: int = CHUNK) -> Iterator[bytes]:
        with self.open(key) as handle:
            while chunk := handle.read(chunk_size):
                yield chunk

    def read_bytes(self, key: str) -> bytes:
        with self.open(key) as handle:
            return handle.read()

    @abstractmethod
    def size(self, key: str) -> int: ...

    @abstractmethod
    def exists(self, key: str) -> bool: ...

    @abstractmethod
    def delete(self, key: str) -> None: ...

    @abstractmethod
    def check_writable(self) -> None:
        """Raise OSError if the store cannot take writes (used by /readyz)."""

    def staging_dir(self) -> Path:
        """Where uploads are spooled; for a local store, its own filesystem so ``put_file(move=True)`` renames."""
        return Path(tempfile.gettempdir())

    def fetch_to(self, key: str, path: Path) -> int:
        """Copy blob ``key`` to the local file ``path``, checking its sha256 on the way; the byte count.
        ``ChecksumMismatchError`` (and no file at ``path``) when the stored bytes are not the blob's."""
        digest = hashlib.sha256()
        size = 0
        try:
            with self.open(key) as source, open(path, "wb") as target:
                while chunk := source.read(CHUNK):
                    digest.update(chunk)
                    target.write(chunk)
                    size += len(chunk)
            if digest.hexdigest() != key:
                raise ChecksumMismatchError(key, digest.hexdigest())
        except BaseException:
            Path(path).unlink(missing_ok=True)
            raise
        return size

    def presigned_url(self, key: str, *, filename: str, content_type: str) -> str | None:
        """A short-lived URL from which a client fetches the blob directly, or None when the store has
        none (a local folder): the API then streams it."""
        return None

    def bundle(self, bundle_id: str) -> tuple[str, int] | None:
        """A cached bundle.zip (key, size) stored under ``bundle_id``, or None: only stores that serve
        bundles by redirect keep them."""
        return None

    def put_bundle(self, bundle_id: str, path: Path, sha256: str) -> str:  # pragma: no cover - S3 only
        raise NotImplementedError


def check_key(key: str) -> str:
    if not _KEY.match(key):
        raise ValueError(f"not a sha256 blob key: {key!r}")
    return key
