"""Job groups (issue 23, "which chip?"): one upload compared across several targets. The job_groups table,
and on jobs the group each belongs to (null for a single-target submission).

Revision ID: 0005_job_groups
Revises: 0004_runtime_traffic
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005_job_groups"
down_revision = "0004_runtime_traffic"
branch_labels = None
depends_on = None

TIME = sa.DateTime(timezone=True)
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "job_groups",
        sa.Column("id", sa.String(length=36), nullable=False),
        sa.Column("tenant_id", sa.Integer(), nullable=False),
        sa.Column("targets", JSON, nullable=False),
        sa.Column("model_filename", sa.String(length=255), nullable=False),
        sa.Column("model_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", TIME, nullable=False),
        sa.ForeignKeyConstraint(["tenant_id"], ["tenants.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_job_groups_tenant_created", "job_groups", ["tenant_id", "created_at"])
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("group_id", sa.String(length=36), nullable=True))
        batch.create_foreign_key("fk_jobs_group_id", "job_groups", ["group_id"], ["id"], ondelete="SET NULL")
        batch.create_index("ix_jobs_group_id", ["group_id"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_group_id")
        batch.drop_constraint("fk_jobs_group_id", type_="foreignkey")
        batch.drop_column("group_id")
    op.drop_index("ix_job_groups_tenant_created", table_name="job_groups")
    op.drop_table("job_groups")
