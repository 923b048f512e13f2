"""Freshness (issue 32): lag observations of the lag policies, webhook cursors.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "lag_observations",
        sa.Column("supervisor_id", sa.String(128), primary_key=True),
        sa.Column("observed_at", TS, nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("records", sa.BigInteger),
        sa.Column("lag_ms", sa.BigInteger),
        sa.Column("breach_since", TS),
        sa.Column("fired_at", TS),
    )
    op.create_table(
        "webhook_cursors",
        sa.Column("endpoint", sa.String(64), primary_key=True),
        sa.Column("label", sa.String(256), nullable=False),
        sa.Column("last_id", sa.BigInteger, nullable=False),
        sa.Column("failing_since", TS),
        sa.Column("last_error", sa.Text),
        sa.Column("delivered_at", TS),
        sa.Column("updated_at", TS, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("webhook_cursors")
    op.drop_table("lag_observations")
