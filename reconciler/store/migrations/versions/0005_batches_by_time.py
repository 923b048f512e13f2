"""The newest batches of one supervisor without sorting its whole history (the supervisor
page's ingested/s chart reads them on every render; the batches table is never pruned).

Revision ID: 0005
Revises: 0004
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_batches_supervisor_committed", "batches", ["supervisor_id", "committed_at"])


def downgrade() -> None:
    op.drop_index("ix_batches_supervisor_committed", table_name="batches")
