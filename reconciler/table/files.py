"""What a table holds, read from its metadata: the data files of the current snapshot
with the batch and offset ranges of the snapshot that added each, and the offset
ranges of every batch snapshot in the current lineage."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Snapshot, ancestors_of
from pyiceberg.transforms import (
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    YearTransform,
)

from reconciler.table.summary import (
    BATCH,
    EPOCH,
    GENERATION,
    RANGES,
    SUPERVISOR,
    range_key,
    summary_ranges,
    summary_read,
)
from reconciler.table.writeids import BATCH_DIR_PREFIX

EPOCH_START = datetime(1970, 1, 1, tzinfo=UTC)
LAST_INSTANT = datetime.max.replace(tzinfo=UTC)  # where 9999's last partition ends (10000 has no datetime)


@dataclass(frozen=True)
class BatchSnapshot:
    """One snapshot of the current lineage that a batch publish wrote."""

    snapshot_id: int
    committed_at: datetime
    supervisor_id: str
    batch_id: str
    epoch: int
    ranges: tuple[tuple[str, int, int], ...]  # (partition, start, end)
    generation: int = 0  # the source generation (a fresh start begins a new one)
    read: Mapping[str, int] | None = None  # records delivered per partition, when recorded

    @property
    def key(self) -> str:
        return range_key(self.supervisor_id, self.generation)


@dataclass(frozen=True)
class TableFile:
    """One data file of the current snapshot."""

    path: str
    rows: int
    bytes: int
    segment: str  # the time chunk the file was written for (or its partition, for other writers)
    interval_start: datetime | None
    interval_end: datetime | None
    snapshot_id: int | None  # the snapshot that added it
    batch_id: str | None
    supervisor_id: str | None
    ranges: tuple[tuple[str, int, int], ...] = field(default=())  # what this file holds (see own_ranges)
    committed_at: datetime | None = None
    batch_ranges: tuple[tuple[str, int, int], ...] = field(default=())  # the committing batch's, all files
    exact: bool = False  # ``ranges`` narrowed by the file's own statistics, not the batch's
    # a file no batch committed (a compaction's) of several partitions: its statistics bound
    # the partitions and the offsets over the whole file, not per partition: (p_lo, p_hi, o_lo, o_hi)
    bounds: tuple[str, str, int, int] | None = None

    @property
    def ranges_from(self) -> str:
        if self.bounds is not None:
            return "file bounds"
        return "file statistics" if self.exact else "batch"

    def to_dict(self, datasource: str) -> dict:
        return {
            "datasource": datasource, "path": self.path, "rows": self.rows, "bytes": self.bytes,
            "segment": self.segment,
            "interval_start": self.interval_start.isoformat().replace("+00:00", "Z") if self.interval_start else None,
            "interval_end": self.interval_end.isoformat().replace("+00:00", "Z") if self.interval_end else None,
            "snapshot_id": self.snapshot_id, "batch_id": self.batch_id, "supervisor_id": self.supervisor_id,
            "created_at": self.committed_at.isoformat() if self.committed_at else None,
            "ranges": [{"partition": p, "start": s, "end": e} for p, s, e in self.ranges],
            "rangesFrom": self.ranges_from,
            "bounds": None if self.bounds is None else {
                "partitions": [self.bounds[0], self.bounds[1]], "offsets": [self.bounds[2], self.bounds[3]]},
            "batchRanges": [{"partition": p, "start": s, "end": e} for p, s, e in self.batch_ranges],
        }


def _summary(snapshot: Snapshot) -> dict[str, str]:
    return dict(snapshot.summary.additional_properties) if snapshot.summary else {}


def _when(snapshot: Snapshot) -> datetime:
    return EPOCH_START + timedelta(milliseconds=snapshot.timestamp_ms)


def batch_snapshots(table: Table) -> list[BatchSnapshot]:
    """The batch snapshots of the current lineage, oldest first (compactions, imports and
    other writers' snapshots carry no offsets and are skipped).

    The walk from the current snapshot through its parents stops at the first expired one.
    Older snapshots are expired too (their ranges folded into the table's properties),
    except those a tag or a branch keeps: such a snapshot that was the table's current one
    once and is older than where the walk stopped is of the lineage too, and neither
    walked nor folded, so it is added here."""
    current = table.current_snapshot()
    if current is None:
        return []
    lineage = list(ancestors_of(current, table.metadata))
    oldest = lineage[-1]  # its parent is expired (pyiceberg then drops the parent's id) or none
    if (oldest.sequence_number or 0) > 1:
        walked = {s.snapshot_id for s in lineage}
        once_current = {e.snapshot_id for e in table.metadata.snapshot_log}
        lineage += sorted((s for s in table.metadata.snapshots
                           if s.snapshot_id in once_current and s.snapshot_id not in walked
                           and (s.sequence_number or 0) < oldest.sequence_number),
                          key=lambda s: (s.sequence_number or 0, s.timestamp_ms), reverse=True)
    out = []
    for snap in lineage:
        props = _summary(snap)
        if RANGES not in props:
            continue
        out.append(BatchSnapshot(
            snap.snapshot_id, _when(snap), props.get(SUPERVISOR, "?"), props.get(BATCH, "?"),
            int(props.get(EPOCH, "0") or 0), tuple(summary_ranges(props)),
            int(props.get(GENERATION, "0") or 0), summary_read(props),
        ))
    out.reverse()
    return out


def _batch_of(path: str) -> str | None:
    marker = "/" + BATCH_DIR_PREFIX
    if marker not in path:
        return None
    return path.split(marker, 1)[1].split("/", 1)[0]


def partition_interval(transform, value) -> tuple[datetime | None, datetime | None]:
    """``[start, end)`` of a ``__time`` partition value under its transform, UTC."""
    if value is None:
        return None, None
    if isinstance(value, date) and not isinstance(value, datetime):  # a day partition read back as a date
        value = (value - EPOCH_START.date()).days
    if isinstance(transform, HourTransform):
        start = EPOCH_START + timedelta(hours=value)
        return start, _plus(start, timedelta(hours=1))
    if isinstance(transform, DayTransform):
        start = EPOCH_START + timedelta(days=value)
        return start, _plus(start, timedelta(days=1))
    if isinstance(transform, MonthTransform):
        y, m = divmod(value, 12)
        start = datetime(1970 + y, m + 1, 1, tzinfo=UTC)
        y2, m2 = divmod(value + 1, 12)
        return start, datetime(1970 + y2, m2 + 1, 1, tzinfo=UTC) if 1970 + y2 <= 9999 else LAST_INSTANT
    if isinstance(transform, YearTransform):
        end = datetime(1971 + value, 1, 1, tzinfo=UTC) if 1971 + value <= 9999 else LAST_INSTANT
        return datetime(1970 + value, 1, 1, tzinfo=UTC), end
    if isinstance(transform, IdentityTransform) and isinstance(value, int):
        start = EPOCH_START + timedelta(microseconds=value)
        return start, start
    return None, None


def _plus(start: datetime, width: timedelta) -> datetime:
    """The end of the partition starting at ``start``: 9999's last one ends at ``LAST_INSTANT``."""
    try:
        return start + width
    except OverflowError:
        return LAST_INSTANT


def data_files(table: Table) -> list[TableFile]:
    """The data files the current snapshot references, in time order."""
    current = table.current_snapshot()
    if current is None:
        return []
    snapshots = {s.snapshot_id: s for s in table.metadata.snapshots}
    specs = table.specs()
    bounds = _BoundsReader(table.schema())
    out = []
    for manifest in current.manifests(table.io):
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            df = entry.data_file
            spec = specs.get(df.spec_id)
            start = end = None
            if spec is not None and spec.fields:
                start, end = partition_interval(spec.fields[0].transform, df.partition[0] if len(df.partition) else None)
            path = df.file_path.removeprefix("file://")
            segment = path.split("time_chunk=", 1)[1].split("/", 1)[0] if "time_chunk=" in path else (
                start.strftime("%Y%m%dT%H%MZ") if start else "")
            snap = snapshots.get(entry.snapshot_id) if entry.snapshot_id is not None else None
            props = _summary(snap) if snap is not None else {}
            ranges = tuple((str(p), int(s), int(e)) for p, s, e in json.loads(props[RANGES])) if RANGES in props else ()
            own, whole = bounds.own_ranges(df, ranges), None
            if not ranges and (stats := bounds.of_file(df)) is not None:
                p_lo, p_hi, o_lo, o_hi = stats
                if p_lo == p_hi:  # one partition: exact
                    own = ((str(p_lo), o_lo, o_hi + 1),)
                else:
                    whole = (str(p_lo), str(p_hi), o_lo, o_hi)
            out.append(TableFile(path, df.record_count, df.file_size_in_bytes, segment, start, end,
                                 entry.snapshot_id, props.get(BATCH) or _batch_of(path), props.get(SUPERVISOR),
                                 ranges if own is None else own, _when(snap) if snap is not None else None,
                                 ranges, own is not None, whole))
    out.sort(key=lambda f: (f.interval_start or EPOCH_START, f.path))
    return out


class _BoundsReader:
    """A batch commits one set of offset ranges for all its files; each file holds part of it.
    With ``__partition`` and ``__offset`` among the columns, a file's own lower and upper
    bounds (Iceberg's column statistics) say which partitions, and which offsets of them, it
    holds: exact for a file of one partition, the batch's ranges within the file's bounds for
    a file of several. A file no batch committed (a compaction merged it) has only its own
    bounds: exact for one partition, per file (not per partition) for several."""

    def __init__(self, schema) -> None:
        self._partition = self._field(schema, "__partition")
        self._offset = self._field(schema, "__offset")

    @staticmethod
    def _field(schema, name):
        try:
            return schema.find_field(name)
        except ValueError:
            return None

    def of_file(self, df) -> tuple[str | int, str | int, int, int] | None:
        """(lowest partition, highest partition, lowest offset, highest offset) of the file."""
        if self._partition is None or self._offset is None:
            return None
        from pyiceberg.conversions import from_bytes

        lower, upper = df.lower_bounds or {}, df.upper_bounds or {}
        try:
            p_lo, p_hi = (from_bytes(self._partition.field_type, b[self._partition.field_id]) for b in (lower, upper))
            o_lo, o_hi = (from_bytes(self._offset.field_type, b[self._offset.field_id]) for b in (lower, upper))
        except (KeyError, TypeError, ValueError):
            return None  # no statistics kept for the columns (a truncated bound, another writer)
        if p_lo is None or o_lo is None:
            return None
        return p_lo, p_hi, int(o_lo), int(o_hi)

    def own_ranges(self, df, ranges) -> tuple[tuple[str, int, int], ...] | None:
        whole = self.of_file(df) if ranges else None
        if whole is None:
            return None
        p_lo, p_hi, o_lo, o_hi = whole
        # bounds compare as the column's type does: a string column's ("10" < "9") like its statistics
        key = str if isinstance(p_lo, str) else int
        return tuple((p, max(s, o_lo), min(e, o_hi + 1)) for p, s, e in ranges
                     if key(p_lo) <= key(p) <= key(p_hi) and max(s, o_lo) < min(e, o_hi + 1))
