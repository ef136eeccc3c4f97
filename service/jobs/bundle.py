"""A succeeded job's bundle: every artifact in one zip, ``GET /jobs/{id}/artifacts/bundle.zip``.

Members are stored, not deflated (ONNX weights do not compress), and dated when the job finished, so the same
job's bundle is the same bytes whichever API process builds it. A store that serves redirects keeps the zip,
built once per job and named by the job and its exact artifact set (``bundle_id_of``), and the client is sent
to a presigned URL; otherwise the zip is built on the fly into a spool file and streamed. Either way every
member is read through the store's checked reads, so a corrupt blob refuses the bundle (502) before a byte
of it is sent. The route turns what ``job_bundle`` answers into the HTTP response.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.core.errors import Conflict
from service.core.models import Artifact, Job
from service.storage.store import ArtifactStore

BUNDLE_NAME = "bundle.zip"


@dataclass(frozen=True)
class StoredBundle:
    """The zip is kept in the store: fetch it from ``url`` (presigned, short-lived)."""

    url: str
    sha256: str


@dataclass(frozen=True)
class SpooledBundle:
    """The zip was built into ``spool`` (positioned at its start); whoever sends it closes it."""

    spool: BinaryIO
    size: int
    sha256: str
    filename: str


def job_bundle(job: Job, session: Session, store: ArtifactStore) -> StoredBundle | SpooledBundle:
    """The bundle of a succeeded job (409 ``job_not_finished`` before it has succeeded)."""
    if job.status != "succeeded":
        raise Conflict(
            f"Job {job.id} is {job.status}; its bundle exists once it has succeeded.", code="job_not_finished"
        )
    rows = session.scalars(select(Artifact).where(Artifact.job_id == job.id).order_by(Artifact.name)).all()
    filename = f"flexdsa-{job.id}.zip"
    if store.redirects:
        bundle_id = bundle_id_of(job, rows)
        cached = store.bundle(bundle_id)
        if cached is None:
            with tempfile.NamedTemporaryFile(dir=_staging(store), prefix="bundle-") as spool:
                sha256 = write_bundle(spool, job, rows, store)
                spool.flush()
                store.put_bundle(bundle_id, Path(spool.name), sha256)
        else:
            sha256 = cached[0]
        return StoredBundle(store.presigned_bundle_url(bundle_id, filename=filename), sha256)
    spool = tempfile.TemporaryFile()
    sha256 = write_bundle(spool, job, rows, store)
    size = spool.tell()
    spool.seek(0)
    return SpooledBundle(spool, size, sha256, filename)


def bundle_id_of(job: Job, rows) -> str:
    """The stored bundle's name: the job and its exact artifact set (a re-run job gets a new bundle)."""
    listing = json.dumps([job.id, [[row.name, row.blob_key] for row in rows]])
    return hashlib.sha256(listing.encode()).hexdigest()


def write_bundle(spool, job: Job, rows, store: ArtifactStore) -> str:
    """Write the zip to ``spool``; its sha256. Members are dated when the job finished, so the same job's
    bundle is the same bytes whichever API process builds it."""
    finished = job.finished_at or job.created_at
    stamp = finished.timetuple()[:6] if finished and finished.year >= 1980 else (1980, 1, 1, 0, 0, 0)
    with zipfile.ZipFile(spool, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as bundle:
        for row in rows:
            member = zipfile.ZipInfo(row.name, date_time=stamp)
            member.external_attr = 0o644 << 16
            with store.open(row.blob_key) as source, bundle.open(member, "w", force_zip64=True) as target:
                shutil.copyfileobj(source, target, 1 << 20)
    size = spool.tell()
    spool.seek(0)
    digest = hashlib.sha256()
    while chunk := spool.read(1 << 20):
        digest.update(chunk)
    spool.seek(size)
    return digest.hexdigest()


def _staging(store: ArtifactStore) -> Path:
    folder = store.staging_dir()
    folder.mkdir(parents=True, exist_ok=True)
    return folder
