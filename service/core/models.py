"""The database schema (SQLAlchemy 2 typed ORM). The ``jobs`` row is the source of truth for a job's state;
the queue only carries job ids.

A job moves ``queued -> running -> succeeded | failed | cancelled``; every transition (and each stage
change while running) appends a ``job_events`` row, which the progress stream replays. Workers claim a
job by setting ``lease_owner``/``lease_expires_at``; a lapsed lease is re-queued until ``max_attempts``.

Times are stored in UTC and always come back timezone-aware (``UTCDateTime``), on SQLite as on Postgres,
so lease comparisons never mix naive and aware datetimes.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, object_session, relationship


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """A timezone-aware UTC datetime on every backend (SQLite drops the offset; this puts it back)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTCDateTime column; use service.core.models.utcnow()")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


JSONType = JSON().with_variant(JSONB(), "postgresql")
# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


class JobStatus(StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


TERMINAL_STATUSES = frozenset({JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled})
ACTIVE_STATUSES = frozenset({JobStatus.queued, JobStatus.running})


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime(), dict[str, Any]: JSONType}


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    # None = the service-wide default (Settings.max_queued_jobs_per_tenant).
    max_queued_jobs: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    api_keys: Mapped[list[ApiKey]] = relationship(back_populates="tenant", cascade="all, delete-orphan")


