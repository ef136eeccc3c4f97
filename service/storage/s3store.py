"""``S3Store``: the content-addressed artifact store in an S3-compatible bucket (AWS S3, Ceph RGW, MinIO,
the S3 interfaces of GCS and Azure), for API processes and workers that share no folder.

Layout under ``s3://bucket/prefix``: a blob at ``<prefix>/<key[:2]>/<key>`` (``key`` = the sha256 of its
bytes, as in ``LocalStore``), with its sha256 also in the object's metadata (``x-amz-meta-sha256``); a
bundle.zip built for redirects at ``<prefix>/bundles/<bundle id>.zip``.

Why it is safe to share:

- **Writes are all-or-nothing.** A file up to one part (``FLEXDSA_S3_PART_SIZE_MB``) is one ``PutObject``;
  a larger one a multipart upload whose object only exists once ``CompleteMultipartUpload`` succeeds. A
  process killed mid-upload leaves no object, only invisible parts, which ``abort_incomplete_uploads``
  removes (``flexdsa store abort-uploads``, or a bucket lifecycle rule). And a job only points at a
  blob after the store has confirmed it, so no job ever points at half an object.
- **Reads are checked.** Every read hashes the bytes and compares them with the key: ``fetch_to`` removes
  the file and raises ``ChecksumMismatchError``; a streamed download holds its last chunk back until the
  hash is known, so a corrupt blob ends the response short (the client sees an error, not a file). Before a
  presigned redirect the object's size and metadata are checked against the job's record.
- **Outages are the service's, not the client's.** Every failure to reach the store is a
  ``StoreUnavailableError``: the API answers 503 with Retry-After; a worker's store (``patient=True``)
  retries for ``FLEXDSA_STORE_OUTAGE_PATIENCE_S`` with backoff, so a job outlives a store restart without
  spending an attempt, and re-stores the same keys if it runs again (content-addressed: no duplicates).

Credentials come from boto3's chain (environment, shared files, instance role) and never pass through
the settings, the database or the logs; presigned URLs are signed locally with them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

from service.storage.blob_store import (
    CHUNK,
    ArtifactStore,
    BlobNotFoundError,
    ChecksumMismatchError,
    StoreUnavailableError,
    check_key,
)

log = logging.getLogger("flexdsa.storage")

MiB = 1024 * 1024
SHA256_META = "sha256"
# The API answers 503 quickly when the store is away: a refused connection fails at once, and a store that
# does not answer is given this long per try (botocore's standard retry mode adds two more tries).
CONNECT_TIMEOUT_S = 3
READ_TIMEOUT_S = 60
API_ATTEMPTS = 3
# A patient (worker) store backs off from the first delay to the cap between tries.
RETRY_FIRST_S, RETRY_CAP_S = 0.5, 10.0
NOT_FOUND_CODES = {"404", "NoSuchKey", "NotFound"}


def parse_artifact_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ("bucket", "some/prefix") (no leading or trailing slash)."""
    if not url.startswith("s3://"):
        raise ValueError(f"not an s3:// URL: {url!r}")
    bucket, _, prefix = url[len("s3://") :].partition("/")
    return bucket, prefix.strip("/")


@contextlib.contextmanager
def translated(operation: str, key: str | None = None):
    """botocore's and urllib3's errors as the store's own: 404 -> ``BlobNotFoundError``, anything that
    says the store is away or refuses us -> ``StoreUnavailableError`` (with no credentials in it)."""
    from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

    try:
        yield
    except ClientError as err:
        code = str(err.response.get("Error", {}).get("Code", ""))
        status = err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in NOT_FOUND_CODES or status == 404:
            raise BlobNotFoundError(key or operation) from None
        raise StoreUnavailableError(
            f"the artifact store refused {operation}: {code} (HTTP {status})"
        ) from None
    except ParamValidationError:
        raise  # our bug, not the store's state
    except BotoCoreError as err:
        raise StoreUnavailableError(f"the artifact store is unreachable ({operation}): {err}") from None
    except StoreUnavailableError:
        raise
    except OSError as err:  # a connection reset while streaming a body
        raise StoreUnavailableError(f"the artifact store connection failed ({operation}): {err}") from None
    except Exception as err:
        # urllib3's protocol and timeout errors raised from a streaming body are not OSErrors
        if type(err).__module__.startswith("urllib3"):
            raise StoreUnavailableError(
                f"the artifact store connection failed ({operation}): {err}"
            ) from None
        raise


