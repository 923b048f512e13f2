"""Batches: the publish (table snapshots and checkpoints in one compare-and-swap
transaction), and what committed (ids, totals, segment rows)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from reconciler.errors import CommitOutcomeUnknown, PublishConflict, RetryableError
from reconciler.model import PartitionRange
from reconciler.store.base import _aware, utcnow
from reconciler.store.records import BatchTotals, SegmentRow
from reconciler.store.tables import (
    batch_totals,
    batches,
    checkpoints,
    iceberg_tables,
    segments,
    supervisors,
    writes,
)
from reconciler.store.writes import COMMITTING, WRITING

TABLE_CATALOG, TABLE_NAMESPACE = "reconciler", "default"  # reconciler.table.catalog's names
_RESOLVE_ATTEMPTS = 4  # an unknown outcome's resolution, a committed write's row: ~0.6 s in all

log = logging.getLogger(__name__)


class TableConflict(RetryableError):
    """A table's metadata pointer moved since the commit was staged (another batch of
    the same datasource, a compaction): nothing was published; stage again and retry."""


@dataclass(frozen=True)
class SegmentFile:
    """One committed Parquet file, as the pipeline reports it to publish."""

    segment: str
    interval_start: str
    interval_end: str
    path: str
    rows: int
    bytes: int


class BatchesMixin:
    def publish(self, *, supervisor_id: str, epoch: int, batch_id: str, datasource: str,
                ranges: Sequence[PartitionRange], files: Iterable[SegmentFile], records: int,
                unparseable: int, lease: tuple[str, int] | None = None, now=None,
                table_commits: Sequence[Any] = ()) -> None:
        """Commit a batch's table snapshots and move its checkpoints, or nothing.

        ``table_commits`` (``reconciler.table.catalog.TableCommit``: table, expected, new)
        move each table's metadata pointer with a compare-and-swap on its current
        location, in this transaction: readers see the batch's rows exactly when the
        checkpoints move. Raises PublishConflict when the supervisor's epoch changed
        (reset, terminate, recreate), any checkpoint is no longer at its range's start, or
        the lease (holder, token) is no longer ours; TableConflict when a table moved since
        its commit was staged (nothing is published: stage again).
        """
        now = now or utcnow()
        files = list(files)
        with self._write() as c:
            if lease is not None:
                self._check_lease(c, *lease)
            hit = c.execute(
                sa.update(supervisors).where(supervisors.c.id == supervisor_id, supervisors.c.epoch == epoch)
                .values(updated_at=now)
            ).rowcount
            if hit != 1:
                raise PublishConflict(f"{supervisor_id}: epoch is no longer {epoch} (reset, recreate or terminate); batch {batch_id} discarded")
            for rng in ranges:
                moved = c.execute(
                    sa.update(checkpoints).where(
                        checkpoints.c.supervisor_id == supervisor_id,
                        checkpoints.c.partition == rng.partition,
                        checkpoints.c.next_offset == rng.start,
                    ).values(next_offset=rng.end)
                ).rowcount
                if moved != 1:
                    raise PublishConflict(
                        f"{supervisor_id}: partition {rng.partition} checkpoint is no longer {rng.start}; batch {batch_id} discarded"
                    )
            _move_pointers(c, table_commits, f"batch {batch_id}")
            self._finish_write(c, batch_id, "batch", supervisor_id=supervisor_id)
            c.execute(sa.insert(batches).values(
                batch_id=batch_id, supervisor_id=supervisor_id, datasource=datasource, epoch=epoch,
                status="committed", ranges=json.dumps([[r.partition, r.start, r.end] for r in ranges]),
                rows=sum(f.rows for f in files), records=records, unparseable=unparseable, committed_at=now,
            ))
            if files:
                c.execute(sa.insert(segments), [
                    dict(datasource=datasource, supervisor_id=supervisor_id, batch_id=batch_id, segment=f.segment,
                         interval_start=f.interval_start, interval_end=f.interval_end, path=f.path, rows=f.rows,
                         bytes=f.bytes, created_at=now)
                    for f in files
                ])
            _add_totals(c, supervisor_id, records, unparseable, now)

    def roll_forward(self, *, supervisor_id: str, batch_id: str, datasource: str, epoch: int,
                     ranges: Sequence[PartitionRange], records: int, unparseable: int, rows: int = 0,
                     now=None) -> bool:
        """Record a batch the table committed and this database did not (an external catalog:
        the table first, then the database; a crash in between). Whatever the epoch or the
        lease is now: the table holds the batch, so its write is committed and each checkpoint
        still at its range's start moves to the range's end (one that moved elsewhere, a
        fresh start's, stays). False when the batch was recorded already (by whoever rolled it
        forward first: a reset, the next step, the next leader)."""
        now = now or utcnow()
        try:
            return self._roll_forward(supervisor_id, batch_id, datasource, epoch, ranges, records, unparseable,
                                      rows, now)
        except sa.exc.IntegrityError:  # recorded concurrently: the other transaction moved everything
            return False

    def _roll_forward(self, supervisor_id, batch_id, datasource, epoch, ranges, records, unparseable, rows,
                      now) -> bool:
        with self._write() as c:
            if c.execute(sa.select(batches.c.batch_id).where(batches.c.batch_id == batch_id)).first():
                return False
            for rng in ranges:
                c.execute(sa.update(checkpoints).where(
                    checkpoints.c.supervisor_id == supervisor_id, checkpoints.c.partition == rng.partition,
                    checkpoints.c.next_offset == rng.start).values(next_offset=rng.end))
            # committed in the table: whatever a clean-up wrote of it (it never fences one
            # before rolling its supervisor forward), its files are referenced now
            c.execute(sa.delete(writes).where(writes.c.write_id == batch_id))
            c.execute(sa.insert(batches).values(
                batch_id=batch_id, supervisor_id=supervisor_id, datasource=datasource, epoch=epoch,
                status="committed", ranges=json.dumps([[r.partition, r.start, r.end] for r in ranges]),
                rows=rows, records=records, unparseable=unparseable, committed_at=now))
            _add_totals(c, supervisor_id, records, unparseable, now)
        return True

    def commit_tables(self, write_id: str, kind: str, table_commits: Sequence[Any]) -> None:
        """Commit a maintenance write (compaction, import, expiry): move the tables' metadata
        pointers (compare-and-swap, as in ``publish``) and finish the write, in one
        transaction. Raises TableConflict when a table moved since it was staged and
        WriteFenced when a clean-up discarded the write first (nothing committed).

        A commit to the lake's catalog (``external``: it cannot join this transaction) goes
        the other way round: the write is marked ``committing`` first (no fence can discard
        it then, so no clean-up deletes its files once the table references them, and orphan
        clean-up keeps its files while the catalog's commit is under way: a row deleted first
        read as "committed, unreferenced files superseded"), then the catalog commits and the
        row goes; a conflict records the write as in flight again and raises TableConflict.
        A crash in between leaves the row ``committing``: its files are kept, never deleted."""
        external = [tc for tc in table_commits if getattr(tc, "external", False)]
        if external:
            return self._commit_external(write_id, kind, external)
        with self._write() as c:
            _move_pointers(c, table_commits, f"{kind} {write_id}")
            self._finish_write(c, write_id, kind)

    def _commit_external(self, write_id: str, kind: str, table_commits: Sequence[Any]) -> None:
        from reconciler.table.catalog import TableConflict as Restage

        try:
            with self._write() as c:
                self._finish_write(c, write_id, kind)  # fenced first: WriteFenced, nothing committed
                c.execute(sa.insert(writes).values(write_id=write_id, kind=kind, status=COMMITTING,
                                                   tables=json.dumps([tc.table for tc in table_commits]),
                                                   started_at=utcnow()))
        except CommitOutcomeUnknown:
            # The callers' rule for an unknown outcome (fence the write; not fenced means it
            # committed) does not hold here: a ``committing`` row is not the catalog's commit.
            # Decided now: not recorded, the write is fenced and the error goes on (the
            # caller's fence finds it fenced); recorded, the catalog's commit goes on (explorer
            # seed 1373336393: a compaction reported committed, its files referenced by nothing).
            if not self._retried(lambda: self.committing_or_fenced(write_id, kind),
                                 f"{kind} {write_id}: whether it was recorded is unknown and the database "
                                 "does not answer; nothing was committed to the catalog, and its files are kept "
                                 "(the leader's recovery deletes them if it was not recorded)"):
                raise
        try:
            for tc in table_commits:
                tc.commit()
        except Restage as exc:  # nothing committed: the write is in flight again, its files protected
            self._retried(lambda: self._back_to_writing(write_id),
                          f"{kind} {write_id} was refused by the catalog and stays '{COMMITTING}' (its files "
                          "are kept); nothing was committed")
            raise TableConflict(str(exc)) from None
        self._forget_committed(write_id)

    def _back_to_writing(self, write_id: str) -> None:
        """A write the catalog refused is in flight again. Idempotent: a try whose outcome was
        unknown and landed leaves nothing to move, and is not mistaken for a commit by the
        caller's fence (an unknown outcome reaching it read ``committing`` as committed)."""
        with self._write() as c:
            c.execute(sa.update(writes).where(writes.c.write_id == write_id, writes.c.status == COMMITTING)
                      .values(status=WRITING))

    def _retried(self, step, gave_up: str):
        """``step()``, tried again while the database fails (each try decides anew, so an
        unknown outcome of one is safe to repeat). When it never answers, a RetryableError
        saying ``gave_up``: never CommitOutcomeUnknown, which the callers would resolve with
        a fence that reads ``committing`` as committed."""
        for attempt in range(_RESOLVE_ATTEMPTS):
            try:
                return step()
            except RetryableError as exc:
                if attempt == _RESOLVE_ATTEMPTS - 1:
                    raise RetryableError(f"{gave_up} ({exc})") from exc
                time.sleep(0.1 * (attempt + 1))
        raise AssertionError("unreachable")

    def _forget_committed(self, write_id: str) -> None:
        """The catalog committed: the row goes (idempotent, so retried). A row that stays
        ``committing`` only keeps the write's files from orphan clean-up, so the commit is
        reported, not failed, when the database does not answer."""

        def forget() -> None:
            with self._write() as c:
                c.execute(sa.delete(writes).where(writes.c.write_id == write_id))

        try:
            self._retried(forget, f"write {write_id} committed to the catalog; its row stays '{COMMITTING}'")
        except RetryableError as exc:
            log.warning("%s", exc)

    def committed_batch_ids(self, batch_ids: Iterable[str]) -> set[str]:
        ids = list(batch_ids)
        if not ids:
            return set()
        with self._read() as c:
            return set(c.execute(sa.select(batches.c.batch_id).where(batches.c.batch_id.in_(ids))).scalars())

    def batch_totals(self, supervisor_id: str) -> BatchTotals:
        with self._read() as c:
            row = c.execute(sa.select(batch_totals).where(batch_totals.c.supervisor_id == supervisor_id)).first()
        return _totals(row) if row else BatchTotals()

    def all_batch_totals(self) -> dict[str, BatchTotals]:
        """``batch_totals`` of every supervisor with batches, in one query (``status`` of a thousand)."""
        with self._read() as c:
            rows = c.execute(sa.select(batch_totals)).all()
        return {r.supervisor_id: _totals(r) for r in rows}

    def segments(self, datasource: str) -> list[SegmentRow]:
        with self._read() as c:
            rows = c.execute(
                sa.select(segments, batches.c.ranges).join(batches, batches.c.batch_id == segments.c.batch_id)
                .where(segments.c.datasource == datasource).order_by(segments.c.interval_start, segments.c.id)
            ).mappings().all()
        return [SegmentRow(**r) for r in rows]


