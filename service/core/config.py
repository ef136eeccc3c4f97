"""Service configuration: one typed ``Settings`` (env prefix ``FLEXDSA_``) behind ``get_settings()``.

No variables set = embedded mode: a SQLite file and an artifact folder under ``data_dir``, an in-process
worker thread, no Redis. Setting ``FLEXDSA_BROKER_URL`` switches to distributed mode (Celery workers on any
machine), where the safe choices are enforced at start-up rather than discovered in production: API keys
required, a shared database (not SQLite), and a broker visibility timeout longer than a job may run.

Tests build ``Settings(...)`` directly and pass it to ``create_app(settings)``; ``get_settings.cache_clear()``
resets the process-wide instance.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# The default API process count's bound: each embedded process also runs a worker, so this many jobs at once.
MAX_DEFAULT_API_WORKERS = 8

GiB = 1024**3
MIN_OPERATOR_TOKEN = 24

Mode = Literal["embedded", "distributed"]
AuthPolicy = Literal["optional", "required"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="FLEXDSA_", env_file=None, extra="ignore", validate_default=True
    )

    # Where embedded mode keeps its SQLite file and artifacts; the other paths default under it.
    data_dir: Path = Path("./flexdsa-data")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; default sqlite:///<data_dir>/flexdsa.db."
    )
    artifact_dir: Path | None = Field(
        None, description="Local artifact store root; default <data_dir>/artifacts."
    )
    artifact_url: str | None = Field(
        None,
        pattern=r"^s3://[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9](/[\w.\-/]*)?$",
        description="An S3-compatible bucket for models and artifacts, s3://bucket/prefix; None: the local "
        "artifact_dir. Credentials come from the usual AWS chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
        "AWS_PROFILE, an instance role), never from these settings.",
    )
    s3_endpoint_url: str | None = Field(
        None, description="The S3 API endpoint (Ceph RGW, MinIO, ...); None: AWS for the region."
    )
    s3_public_endpoint_url: str | None = Field(
        None,
        description="The endpoint as clients reach it, for presigned download URLs (e.g. the store's public "
        "name when the API reaches it on an internal one); None: s3_endpoint_url.",
    )
    s3_region: str | None = Field(None, description="The bucket's region; None: the AWS chain's (AWS_REGION).")
    s3_addressing_style: Literal["auto", "path", "virtual"] = "auto"
    s3_part_size_mb: int = Field(
        16, ge=5, le=5120, description="Multipart upload part size; files larger than one part go multipart."
    )
    s3_upload_concurrency: int = Field(4, ge=1, le=64, description="Parts of one upload sent at once.")
    presign_downloads: bool = Field(
        True,
        description="S3 store: answer artifact downloads with a 307 to a short-lived presigned URL (after "
        "the tenant check), so the bytes never pass through the API; False: stream them.",
    )
    presign_expiry_s: int = Field(300, ge=10, le=7 * 24 * 3600)
    store_outage_patience_s: float = Field(
        600,
        ge=0,
        description="How long a worker retries an unreachable artifact store before giving the attempt up; "
        "the API answers 503 with Retry-After at once instead.",
    )
    broker_url: str | None = Field(None, description="Celery broker. None = embedded in-process worker.")
    toolchains_dir: Path = Field(
        Path.home() / ".cache" / "flexdsa" / "toolchains",
        description="Vendor toolchain environments (`flexdsa toolchains install NAME`); jobs use those ready here.",
    )
    redis_url: str | None = Field(
        None, description="Redis for progress pub/sub and the hot kernel cache. None = none."
    )

    max_upload_bytes: int = Field(1 * GiB, gt=0)
    max_queued_jobs_per_tenant: int = Field(
        20, ge=1, description="Default quota of queued + running jobs; tenants.max_queued_jobs overrides."
    )
    submit_rate_per_minute: int | None = Field(
        120, ge=1, description="POST /optimize per tenant per minute (429 with Retry-After past it); None: off."
    )
    traffic_rate_per_minute: int | None = Field(
        120, ge=1, description="POST /jobs/{id}/traffic per tenant per minute (429 past it); None: off."
    )
    proposal_rate_per_minute: int | None = Field(
        30, ge=1, description="Re-specialisation proposals and requests (GET/POST /jobs/{id}/respecialise) per "
        "tenant per minute: each loads the model in the API (429 past it); None: off.",
    )

    job_memory_limit_mb: int | None = Field(
        16384, ge=256, description="Address-space limit of a job's pipeline process (MiB); None: no limit."
    )
    job_soft_time_limit_s: int = Field(1800, gt=0)
    job_hard_time_limit_s: int = Field(2100, gt=0)
    # Redis brokers re-deliver an unacknowledged task after this long. With late acknowledgement a job that
    # is still legitimately running would then run twice, so it must exceed the hard time limit.
    broker_visibility_timeout_s: int = Field(2400, gt=0)
    max_attempts: int = Field(3, ge=1)
    # A dead worker's job runs again within lease_seconds + reconcile_interval_s + a broker delivery (~27 s
    # with these defaults): the running worker renews its lease every min(lease/3, 10 s), so a short lease
    # costs one small UPDATE per job every ~7 s, nothing else.
    lease_seconds: int = Field(
        20, gt=0, description="A worker's claim on a job lapses unless renewed this often."
    )
    reconcile_interval_s: int = Field(
        5, gt=0, description="How often expired leases are swept and re-queued."
    )
    embedded_worker: bool = Field(
        True, description="Embedded mode: run the in-process worker inside the API."
    )
    embedded_worker_threads: int = Field(1, ge=1)
    warm_pipeline: bool = Field(
        True,
        description="Keep one pipeline process per worker thread started ahead, with the compiler imported.",
    )
    kernel_cache_ttl_s: int = Field(
        7 * 24 * 3600, gt=0, description="Expiry of kernel-cache entries in Redis (the database keeps them)."
    )

    auth: AuthPolicy | None = Field(
        None,
        description="'optional': requests without a key act as tenant 'default' (embedded default); 'required'.",
    )
    default_tenant: str = "default"
    operator_token: SecretStr | None = Field(
        None,
        description="Bearer token for the operators' surfaces (GET /metrics, service-wide GET /cache/stats), "
        "sent as 'Authorization: Bearer <token>'. Unset: /metrics answers 404 in distributed mode, and in "
        "embedded mode is served to loopback clients only.",
    )

    secure_cookies: bool | None = Field(
        None,
        description="Mark the dashboard's login cookies Secure (sent over HTTPS only). Unset: when the request "
        "came over HTTPS, and always in distributed mode unless the page was asked for on a loopback host "
        "(a TLS-terminating proxy in front hands the API plain HTTP, and the flag must not be lost there).",
    )

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    api_workers: int | None = Field(
        None,
        ge=1,
        le=64,
        description="API processes behind the one port (`flexdsa serve --workers`). Uploads are received, "
        "hashed and written in the process that accepted them, so several processes take big uploads "
        f"on several cores; in embedded mode each also runs its own in-process worker. None: one per core "
        f"this process may use, at most {MAX_DEFAULT_API_WORKERS}.",
    )

    def api_processes(self) -> int:
        """How many API processes ``flexdsa serve`` starts: ``api_workers`` when set, else one per usable core
        (bench.ingest: one process took big uploads at 65% of the disk's rate, two at 78%), bounded."""
        if self.api_workers is not None:
            return self.api_workers
        try:
            cores = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cores = os.cpu_count() or 1
        return max(1, min(cores, MAX_DEFAULT_API_WORKERS))
    sse_poll_interval_s: float = Field(0.5, gt=0)
    log_level: str = "info"
    log_format: Literal["json", "text"] = Field(
        "json", description="json: one object per line with job_id/tenant_id/incident; text: for a terminal."
    )

    @property
    def mode(self) -> Mode:
        return "embedded" if self.broker_url is None else "distributed"

    @property
    def is_sqlite(self) -> bool:
        return (self.database_url or "").startswith("sqlite")

    def database_shown(self) -> str:
        """The database as operators see it (``flexdsa serve``'s start-up line, ``flexdsa keys create``):
        a SQLite file by its absolute path, any other URL without its password."""
        from sqlalchemy.engine import make_url

        url = make_url(self.database_url)
        if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
            return f"SQLite file {Path(url.database).resolve()}"
        return url.render_as_string(hide_password=True)

    def keys_read_from(self) -> str:
        """Where API keys are looked up, as a refused client is told: embedded mode's SQLite file by its path
        (the key was likely made in another directory, hence another file); a shared database not by its URL,
        which is the operator's to know."""
        if self.is_sqlite:
            return self.database_shown()
        return "the database FLEXDSA_DATABASE_URL names on the server"

    @model_validator(mode="after")
    def _fill_defaults_and_refuse_unsafe(self) -> Settings:
        if self.database_url is None:
            self.database_url = f"sqlite:///{(self.data_dir / 'flexdsa.db').as_posix()}"
        if self.artifact_dir is None:
            self.artifact_dir = self.data_dir / "artifacts"
        if self.auth is None:
            self.auth = "optional" if self.mode == "embedded" else "required"

        problems = []
        if self.mode == "distributed":
            if self.auth == "optional":
                problems.append(
                    "FLEXDSA_AUTH=optional is refused in distributed mode: any client could act as the default "
                    "tenant. Leave FLEXDSA_AUTH unset (required) and create keys with `flexdsa keys create`."
                )
            if self.is_sqlite:
                problems.append(
                    "Distributed mode (FLEXDSA_BROKER_URL set) needs a database every worker can reach; "
                    "set FLEXDSA_DATABASE_URL=postgresql+psycopg://..."
                )
        if (
            self.operator_token is not None
            and len(self.operator_token.get_secret_value()) < MIN_OPERATOR_TOKEN
        ):
            problems.append(
                f"FLEXDSA_OPERATOR_TOKEN is shorter than {MIN_OPERATOR_TOKEN} characters; use a random one, "
                'e.g. python -c "import secrets; print(secrets.token_urlsafe(32))".'
            )
        if self.job_soft_time_limit_s >= self.job_hard_time_limit_s:
            problems.append(
                f"FLEXDSA_JOB_SOFT_TIME_LIMIT_S ({self.job_soft_time_limit_s}) must be below "
                f"FLEXDSA_JOB_HARD_TIME_LIMIT_S ({self.job_hard_time_limit_s}) so a job can clean up before it is killed."
            )
        if self.broker_visibility_timeout_s <= self.job_hard_time_limit_s:
            problems.append(
                f"FLEXDSA_BROKER_VISIBILITY_TIMEOUT_S ({self.broker_visibility_timeout_s}) must exceed "
                f"FLEXDSA_JOB_HARD_TIME_LIMIT_S ({self.job_hard_time_limit_s}), or the broker re-delivers "
                "jobs that are still running."
            )
        if self.reconcile_interval_s >= self.lease_seconds:
            problems.append(
                f"FLEXDSA_RECONCILE_INTERVAL_S ({self.reconcile_interval_s}) must be below FLEXDSA_LEASE_SECONDS "
                f"({self.lease_seconds}), or expired leases linger for more than a lease."
            )
        if problems:
            raise ValueError("Unsafe Flex-DSA configuration:\n  - " + "\n  - ".join(problems))
        return self


@lru_cache
def get_settings() -> Settings:
    return Settings()
