"""The lag observer's samples, so the status page's charts survive a restart and a leader
change (issue 46): the last hour per supervisor, pruned as they are written.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lag_samples",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("supervisor_id", sa.String(128), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("records", sa.BigInteger),
        sa.Column("lag_ms", sa.BigInteger),
        sa.Column("ingested", sa.BigInteger),
    )
    op.create_index("ix_lag_samples_at", "lag_samples", ["at"])
    op.create_index("ix_lag_samples_supervisor_at", "lag_samples", ["supervisor_id", "at"])


def downgrade() -> None:
    op.drop_table("lag_samples")
