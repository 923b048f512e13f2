"""The publish with the tables in the lake's catalog (``catalog: {type: glue | rest}``): the
table first, then the database.

The catalog's commit cannot join our transaction, so the table is the source of truth:

1. ``prepare`` (before the step reads its checkpoints): roll the database forward to the
   table (``fence.roll_forward``: the supervisor's batches the table has and the database
   has not, a crash between the two commits) and note where the supervisor's fence tag is
   (H). A reset that fenced the table and has not bumped the epoch yet makes the step wait.
2. ``publish``: one catalog commit appending the batch, asserting the tag is at H and moving
   it to the new snapshot (a reset or another leader's batch in between: ``PublishConflict``,
   nothing committed, the files are discarded). pyiceberg's own commit retries stay off: a
   retried commit would drop the fence (``ExternalTables.commit_fenced``).
3. Then the batch's dead letters (their file list rides in the batch's summary, so a
   roll-forward commits them too) and the database: epoch, lease and checkpoints as in the SQL
   publish. If the database refuses (a reset or a new leader came after the table commit) the
   batch is rolled forward instead: the table holds it and it starts where the supervisor's
   previous commit ended. If the database cannot be reached, ``BatchInTable``: the files stay
   and the next step rolls forward.

RELIABILITY.md, "External catalogs", has the argument.
"""

from __future__ import annotations

import json
import logging
import random
import time

from reconciler import faults
from reconciler.errors import PublishConflict
from reconciler.runtime.publish_sql import PUBLISH_ATTEMPTS
from reconciler.runtime.publishing import BatchInTable, ResetUnderway
from reconciler.store.store import TableConflict

log = logging.getLogger(__name__)


# A reset bumps the epoch within seconds of its fence; a supervisor held longer says why in status.
STALLED_AFTER = 30.0


class ExternalPublish:
    def __init__(self, ctx):
        self.ctx = ctx
        self._held: dict[tuple[str, int], float] = {}  # (supervisor, fence snapshot): since when

    def prepare(self, rec, datasource: str):
        from reconciler.table.catalogs import fence

        head = fence.roll_forward(self.ctx.tables(), self.ctx.store, datasource, rec.id)
        if not head.blocks(rec.epoch):
            self._held = {k: v for k, v in self._held.items() if k[0] != rec.id}
            return head
        since = self._held.setdefault((rec.id, head.snapshot_id), time.monotonic())
        limit = max(STALLED_AFTER, rec.spec.task_duration)
        stalled = time.monotonic() - since > limit
        # no running count in it: status is written when its message changes
        why = (f"; held for over {limit:g}s: the reset failed or crashed after fencing the table, and finishes "
               "when applied again (its marker or stanza on the next pass, or `reconciler reset` again)"
               if stalled else "")
        raise ResetUnderway(f"a reset fenced table {datasource} for epoch {head.fence_epoch} (this step read "
                            f"epoch {rec.epoch}): the batch waits for the reset to finish{why}", stalled=stalled)

    def publish(self, rec, ds, written, summary, files, schema, dead_schema, ranges, records: int, head=None) -> None:
        from reconciler.table.catalog import TableConflict as Restage
        from reconciler.table.catalogs import fence
        from reconciler.table.catalogs.external import CatalogUnreachable, FenceMoved

        tables = self.ctx.tables()
        at = head.snapshot_id if head is not None else None
        summary = {**summary, fence.FENCE_PREV: str(at or "")}
        if written.dead_files:
            summary[fence.DEAD_FILES] = json.dumps([f.path for f in written.dead_files])
        ref = (fence.tag_name(rec.id), at)
        for attempt in range(PUBLISH_ATTEMPTS):
            try:
                faults.crash_point("before-commit", rec.id)
                tables.commit_append(ds.datasource, [f.path for f in written.files], summary, fence=ref,
                                     schema=schema, granularity=ds.segment_granularity, rollup=ds.rollup,
                                     write_id=written.batch_id, attempt=attempt)
                break
            except FenceMoved as exc:
                if self.ctx.metrics:
                    self.ctx.metrics.publish_conflict(rec.id)
                raise PublishConflict(f"{rec.id}: {exc} (a reset or another leader came first); batch "
                                      f"{written.batch_id} discarded") from None
            except Restage as exc:
                if attempt == PUBLISH_ATTEMPTS - 1:
                    raise TableConflict(str(exc)) from None
                time.sleep(random.uniform(0.0, 0.05 * (attempt + 1)))  # concurrent writers: spread out
            except CatalogUnreachable as exc:  # the commit's outcome is unknown: the fence tag will say
                raise BatchInTable(f"{exc}; batch {written.batch_id[:12]} is kept until the table says whether "
                                   "it committed") from None
        # In the table now: from here on nothing may delete this batch's files.
        faults.crash_point("between-commits", rec.id)
        try:
            fence.commit_dead_letters(tables, ds.datasource, rec.id, {**summary})
            self.ctx.store.publish(supervisor_id=rec.id, epoch=rec.epoch, batch_id=written.batch_id,
                                   datasource=ds.datasource, ranges=ranges, files=files, records=records,
                                   unparseable=written.dead_rows, lease=self.ctx.lease())
        except PublishConflict as exc:
            # A reset's fence or another leader came after the table commit: the table holds the
            # batch, on top of this supervisor's previous commit, so the database follows it.
            log.info("%s; the table committed it first: rolled forward", exc, extra={"supervisor": rec.id})
            self._roll_forward(rec, ds, written, ranges, records)
        except Exception as exc:  # noqa: BLE001 - the database (or the catalog) away: the table decides
            raise BatchInTable(f"batch {written.batch_id[:12]} committed to table {ds.datasource}, not yet to the "
                               f"metadata database ({type(exc).__name__}: {exc}); the next step rolls it "
                               "forward") from exc

    def _roll_forward(self, rec, ds, written, ranges, records: int) -> None:
        try:
            self.ctx.store.roll_forward(supervisor_id=rec.id, batch_id=written.batch_id, datasource=ds.datasource,
                                        epoch=rec.epoch, ranges=ranges, records=records,
                                        unparseable=written.dead_rows, rows=sum(f.rows for f in written.files))
        except Exception as exc:  # noqa: BLE001
            raise BatchInTable(f"batch {written.batch_id[:12]} is in table {ds.datasource}; recording it failed "
                               f"({type(exc).__name__}: {exc}); the next step rolls it forward") from exc
