"""The initial schema: supervisors, spec versions, checkpoints, batches, segments,
audit log, request tokens, leases.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "supervisors",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("parent_id", sa.String(128)),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("spec_hash", sa.String(32), nullable=False),
        sa.Column("spec_path", sa.Text),
        sa.Column("state", sa.String(32), nullable=False),
        sa.Column("detailed_state", sa.String(48), nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False, server_default="1"),
        sa.Column("last_request", sa.String(256)),
        sa.Column("spec_error", sa.Text),
        sa.Column("runtime_error", sa.Text),
        sa.Column("last_attempted_hash", sa.String(32)),
        sa.Column("start_offsets", sa.Text),
        sa.Column("end_offsets", sa.Text),
        sa.Column("created_at", TS, nullable=False),
        sa.Column("updated_at", TS, nullable=False),
    )
    op.create_table(
        "spec_versions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("supervisor_id", sa.String(128), nullable=False, index=True),
        sa.Column("spec_hash", sa.String(32), nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "checkpoints",
        sa.Column("supervisor_id", sa.String(128), primary_key=True),
        sa.Column("partition", sa.String(255), primary_key=True),
        sa.Column("next_offset", sa.BigInteger, nullable=False),
    )
    op.create_table(
        "batches",
        sa.Column("batch_id", sa.String(128), primary_key=True),
        sa.Column("supervisor_id", sa.String(128), nullable=False, index=True),
        sa.Column("datasource", sa.String(128), nullable=False),
        sa.Column("epoch", sa.Integer, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("ranges", sa.Text, nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("records", sa.BigInteger, nullable=False),
        sa.Column("unparseable", sa.BigInteger, nullable=False),
        sa.Column("committed_at", TS, nullable=False),
        sa.Column("promoted_at", TS),
    )
    op.create_table(
        "segments",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("datasource", sa.String(128), nullable=False, index=True),
        sa.Column("supervisor_id", sa.String(128), nullable=False),
        sa.Column("batch_id", sa.String(128), nullable=False, index=True),
        sa.Column("segment", sa.String(32), nullable=False),
        sa.Column("interval_start", sa.String(32), nullable=False),
        sa.Column("interval_end", sa.String(32), nullable=False),
        sa.Column("path", sa.Text, nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", TS, nullable=False),
    )
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("supervisor_id", sa.String(128), nullable=False, index=True),
        sa.Column("at", TS, nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(128), nullable=False),
        sa.Column("trigger", sa.Text),
        sa.Column("reason", sa.Text),
        sa.Column("details", sa.Text),
    )
    op.create_table(
        "requests",
        sa.Column("token", sa.String(160), primary_key=True),
        sa.Column("supervisor_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("result", sa.Text),
        sa.Column("handled_at", TS, nullable=False),
    )
    op.create_table(
        "leases",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("holder", sa.String(256), nullable=False),
        sa.Column("token", sa.BigInteger, nullable=False),
        sa.Column("expires_at", TS, nullable=False),
    )


def downgrade() -> None:
    for name in ("leases", "requests", "audit_log", "segments", "batches", "checkpoints",
                 "spec_versions", "supervisors"):
        op.drop_table(name)