class VerifyingReader(io.RawIOBase):
    """A blob's body from ``GetObject``, hashed as it is read: at its end, ``ChecksumMismatchError`` unless
    the bytes hash to the key and their count is the object's length."""

    def __init__(self, body, key: str, length: int) -> None:
        super().__init__()
        self._body = body
        self._key = key
        self._length = length
        self._digest = hashlib.sha256()
        self._read = 0
        self._verified = False

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        with translated("read", self._key):
            data = self._body.read() if size is None or size < 0 else self._body.read(size)
        self._digest.update(data)
        self._read += len(data)
        if not data or size is None or size < 0:
            self._verify()
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def _verify(self) -> None:
        if self._verified:
            return
        actual = self._digest.hexdigest()
        if actual != self._key or self._read != self._length:
            raise ChecksumMismatchError(self._key, actual)
        self._verified = True

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._body.close()
        super().close()


class S3Store(ArtifactStore):
    redirects = True
    keeps_staged_files = False

    def __init__(
        self,
        client,
        bucket: str,
        prefix: str = "",
        *,
        staging: Path | None = None,
        presign_client=None,
        presign: bool = True,
        presign_expiry_s: int = 300,
        part_size: int = 16 * MiB,
        concurrency: int = 4,
        patience_s: float = 0.0,
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self._staging = (
            Path(staging) if staging is not None else Path(tempfile.gettempdir()) / "flexdsa-staging"
        )
        self._presigner = presign_client or client
        self.redirects = presign
        self.presign_expiry_s = presign_expiry_s
        self.part_size = part_size
        self.concurrency = concurrency
        self.patience_s = patience_s

    @classmethod
    def from_settings(cls, settings, *, patient: bool = False) -> S3Store:
        bucket, prefix = parse_artifact_url(settings.artifact_url)
        client = make_client(settings, settings.s3_endpoint_url, attempts=API_ATTEMPTS)
        presigner = None
        if settings.s3_public_endpoint_url and settings.s3_public_endpoint_url != settings.s3_endpoint_url:
            presigner = make_client(settings, settings.s3_public_endpoint_url, attempts=1)
        return cls(
            client, bucket, prefix,
            staging=Path(settings.data_dir) / "staging",
            presign_client=presigner,
            presign=settings.presign_downloads,
            presign_expiry_s=settings.presign_expiry_s,
            part_size=settings.s3_part_size_mb * MiB,
            concurrency=settings.s3_upload_concurrency,
            patience_s=settings.store_outage_patience_s if patient else 0.0,
        )  # fmt: skip

    def __repr__(self) -> str:
        return f"S3Store(s3://{self.bucket}/{self.prefix})"

    # -- keys ---------------------------------------------------------------------------------------------

    def object_key(self, key: str) -> str:
        check_key(key)
        return self._join(f"{key[:2]}/{key}")

    def bundle_key(self, bundle_id: str) -> str:
        check_key(bundle_id)
        return self._join(f"bundles/{bundle_id}.zip")

    def _join(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def staging_dir(self) -> Path:
        return self._staging

    # -- retries ------------------------------------------------------------------------------------------

    def _patiently(self, operation: str, key: str | None, action, *args, **kwargs):
        """``action(*args, **kwargs)`` with the store's errors translated; while the store is unavailable a
        patient store tries again, backing off, until ``patience_s`` has passed."""
        deadline = time.monotonic() + self.patience_s
        delay = RETRY_FIRST_S
        while True:
            try:
                with translated(operation, key):
                    return action(*args, **kwargs)
            except StoreUnavailableError as err:
                if time.monotonic() + delay > deadline:
                    raise
                log.warning("%s: %s; retrying in %.1f s", operation, err, delay)
                time.sleep(delay)
                delay = min(delay * 2, RETRY_CAP_S)

    # -- reads --------------------------------------------------------------------------------------------

    def head(self, key: str, *, object_key: str | None = None) -> dict:
        return self._patiently(
            "HEAD", key, self.client.head_object, Bucket=self.bucket, Key=object_key or self.object_key(key)
        )

    def exists(self, key: str) -> bool:
        try:
            self.head(key)
        except BlobNotFoundError:
            return False
        return True

    def size(self, key: str) -> int:
        return int(self.head(key)["ContentLength"])

    def open(self, key: str) -> BinaryIO:
        response = self._patiently(
            "GET", key, self.client.get_object, Bucket=self.bucket, Key=self.object_key(key)
        )
        return VerifyingReader(response["Body"], key, int(response["ContentLength"]))

    def iter_chunks(self, key: str, chunk_size: int = CHUNK):
        """The blob in pieces, the last held back until the whole was hashed: a corrupt blob raises before
        its final piece, so a streamed response ends short of its Content-Length instead of completing."""
        with self.open(key) as reader:
            previous = reader.read(chunk_size)
            while previous:
                current = reader.read(chunk_size)  # at the end: the check, before the last piece goes out
                yield previous
                previous = current

    def fetch_to(self, key: str, path: Path) -> int:
        # The whole fetch is retried: a connection lost halfway through starts the copy over.
        return self._patiently("fetch", key, self._fetch_once, key, Path(path))

    def _fetch_once(self, key: str, path: Path) -> int:
        with translated("GET", key):
            response = self.client.get_object(Bucket=self.bucket, Key=self.object_key(key))
        size = 0
        try:
            with VerifyingReader(response["Body"], key, int(response["ContentLength"])) as reader:
                with open(path, "wb") as target:
                    while chunk := reader.read(CHUNK):  # the reader checks the sha256 at the end
                        target.write(chunk)
                        size += len(chunk)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        return size

    # -- writes -------------------------------------------------------------------------------------------

    def put_bytes(self, data: bytes) -> str:
        key = hashlib.sha256(data).hexdigest()
        if not self._holds(key, len(data)):
            self._patiently(
                "PUT", key, self.client.put_object, Bucket=self.bucket, Key=self.object_key(key), Body=data,
                Metadata={SHA256_META: key}, ContentType="application/octet-stream",
            )  # fmt: skip
        return key

    def put_stream(self, stream: BinaryIO) -> str:
        self._staging.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self._staging, prefix="blob-")
        path = Path(name)
        try:
            with os.fdopen(fd, "wb") as handle:
                while chunk := stream.read(CHUNK):
                    handle.write(chunk)
            return self.put_file(path, move=True)
        finally:
            path.unlink(missing_ok=True)

    def put_file(self, path: Path, key: str | None = None, move: bool = False) -> str:
        path = Path(path)
        if key is None:
            key = _sha256_of(path)
        check_key(key)
        if not self._holds(key, path.stat().st_size):
            self._patiently("upload", key, self._upload, path, self.object_key(key), key)
        if move:
            path.unlink(missing_ok=True)
        return key

    def _holds(self, key: str, size: int) -> bool:
        """Whether the store already has these bytes (content-addressed: then nothing is uploaded). An
        object under the key whose length or recorded sha256 differ is replaced: an upload repairs it."""
        try:
            self.verified_head(key, size)
        except BlobNotFoundError:
            return False
        except ChecksumMismatchError:
            log.warning("blob %s in the store is not what its key says; storing it again", key[:12])
            return False
        return True

    def _upload(self, path: Path, object_key: str, sha256: str) -> None:
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(
            multipart_threshold=self.part_size, multipart_chunksize=self.part_size,
            max_concurrency=self.concurrency, use_threads=self.concurrency > 1,
        )  # fmt: skip
        # s3transfer aborts the multipart upload itself when a part fails; a killed process leaves only
        # parts, never an object (see abort_incomplete_uploads).
        self.client.upload_file(
            str(path), self.bucket, object_key, Config=config,
            ExtraArgs={"Metadata": {SHA256_META: sha256}, "ContentType": "application/octet-stream"},
        )  # fmt: skip

    def delete(self, key: str) -> None:
        self._patiently(
            "DELETE", key, self.client.delete_object, Bucket=self.bucket, Key=self.object_key(key)
        )

    def check_writable(self) -> None:
        marker = self._join(".flexdsa-readyz")
        with translated("PUT readiness marker"):
            self.client.put_object(Bucket=self.bucket, Key=marker, Body=b"ok")

    # -- redirects ----------------------------------------------------------------------------------------

    def verified_head(self, key: str, size: int | None = None, *, object_key: str | None = None) -> dict:
        """HEAD the object and hold it against what the job recorded: ``BlobNotFoundError`` when absent,
        ``ChecksumMismatchError`` when its length or its recorded sha256 differ (replaced or truncated)."""
        head = self.head(key, object_key=object_key)
        recorded = (head.get("Metadata") or {}).get(SHA256_META)
        length = int(head["ContentLength"])
        if recorded != key or (size is not None and length != size):
            raise ChecksumMismatchError(key, recorded or "none recorded")
        return head

    def presigned_url(
        self, key: str, *, filename: str, content_type: str, object_key: str | None = None
    ) -> str:
        params = {
            "Bucket": self.bucket,
            "Key": object_key or self.object_key(key),
            "ResponseContentDisposition": f"attachment; filename*=UTF-8''{quote(filename)}",
            "ResponseContentType": content_type,
        }
        with translated("presign", key):
            return self._presigner.generate_presigned_url(
                "get_object", Params=params, ExpiresIn=self.presign_expiry_s
            )

    def bundle(self, bundle_id: str) -> tuple[str, int] | None:
        """(sha256, size) of the bundle stored under ``bundle_id``, or None if it was never built."""
        try:
            head = self.head(bundle_id, object_key=self.bundle_key(bundle_id))
        except BlobNotFoundError:
            return None
        sha256 = (head.get("Metadata") or {}).get(SHA256_META)
        return (sha256, int(head["ContentLength"])) if sha256 else None

    def put_bundle(self, bundle_id: str, path: Path, sha256: str) -> None:
        self._patiently(
            "upload bundle", bundle_id, self._upload, Path(path), self.bundle_key(bundle_id), sha256
        )

    def presigned_bundle_url(self, bundle_id: str, *, filename: str) -> str:
        return self.presigned_url(
            bundle_id,
            filename=filename,
            content_type="application/zip",
            object_key=self.bundle_key(bundle_id),
        )

    # -- housekeeping -------------------------------------------------------------------------------------

    def abort_incomplete_uploads(self, older_than_s: float) -> int:
        """Abort multipart uploads under the prefix begun more than ``older_than_s`` ago (left by a process
        killed mid-upload: invisible, but their parts take space). Returns how many were aborted."""
        import datetime

        cutoff = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=older_than_s)
        aborted = 0
        with translated("list multipart uploads"):
            paginator = self.client.get_paginator("list_multipart_uploads")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._join("")):
                for upload in page.get("Uploads", []):
                    if upload["Initiated"] < cutoff:
                        self.client.abort_multipart_upload(
                            Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                        )
                        aborted += 1
        return aborted

    def ensure_bucket(self) -> None:
        """Create the bucket if it is missing (operators usually create it; tests and benches do here)."""
        try:
            with translated("HEAD bucket"):
                self.client.head_bucket(Bucket=self.bucket)
        except BlobNotFoundError:
            with translated("create bucket"):
                self.client.create_bucket(Bucket=self.bucket)


def make_client(settings, endpoint_url: str | None, *, attempts: int):
    """A boto3 S3 client for the settings' store; credentials from boto3's own chain."""
    import boto3
    from botocore.config import Config

    config = Config(
        signature_version="s3v4",
        s3={"addressing_style": settings.s3_addressing_style},
        connect_timeout=CONNECT_TIMEOUT_S,
        read_timeout=READ_TIMEOUT_S,
        retries={"mode": "standard", "max_attempts": attempts},
        max_pool_connections=max(10, settings.s3_upload_concurrency * 4),
        # The store's checksum trailers are newer than many S3-compatible servers; integrity is ours (the
        # sha256 key, checked on every read), and SigV4 already signs every payload's sha256 over http.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    session = boto3.session.Session(region_name=settings.s3_region)
    return session.client("s3", endpoint_url=endpoint_url, config=config)


def _sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
