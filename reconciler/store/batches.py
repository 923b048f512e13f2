"""Batches: the publish (table snapshots and checkpoints in one compare-and-swap
transaction), and what committed (ids, totals, segment rows)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from reconciler.errors import PublishConflict, RetryableError
from reconciler.model import PartitionRange
from reconciler.store.base import _aware, utcnow
from reconciler.store.records import BatchTotals, SegmentRow
from reconciler.store.tables import batches, checkpoints, iceberg_tables, segments, supervisors

TABLE_CATALOG, TABLE_NAMESPACE = "reconciler", "default"  # reconciler.table.catalog's names


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
                    raise TableConflict(f"table {tc.table} changed since batch {batch_id} was staged")
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

    def committed_batch_ids(self, batch_ids: Iterable[str]) -> set[str]:
        ids = list(batch_ids)
        if not ids:
            return set()
        with self._read() as c:
            return set(c.execute(sa.select(batches.c.batch_id).where(batches.c.batch_id.in_(ids))).scalars())

    def batch_totals(self, supervisor_id: str) -> BatchTotals:
        with self._read() as c:
            row = c.execute(sa.select(
                sa.func.count(), sa.func.coalesce(sa.func.sum(batches.c.records), 0),
                sa.func.coalesce(sa.func.sum(batches.c.unparseable), 0), sa.func.min(batches.c.committed_at),
                sa.func.max(batches.c.committed_at),
            ).where(batches.c.supervisor_id == supervisor_id)).one()
        return BatchTotals(int(row[0]), int(row[1]), int(row[2]), _aware(row[3]), _aware(row[4]))

    def all_batch_totals(self) -> dict[str, BatchTotals]:
        """``batch_totals`` of every supervisor with batches, in one query (``status`` of a thousand)."""
        with self._read() as c:
            rows = c.execute(sa.select(
                batches.c.supervisor_id, sa.func.count(), sa.func.coalesce(sa.func.sum(batches.c.records), 0),
                sa.func.coalesce(sa.func.sum(batches.c.unparseable), 0), sa.func.min(batches.c.committed_at),
                sa.func.max(batches.c.committed_at),
            ).group_by(batches.c.supervisor_id)).all()
        return {r[0]: BatchTotals(int(r[1]), int(r[2]), int(r[3]), _aware(r[4]), _aware(r[5])) for r in rows}

    def segments(self, datasource: str) -> list[SegmentRow]:
        with self._read() as c:
            rows = c.execute(
                sa.select(segments, batches.c.ranges).join(batches, batches.c.batch_id == segments.c.batch_id)
                .where(segments.c.datasource == datasource).order_by(segments.c.interval_start, segments.c.id)
            ).mappings().all()
        return [SegmentRow(**r) for r in rows]
