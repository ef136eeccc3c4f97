"""A job names its model (issue 35, gates for pipelines): ``jobs.model_name``, the request's ``model_name`` or
the uploaded file's name without its suffix, so a job finds the previous successful job of the same model on
the same target to compare itself with (index on tenant, model name, target). Rows from before: null (they
are nobody's predecessor).

Revision ID: 0007_model_name
Revises: 0006_traffic_folding
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_model_name"
down_revision = "0006_traffic_folding"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("model_name", sa.String(length=255), nullable=True))
        batch.create_index("ix_jobs_tenant_model_target", ["tenant_id", "model_name", "target", "created_at"])


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_tenant_model_target")
        batch.drop_column("model_name")