def _move_pointers(c, table_commits: Sequence[Any], what: str) -> None:
    """The tables' metadata pointers from the version each commit was staged on to its new
    one (``reconciler.table.catalog.TableCommit``), or TableConflict."""
    for tc in table_commits:
        moved = c.execute(
            sa.update(iceberg_tables).where(
                iceberg_tables.c.catalog_name == TABLE_CATALOG,
                iceberg_tables.c.table_namespace == TABLE_NAMESPACE,
                iceberg_tables.c.table_name == tc.table,
                iceberg_tables.c.metadata_location == tc.expected,
            ).values(metadata_location=tc.new, previous_metadata_location=tc.expected)
        ).rowcount
        if moved != 1:
            raise TableConflict(f"table {tc.table} changed since {what} was staged")


def _add_totals(c, supervisor_id: str, records: int, unparseable: int, now) -> None:
    hit = c.execute(sa.update(batch_totals).where(batch_totals.c.supervisor_id == supervisor_id).values(
        batches=batch_totals.c.batches + 1, records=batch_totals.c.records + records,
        unparseable=batch_totals.c.unparseable + unparseable, last_at=now)).rowcount
    if not hit:
        c.execute(sa.insert(batch_totals).values(supervisor_id=supervisor_id, batches=1, records=records,
                                                 unparseable=unparseable, first_at=now, last_at=now))


def _totals(r) -> BatchTotals:
    return BatchTotals(int(r.batches), int(r.records), int(r.unparseable), _aware(r.first_at), _aware(r.last_at))
