"""Write fences and per-supervisor batch totals.

``writes``: one row per write of files into a table (a batch, a compaction, an import),
recorded BEFORE its files are written. The commit moves it from ``writing`` to
``committed`` in the commit's own transaction; whoever wants to delete the files of a
write that did not commit first moves it to ``discarded`` (a fence): the commit of a
discarded write fails, so no file is deleted while a process may still publish it.

``checkpoints.first_offset``: where a partition started, never moved (verify's anchor).

``supervisors.generation``: a fresh start (a new source) begins a new generation of
offsets, which ``verify`` checks apart from the old source's.

``batch_totals``: the count, records and unparseable records of each supervisor's
committed batches, kept by the publish, so ``status`` reads one row instead of
aggregating every batch.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("supervisors") as batch:
        batch.add_column(sa.Column("generation", sa.Integer, nullable=False, server_default="0"))
    with op.batch_alter_table("checkpoints") as batch:
        batch.add_column(sa.Column("first_offset", sa.BigInteger, nullable=True))
    op.create_table(
        "writes",
        sa.Column("write_id", sa.String(64), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("tables", sa.Text, nullable=True),
        sa.Column("supervisor_id", sa.String(128), nullable=True),
        sa.Column("holder", sa.String(256), nullable=True),
        sa.Column("started_at", TS, nullable=False),
        sa.Column("finished_at", TS, nullable=True),
    )
    op.create_index("ix_writes_status", "writes", ["status"])
    op.create_table(
        "batch_totals",
        sa.Column("supervisor_id", sa.String(128), primary_key=True),
        sa.Column("batches", sa.BigInteger, nullable=False),
        sa.Column("records", sa.BigInteger, nullable=False),
        sa.Column("unparseable", sa.BigInteger, nullable=False),
        sa.Column("first_at", TS, nullable=True),
        sa.Column("last_at", TS, nullable=True),
    )
    # Totals of the batches committed before this revision, once.
    op.execute(
        "INSERT INTO batch_totals (supervisor_id, batches, records, unparseable, first_at, last_at) "
        "SELECT supervisor_id, count(*), coalesce(sum(records), 0), coalesce(sum(unparseable), 0), "
        "min(committed_at), max(committed_at) FROM batches GROUP BY supervisor_id"
    )
    op.create_index("ix_batches_datasource", "batches", ["datasource"])


def downgrade() -> None:
    with op.batch_alter_table("checkpoints") as batch:
        batch.drop_column("first_offset")
    with op.batch_alter_table("supervisors") as batch:
        batch.drop_column("generation")
    op.drop_index("ix_batches_datasource", "batches")
    op.drop_table("batch_totals")
    op.drop_index("ix_writes_status", "writes")
    op.drop_table("writes")
