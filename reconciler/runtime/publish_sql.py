"""The publish with the tables in the metadata database (``catalog: {type: sql}``): one
transaction.

The table commits are staged up to their metadata files (``Tables.stage_append``); the
store's ``publish`` moves each table's pointer with a compare-and-swap in the same
transaction as the epoch check, the checkpoints' compare-and-swap and the batch's record.
Either everything is visible or nothing is: a lost compare-and-swap rolls the whole
transaction back and the staged files are unreferenced (discarded here, or by recovery).
A table moved by another writer in between (a backfill of the same datasource, a
compaction) is staged again on its new metadata, the data files staying where they are.
"""

from __future__ import annotations

import random
import time

from reconciler import faults
from reconciler.errors import PublishConflict
from reconciler.store.store import TableConflict

PUBLISH_ATTEMPTS = 20  # table commits staged again after another writer moved the table


class SqlPublish:
    def __init__(self, ctx):
        self.ctx = ctx

    def prepare(self, rec, datasource: str) -> None:
        """Nothing to learn from the table: the database is the truth."""
        return None

    def publish(self, rec, ds, written, summary, files, schema, dead_schema, ranges, records: int, head=None) -> None:
        from reconciler.table.catalog import deadletter_table

        tables = self.ctx.tables()
        for attempt in range(PUBLISH_ATTEMPTS):
            commits = [tables.stage_append(ds.datasource, [f.path for f in written.files], summary,
                                           schema=schema, granularity=ds.segment_granularity, rollup=ds.rollup,
                                           write_id=written.batch_id, attempt=attempt)]
            if written.dead_files:
                commits.append(tables.stage_append(deadletter_table(ds.datasource),
                                                   [f.path for f in written.dead_files], summary, schema=dead_schema,
                                                   write_id=written.batch_id, attempt=attempt))
            try:
                faults.crash_point("before-commit", rec.id)
                self.ctx.store.publish(supervisor_id=rec.id, epoch=rec.epoch, batch_id=written.batch_id,
                                       datasource=ds.datasource, ranges=ranges, files=files, records=records,
                                       unparseable=written.dead_rows, lease=self.ctx.lease(),
                                       table_commits=commits)
                tables.committed(commits)
                return
            except PublishConflict:
                if self.ctx.metrics:
                    self.ctx.metrics.publish_conflict(rec.id)
                raise
            except TableConflict:
                tables.discard_staged(commits)  # the transaction rolled back: nothing references them
                if attempt == PUBLISH_ATTEMPTS - 1:
                    raise
                time.sleep(random.uniform(0.0, 0.05 * (attempt + 1)))  # concurrent writers: spread out
