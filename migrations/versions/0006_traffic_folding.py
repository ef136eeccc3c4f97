"""Traffic pushes folded into one row per job past a count (issue 37: reads summed every push without bound):
``job_traffic.pushes``, how many pushes a row holds (1 for a push as received).

Revision ID: 0006_traffic_folding
Revises: 0005_job_groups
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_traffic_folding"
down_revision = "0005_job_groups"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job_traffic") as batch:
        batch.add_column(sa.Column("pushes", sa.BigInteger(), nullable=False, server_default="1"))


def downgrade() -> None:
    with op.batch_alter_table("job_traffic") as batch:
        batch.drop_column("pushes")
