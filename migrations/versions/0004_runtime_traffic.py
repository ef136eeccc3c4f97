"""Runtime traffic and bundle versions (issue 24): the job_traffic table, and on jobs the lineage
(parent_job_id, bundle_version) and the automatic re-specialisation settings.

Revision ID: 0004_runtime_traffic
Revises: 0003
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0004_runtime_traffic"
down_revision = "0003"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIGINT_PK = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("parent_job_id", sa.String(length=36), nullable=True))
        batch.add_column(sa.Column("bundle_version", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("auto_respecialise_waste", sa.Float(), nullable=True))
        batch.add_column(sa.Column("respecialise_max_buckets", sa.Integer(), nullable=True))
        batch.create_foreign_key(
            "fk_jobs_parent_job_id", "jobs", ["parent_job_id"], ["id"], ondelete="SET NULL"
        )
        batch.create_index("ix_jobs_parent_job_id", ["parent_job_id"])
    op.create_table(
        "job_traffic",
        sa.Column("id", BIGINT_PK, autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("received_at", TIME, nullable=False),
        sa.Column("bundle_version", sa.String(length=64), nullable=True),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("dropped", sa.BigInteger(), nullable=False),
        sa.Column("entries", JSON, nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_job_traffic_job_received", "job_traffic", ["job_id", "received_at"])


def downgrade() -> None:
    op.drop_index("ix_job_traffic_job_received", table_name="job_traffic")
    op.drop_table("job_traffic")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_parent_job_id")
        batch.drop_constraint("fk_jobs_parent_job_id", type_="foreignkey")
        for column in (
            "respecialise_max_buckets",
            "auto_respecialise_waste",
            "bundle_version",
            "parent_job_id",
        ):
            batch.drop_column(column)