class ApiKey(Base):
    """An API key ``fdsa_<prefix>_<secret>``. Only ``prefix`` (to find the row) and a hash are kept.

    ``key_hash`` is a plain SHA-256 of the whole key. Slow password hashes (bcrypt, argon2) exist to make
    guessing low-entropy human passwords expensive; these keys carry 32 random bytes (256 bits), so a
    brute-force search is hopeless whatever the hash speed, and a fast hash keeps every request cheap.
    """

    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    prefix: Mapped[str] = mapped_column(String(32), index=True)
    key_hash: Mapped[str] = mapped_column(String(64))
    name: Mapped[str] = mapped_column(String(128), default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(nullable=True)

    tenant: Mapped[Tenant] = relationship(back_populates="api_keys")


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_jobs_tenant_idempotency_key"),
        CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')", name="ck_jobs_status"
        ),
        CheckConstraint("progress >= 0 AND progress <= 1", name="ck_jobs_progress"),
        Index("ix_jobs_tenant_created", "tenant_id", "created_at"),
        Index("ix_jobs_tenant_status", "tenant_id", "status"),
        # The reconciler's sweep: running jobs whose lease has lapsed.
        Index("ix_jobs_status_lease", "status", "lease_expires_at"),
        # A job's predecessor: the same model's latest earlier job on the same target (service/jobs/gates.py).
        Index("ix_jobs_tenant_model_target", "tenant_id", "model_name", "target", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=lambda: str(uuid.uuid4()))
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.queued.value)
    stage: Mapped[str | None] = mapped_column(String(64), nullable=True)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    target: Mapped[str] = mapped_column(String(64))
    spec: Mapped[dict[str, Any]] = mapped_column(JSONType)
    model_sha256: Mapped[str] = mapped_column(String(64))
    model_blob_key: Mapped[str] = mapped_column(String(64))
    model_filename: Mapped[str] = mapped_column(String(255))
    model_size: Mapped[int] = mapped_column(BigInteger)
    # The model this job is a version of: the spec's model_name, else the file name without its suffix.
    model_name: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # Calibration samples (.npz) uploaded beside the model, content-addressed in the same store.
    calibration_blob_key: Mapped[str | None] = mapped_column(String(64), nullable=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(255), nullable=True)
    # sha256(model sha256 | canonical spec JSON | compiler version): the whole-job cache key.
    job_cache_key: Mapped[str] = mapped_column(String(64), index=True)
    cached_from_job_id: Mapped[str | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True
    )
    # {"code": ..., "message": ..., "details": {...}} when failed or cancelled.
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    report_summary: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    lease_owner: Mapped[str | None] = mapped_column(String(255), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(nullable=True)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    # Bundle versions: a job re-specialised from another's traffic names it here and counts one more.
    parent_job_id: Mapped[str | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True, index=True
    )
    bundle_version: Mapped[int] = mapped_column(Integer, default=1)
    # Re-specialise by itself once the served traffic's padding waste passes this share (None: only on request).
    auto_respecialise_waste: Mapped[float | None] = mapped_column(Float, nullable=True)
    respecialise_max_buckets: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # One upload compared across several targets: the group this job is one target of (None: submitted alone).
    group_id: Mapped[str | None] = mapped_column(
        ForeignKey("job_groups.id", ondelete="SET NULL"), nullable=True, index=True
    )

    tenant: Mapped[Tenant] = relationship()
    events: Mapped[list[JobEvent]] = relationship(
        back_populates="job", cascade="all, delete-orphan", order_by="JobEvent.id", passive_deletes=True
    )
    artifacts: Mapped[list[Artifact]] = relationship(
        back_populates="job", cascade="all, delete-orphan", order_by="Artifact.name", passive_deletes=True
    )

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def record(self, kind: str, message: str | None = None) -> JobEvent:
        """Add an event carrying the job's current status/stage/progress to its session (the caller commits)."""
        event = JobEvent(
            kind=kind,
            status=self.status,
            stage=self.stage,
            progress=self.progress,
            message=message,
            at=utcnow(),
        )
        session = object_session(self)
        if session is None or self.id is None:
            self.events.append(event)  # a new job: its event list is empty and nothing is loaded
        else:
            # Added directly rather than appended, so recording progress never loads a long event history.
            event.job_id = self.id
            session.add(event)
        return event


class JobEvent(Base):
    """One row per transition or progress step. ``kind``: 'queued', 'started', 'progress', 'succeeded',
    'failed', 'cancel_requested', 'cancelled', 'retry', 'cached'."""

    __tablename__ = "job_events"
    __table_args__ = (Index("ix_job_events_job_id_id", "job_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))
    stage: Mapped[str | None] = mapped_column(String(64), nullable=True)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)

    job: Mapped[Job] = relationship(back_populates="events")


class Artifact(Base):
    """A file a job produced. The bytes live in the artifact store under ``blob_key`` (their sha256), so
    a job answered from the whole-job cache gets its own rows pointing at the same blobs."""

    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("job_id", "name", name="uq_artifacts_job_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(255))
    blob_key: Mapped[str] = mapped_column(String(64))
    size: Mapped[int] = mapped_column(BigInteger)
    content_type: Mapped[str] = mapped_column(String(128), default="application/octet-stream")
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    job: Mapped[Job] = relationship(back_populates="artifacts")


class KernelCacheEntry(Base):
    """The durable (Postgres) layer of the kernel cache; values are opaque bytes from the core."""

    __tablename__ = "kernel_cache"

    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    value: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    last_hit_at: Mapped[datetime | None] = mapped_column(nullable=True)
    hits: Mapped[int] = mapped_column(Integer, default=0)


class Incident(Base):
    """An internal error (a bug, not the user's mistake) with its traceback, for operators: the job's
    error shows the user only the incident id; ``GET /incidents/{id}`` (operator token) and
    ``flexdsa incidents show ID`` show the rest."""

    __tablename__ = "incidents"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    job_id: Mapped[str | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True, index=True)
    tenant_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    code: Mapped[str] = mapped_column(String(64))
    summary: Mapped[str] = mapped_column(String(1000))
    traceback: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class JobTraffic(Base):
    """One push of the shapes a deployed bundle served (``flexdsa_runtime``'s ``Traffic.snapshot()``): per
    (dims, bucket) the requests, their input elements and the elements after padding. Summed per job when read;
    past ``service.traffic.service.FOLD_AFTER_PUSHES`` rows a job's pushes are folded into one row (``pushes`` of them)."""

    __tablename__ = "job_traffic"
    __table_args__ = (Index("ix_job_traffic_job_received", "job_id", "received_at"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    tenant_id: Mapped[int] = mapped_column(Integer)
    received_at: Mapped[datetime] = mapped_column(default=utcnow)
    bundle_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    dropped: Mapped[int] = mapped_column(BigInteger, default=0)
    entries: Mapped[list[dict[str, Any]]] = mapped_column(JSONType)
    pushes: Mapped[int] = mapped_column(BigInteger, default=1, server_default="1")


class JobGroup(Base):
    """One upload compared across several targets (``POST /optimize`` with ``targets``): one job per target
    on the same stored model; ``GET /groups/{id}`` reads the jobs' reports into a comparison."""

    __tablename__ = "job_groups"
    __table_args__ = (Index("ix_job_groups_tenant_created", "tenant_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=lambda: str(uuid.uuid4()))
    tenant_id: Mapped[int] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    targets: Mapped[list[str]] = mapped_column(JSONType)
    model_filename: Mapped[str] = mapped_column(String(255))
    model_sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    jobs: Mapped[list[Job]] = relationship(order_by="Job.target", viewonly=True)
