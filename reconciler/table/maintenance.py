"""Table maintenance: compaction, snapshot expiry, orphan files, the one-off import.

* ``compact``: rewrite the small files of CLOSED time partitions (a partition is closed
  once its end is ``lateness`` in the past) into large ones, in ONE table commit (one
  ``overwrite`` snapshot that deletes the old files and adds the new ones: readers see
  the old files or the new ones, never both, never neither). With rollup it also
  aggregates across batches: one row per (``__time``, dimensions), counts and sums added,
  mins and maxes taken. The commit is pyiceberg's own compare-and-swap on the metadata
  pointer, the same one the publish uses, so a batch published meanwhile makes it fail
  cleanly: it is planned again on the new metadata (partitions whose files did not change
  reuse the files already written) and retried. It never touches offsets: its snapshot
  carries ``reconciler.operation=compact`` and no ``reconciler.ranges``.
* ``expire_snapshots``: drop snapshots older than a cut-off beyond the last N, and delete
  the files only they referenced. The offset ranges the expired snapshots carried are
  folded (adjacent ranges merged, overlaps and gaps kept) into the table property
  ``reconciler.expired-ranges``, so exactly once can still be proven from the table
  (``expired_ranges``).
* ``remove_orphans``: delete files under the table's location that no metadata file,
  snapshot, manifest list or manifest references, older than a cut-off, never inside the
  directory of a batch the database says is committed.
* ``import_segments``: the upgrade from the old layout (committed Parquet files under
  ``<segments>/<D>/time_chunk=<chunk>/<batch>-<n>.parquet``, dead letters under
  ``<segments>/_deadletter/<D>/``): the files are added in place, in one commit per table
  marked ``reconciler.imported-segments=true`` (so a second run does nothing), with one
  snapshot per supervisor carrying the offset ranges of its imported batches.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import sqlalchemy as sa
from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, bin_pack_arrow_table, pyarrow_to_schema, write_file
from pyiceberg.manifest import DataFile, ManifestEntryStatus, ManifestFile
from pyiceberg.partitioning import PartitionKey
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import Table, TableProperties, WriteTask
from pyiceberg.table.update.snapshot import ExpireSnapshots

from reconciler.table.catalog import (
    BATCH,
    BATCH_DIR_PREFIX,
    DATASOURCE,
    EPOCH,
    NAMESPACE,
    RANGES,
    RECORDS,
    SUPERVISOR,
    TIME,
    Tables,
    deadletter_table,
    local_path,
    summary_ranges,
)
from reconciler.table.files import partition_interval

log = logging.getLogger(__name__)

OPERATION = "reconciler.operation"  # snapshot summary: compact | import (a batch has none)
EXPIRED_RANGES = "reconciler.expired-ranges"  # table property: {supervisor: [[p, s, e], ...]}
IMPORTED = "reconciler.imported-segments"  # table property: "true" once the old layout is imported
COMPACTED_DIR = "compacted"  # <table>/data/compacted/<partition>/<file>: compaction output

DEFAULT_LATENESS = timedelta(hours=1)
DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024  # bytes of Arrow data per output file (Parquet is smaller)
DEFAULT_SNAPSHOT_AGE = timedelta(days=7)
DEFAULT_RETAIN_LAST = 100
DEFAULT_ORPHAN_AGE = timedelta(days=1)
COMMIT_ATTEMPTS = 10

_SUMS = {"count", "longSum", "doubleSum"}
_MINS = {"longMin", "doubleMin"}
_MAXES = {"longMax", "doubleMax"}


class MaintenanceError(Exception):
    """A maintenance step that could not be done (and changed nothing)."""


# =========================================================================== compaction


@dataclass(frozen=True)
class Rollup:
    """How rows combine across batches: group by (``__time``, dimensions), combine metrics."""

    dimensions: tuple[str, ...]
    metrics: tuple[tuple[str, str], ...]  # (name, type): count longSum doubleSum longMin ...

    @classmethod
    def of(cls, data_schema: Any) -> Rollup | None:
        """The rollup of a ``DataSchema``-like object (``rollup``, ``dimensions``, ``metrics``
        with ``name``/``type``), or None when it does not roll up."""
        if data_schema is None or not getattr(data_schema, "rollup", False):
            return None
        return cls(tuple(data_schema.dimensions), tuple((m.name, m.type) for m in data_schema.metrics))


@dataclass
class CompactedPartition:
    partition: str  # e.g. "2026-11-20T10:00:00Z/2026-11-20T11:00:00Z"
    start: datetime | None
    end: datetime | None
    files_before: int
    rows_before: int
    bytes_before: int
    files_after: int = 0
    rows_after: int = 0
    bytes_after: int = 0


@dataclass
class CompactResult:
    table: str
    dry_run: bool
    committed: bool = False
    snapshot_id: int | None = None
    attempts: int = 0
    rollup: bool = False
    partitions: list[CompactedPartition] = field(default_factory=list)
    open_partitions: int = 0  # partitions not closed yet (left alone)
    message: str = ""

    @property
    def files_before(self) -> int:
        return sum(p.files_before for p in self.partitions)

    @property
    def files_after(self) -> int:
        return sum(p.files_after for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["filesBefore"], doc["filesAfter"] = self.files_before, self.files_after
        for p in doc["partitions"]:
            for k in ("start", "end"):
                p[k] = _iso(p[k]) if p[k] else None
        return _camel(doc)


@dataclass
class _Group:
    key: tuple
    start: datetime | None
    end: datetime | None
    tasks: list  # FileScanTask

    @property
    def files(self) -> list[DataFile]:
        return [t.file for t in self.tasks]

    @property
    def label(self) -> str:
        if self.start is None:
            return "unpartitioned"
        return f"{_iso(self.start)}/{_iso(self.end)}"


def compact(
    tables: Tables,
    datasource: str,
    *,
    rollup: Rollup | Any | None = None,
    lateness: timedelta = DEFAULT_LATENESS,
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
    now: datetime | None = None,
    dry_run: bool = False,
    attempts: int = COMMIT_ATTEMPTS,
    cancel: threading.Event | None = None,
) -> CompactResult:
    """Rewrite the small files of the closed time partitions of table ``datasource``.

    A partition is closed when its end lies ``lateness`` before ``now``. Without rollup a
    closed partition is rewritten when it has two or more small files (under half of
    ``target_file_size`` in Parquet bytes), only those files; with rollup (``rollup`` is
    a ``Rollup`` or a ``DataSchema`` with ``rollup: true``) when it has two or more files,
    all of them, aggregated. All partitions go in one commit; a commit that lost against
    another writer is planned again and retried up to ``attempts`` times.
    """
    if rollup is not None and not isinstance(rollup, Rollup):
        rollup = Rollup.of(rollup)
    now = now or datetime.now(UTC)
    result = CompactResult(table=datasource, dry_run=dry_run, rollup=rollup is not None)
    written: dict[tuple, list[DataFile]] = {}  # (group key, input paths) -> files written for it
    committed_paths: set[str] = set()
    unknown = False
    try:
        for attempt in range(1, attempts + 1):
            result.attempts = attempt
            table = tables.load(datasource)
            if table is None:
                result.message = f"no table {datasource}"
                return result
            groups, open_count = _plan(table, rollup, lateness, target_file_size, now)
            result.open_partitions = open_count
            result.partitions = [CompactedPartition(g.label, g.start, g.end, len(g.tasks),
                                                    sum(f.record_count for f in g.files),
                                                    sum(f.file_size_in_bytes for f in g.files)) for g in groups]
            if not groups:
                result.message = "nothing to compact"
                return result
            if dry_run:
                result.message = f"would compact {len(groups)} partition(s)"
                return result
            new_files: list[DataFile] = []
            for group, part in zip(groups, result.partitions, strict=True):
                if cancel is not None and cancel.is_set():
                    result.message = "cancelled"
                    return result
                key = (group.key, frozenset(f.file_path for f in group.files))
                if key not in written:
                    written[key] = _rewrite(table, group, rollup, target_file_size)
                out = written[key]
                part.files_after = len(out)
                part.rows_after = sum(f.record_count for f in out)
                part.bytes_after = sum(f.file_size_in_bytes for f in out)
                new_files += out
            summary = {OPERATION: "compact", DATASOURCE: datasource, "reconciler.partitions": str(len(groups)),
                       "reconciler.rollup": str(rollup is not None).lower()}
            try:
                tx = table.transaction()
                with tx.update_snapshot(snapshot_properties=summary).overwrite() as ow:
                    for group in groups:
                        for f in group.files:
                            ow.delete_data_file(f)
                    for f in new_files:
                        ow.append_data_file(f)
                committed_table = tx.commit_transaction()
            except (CommitFailedException, ValidationException) as exc:
                log.info("compaction of %s: the table moved (%s); planning again", datasource, exc)
                time.sleep(min(0.05 * attempt, 0.5))
                continue
            except sa.exc.OperationalError as exc:  # the outcome is unknown: leave files for remove_orphans
                unknown = True
                log.warning("compaction of %s: commit outcome unknown (%s); planning again", datasource, exc)
                time.sleep(min(0.05 * attempt, 0.5))
                continue
            committed_paths = {f.file_path for f in new_files}
            snap = committed_table.current_snapshot()
            result.committed = True
            result.snapshot_id = snap.snapshot_id if snap else None
            result.message = (f"compacted {len(groups)} partition(s): {result.files_before} file(s) -> "
                              f"{result.files_after}")
            log.info("compaction of %s: %s", datasource, result.message)
            return result
        result.message = f"gave up after {attempts} attempts: the table kept moving"
        return result
    finally:
        if not unknown:  # files of attempts that never committed are referenced by nothing
            for files in written.values():
                for f in files:
                    if f.file_path not in committed_paths:
                        _unlink(local_path(f.file_path))


def _plan(table: Table, rollup: Rollup | None, lateness: timedelta, target: int,
          now: datetime) -> tuple[list[_Group], int]:
    metadata = table.metadata
    time_id = _time_field_id(metadata.schema())
    by_key: dict[tuple, _Group] = {}
    for task in table.scan().plan_files():
        f = task.file
        spec = metadata.specs()[f.spec_id]
        start, end = _partition_interval(spec, f.partition, time_id)
        key = (f.spec_id, tuple(f.partition))
        by_key.setdefault(key, _Group(key, start, end, [])).tasks.append(task)
    groups, open_count = [], 0
    small = target // 2
    for g in sorted(by_key.values(), key=lambda g: (g.start or datetime.min.replace(tzinfo=UTC), g.key)):
        if g.end is None:
            continue  # not partitioned on __time: no partition is ever closed
        if g.key[0] != metadata.default_spec_id or len(metadata.spec().fields) != 1:
            continue  # written under an older partitioning (another segment granularity): left alone
        if g.end + lateness > now:
            open_count += 1
            continue
        if rollup is None:
            g.tasks = [t for t in g.tasks if t.file.file_size_in_bytes < small]
        if len(g.tasks) >= 2:
            groups.append(g)
    return groups, open_count


def _rewrite(table: Table, group: _Group, rollup: Rollup | None, target: int) -> list[DataFile]:
    """Read a partition's files, (roll up,) and write them again as ``target``-sized files
    of the same partition under ``<table>/data/compacted/``."""
    metadata = table.metadata
    schema = metadata.schema()
    rows = ArrowScan(metadata, table.io, schema, AlwaysTrue()).to_table(group.tasks)
    if rollup is not None:
        rows = rollup_rows(rows, rollup)
    if TIME in rows.column_names:
        rows = rows.sort_by(TIME)
    props = dict(metadata.properties)
    props[TableProperties.WRITE_DATA_PATH] = f"{table.location().rstrip('/')}/data/{COMPACTED_DIR}"
    write_meta = metadata.model_copy(update={"properties": props})
    spec = metadata.spec()
    key = PartitionKey([], spec, schema)
    key.__dict__["partition"] = group.tasks[0].file.partition  # the files' own partition (same spec)
    task_schema = pyarrow_to_schema(rows.schema, name_mapping=schema.name_mapping,
                                    format_version=metadata.format_version)
    write_uuid, counter = uuid.uuid4(), itertools.count()
    tasks = (WriteTask(write_uuid=write_uuid, task_id=next(counter), schema=task_schema, record_batches=batches,
                       partition_key=key)
             for batches in bin_pack_arrow_table(rows, target))
    return list(write_file(table.io, write_meta, tasks))


def rollup_rows(rows: pa.Table, rollup: Rollup) -> pa.Table:
    """One row per (``__time``, dimensions): count and sums add up, mins and maxes combine.

    Columns that are neither a metric nor ``__time`` are grouping keys too (a dimension
    the spec no longer names still separates rows: never merge what may differ)."""
    metrics = {name: kind for name, kind in rollup.metrics if name in rows.column_names}
    keys = [c for c in rows.column_names if c not in metrics]
    aggs = []
    for name, kind in metrics.items():
        fn = "sum" if kind in _SUMS else "min" if kind in _MINS else "max" if kind in _MAXES else None
        if fn is None:
            raise MaintenanceError(f"metric {name}: type {kind!r} cannot be rolled up")
        aggs.append((name, fn))
    grouped = rows.group_by(keys, use_threads=False).aggregate(aggs)
    columns = []
    for f in rows.schema:
        col = grouped.column(f"{f.name}_{dict(aggs)[f.name]}" if f.name in metrics else f.name)
        columns.append(col.cast(f.type) if col.type != f.type else col)
    return pa.Table.from_arrays(columns, schema=rows.schema)


def _time_field_id(schema) -> int | None:
    try:
        return schema.find_field(TIME).field_id
    except ValueError:
        return None




def _partition_interval(spec, partition, time_id: int | None) -> tuple[datetime | None, datetime | None]:
    """``[start, end)`` of a file's ``__time`` partition, or (None, None) without one."""
    for pos, pf in enumerate(spec.fields):
        if pf.source_id != time_id:
            continue
        return partition_interval(pf.transform, partition[pos])
    return None, None


# =========================================================================== expiry


@dataclass
class ExpireResult:
    table: str
    dry_run: bool
    expired_snapshots: int = 0
    retained_snapshots: int = 0
    deleted_files: list[str] = field(default_factory=list)
    committed: bool = False
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return _camel(asdict(self) | {"deletedFileCount": len(self.deleted_files)})


def expire_snapshots(
    tables: Tables,
    name: str,
    *,
    older_than: timedelta = DEFAULT_SNAPSHOT_AGE,
    retain_last: int = DEFAULT_RETAIN_LAST,
    now: datetime | None = None,
    dry_run: bool = False,
    attempts: int = COMMIT_ATTEMPTS,
) -> ExpireResult:
    """Remove the snapshots of table ``name`` that are older than ``older_than`` AND not
    among the last ``retain_last``, then delete the files only they referenced.

    Never expired: the current snapshot, branch and tag heads, and every snapshot that
    was the current one at some time after the cut-off (a reader may still hold it). A file still live in any retained snapshot is never deleted. The offset
    ranges of expired snapshots are kept, merged, in the table property
    ``reconciler.expired-ranges`` (committed with the expiry)."""
    if retain_last < 1:
        raise ValueError("retain_last must be at least 1")
    now = now or datetime.now(UTC)
    cutoff_ms = int((now - older_than).timestamp() * 1000)
    result = ExpireResult(table=name, dry_run=dry_run)
    for attempt in range(1, attempts + 1):
        table = tables.load(name)
        if table is None:
            result.message = f"no table {name}"
            return result
        metadata = table.metadata
        protected = {ref.snapshot_id for ref in metadata.refs.values()}
        if metadata.current_snapshot_id is not None:
            protected.add(metadata.current_snapshot_id)
        protected |= _recently_current(metadata, cutoff_ms)
        newest = sorted(metadata.snapshots, key=lambda s: (s.timestamp_ms, s.sequence_number or 0), reverse=True)
        protected |= {s.snapshot_id for s in newest[:retain_last]}
        expired = [s for s in metadata.snapshots if s.snapshot_id not in protected and s.timestamp_ms < cutoff_ms]
        retained = [s for s in metadata.snapshots if s.snapshot_id not in {e.snapshot_id for e in expired}]
        result.expired_snapshots, result.retained_snapshots = len(expired), len(retained)
        if not expired:
            result.message = "no snapshot to expire"
            return result
        reader = _ManifestReader(table.io)
        keep = reader.reachable(retained, live_only=True)
        gone = reader.reachable(expired, live_only=True) - keep
        # Manifest lists and manifests of expired snapshots, when no retained one shares them.
        result.deleted_files = sorted(gone)
        if dry_run:
            result.message = f"would expire {len(expired)} snapshot(s) and delete {len(gone)} file(s)"
            return result
        folded = fold_ranges(expired_ranges(table), _snapshot_ranges(expired))
        try:
            tx = table.transaction()
            ExpireSnapshots(tx).by_ids([s.snapshot_id for s in expired]).commit()
            tx.set_properties({EXPIRED_RANGES: json.dumps(folded, separators=(",", ":"), sort_keys=True)})
            tx.commit_transaction()
        except (CommitFailedException, ValidationException) as exc:
            log.info("expiry of %s: the table moved (%s); again", name, exc)
            time.sleep(min(0.05 * attempt, 0.5))
            continue
        result.committed = True
        for path in gone:
            _unlink(local_path(path))
        result.message = f"expired {len(expired)} snapshot(s), deleted {len(gone)} file(s)"
        log.info("maintenance of %s: %s", name, result.message)
        return result
    result.message = f"gave up after {attempts} attempts: the table kept moving"
    return result


def expired_ranges(table: Table) -> dict[str, list[tuple[str, int, int]]]:
    """The offset ranges of expired snapshots, per supervisor (``verify`` adds them to the
    ranges of the snapshots still in the table)."""
    raw = table.properties.get(EXPIRED_RANGES)
    if not raw:
        return {}
    return {sid: [(str(p), int(s), int(e)) for p, s, e in ranges] for sid, ranges in json.loads(raw).items()}


def fold_ranges(*sources: Mapping[str, Iterable[tuple[str, int, int]]]) -> dict[str, list[list]]:
    """Ranges per supervisor with adjacent ones merged (``[a, b)`` + ``[b, c)`` = ``[a, c)``);
    overlapping and non-adjacent ranges stay apart, so overlaps and gaps remain visible."""
    merged: dict[str, dict[str, list[list[int]]]] = defaultdict(lambda: defaultdict(list))
    for src in sources:
        for sid, ranges in src.items():
            for p, s, e in ranges:
                merged[sid][str(p)].append([int(s), int(e)])
    out: dict[str, list[list]] = {}
    for sid, parts in sorted(merged.items()):
        rows = []
        for p, spans in sorted(parts.items()):
            spans.sort()
            cur = spans[0][:]
            for s, e in spans[1:]:
                if s == cur[1]:
                    cur[1] = e
                else:
                    rows.append([p, *cur])
                    cur = [s, e]
            rows.append([p, *cur])
        out[sid] = rows
    return out


def _snapshot_ranges(snapshots) -> dict[str, list[tuple[str, int, int]]]:
    out: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for s in snapshots:
        props = s.summary.additional_properties if s.summary else {}
        ranges = summary_ranges(props)
        if ranges and props.get(SUPERVISOR):
            out[props[SUPERVISOR]] += ranges
    return out


def _recently_current(metadata, cutoff_ms: int) -> set[int]:
    """Snapshots that were the table's current one at some time after the cut-off (a
    reader that loaded the table then may still be reading them)."""
    log_entries = sorted(metadata.snapshot_log, key=lambda e: e.timestamp_ms)
    out = set()
    for i, entry in enumerate(log_entries):
        until = log_entries[i + 1].timestamp_ms if i + 1 < len(log_entries) else None
        if until is None or until >= cutoff_ms:
            out.add(entry.snapshot_id)
    return out


class _ManifestReader:
    """Files reachable from snapshots, each manifest list and manifest read once. A missing
    manifest list or manifest is an error, unless ``missing_ok`` (snapshots of an older
    metadata version, whose expired files are already gone)."""

    def __init__(self, io):
        self.io = io
        self._lists: dict[str, list[ManifestFile]] = {}
        self._entries: dict[tuple[str, bool], set[str]] = {}

    def manifests(self, snapshot, missing_ok: bool = False) -> list[ManifestFile]:
        if snapshot.manifest_list not in self._lists:
            try:
                self._lists[snapshot.manifest_list] = snapshot.manifests(self.io)
            except FileNotFoundError:
                if not missing_ok:
                    raise
                return []
        return self._lists[snapshot.manifest_list]

    def data_files(self, manifest: ManifestFile, live_only: bool, missing_ok: bool = False) -> set[str]:
        key = (manifest.manifest_path, live_only)
        if key not in self._entries:
            try:
                entries = manifest.fetch_manifest_entry(self.io, discard_deleted=False)
            except FileNotFoundError:
                if not missing_ok:
                    raise
                return set()
            self._entries[key] = {e.data_file.file_path for e in entries
                                  if not live_only or e.status != ManifestEntryStatus.DELETED}
        return self._entries[key]

    def reachable(self, snapshots, *, live_only: bool, missing_ok: bool = False) -> set[str]:
        out: set[str] = set()
        for s in snapshots:
            out.add(s.manifest_list)
            for m in self.manifests(s, missing_ok):
                out.add(m.manifest_path)
                out |= self.data_files(m, live_only, missing_ok)
        return {_norm(p) for p in out}


# =========================================================================== orphans


@dataclass
class OrphanResult:
    table: str
    dry_run: bool
    scanned_files: int = 0
    deleted_files: list[str] = field(default_factory=list)
    deleted_bytes: int = 0
    kept_young: int = 0  # unreferenced, but too young to be sure (an in-flight publish)
    kept_committed_batch: int = 0  # unreferenced files in the directory of a committed batch
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return _camel(asdict(self) | {"deletedFileCount": len(self.deleted_files)})


def remove_orphans(
    tables: Tables,
    name: str,
    *,
    older_than: timedelta = DEFAULT_ORPHAN_AGE,
    committed_batches: Callable[[Iterable[str]], set[str]] | None = None,
    now: datetime | None = None,
    dry_run: bool = False,
) -> OrphanResult:
    """Delete the files under table ``name``'s location that nothing references.

    Referenced: the current metadata file and every one in its metadata log, and for each
    of them every snapshot's manifest list, manifests and data files (deleted entries
    too). Files are listed BEFORE the metadata is read, so a file committed in between is
    seen as referenced. Kept anyway: files modified within ``older_than`` (a batch being
    written or published), and everything under ``data/batch=<B>/`` when batch ``B`` is
    committed in the database (``committed_batches``: batch ids -> the committed ones,
    e.g. ``Store.committed_batch_ids``; without it every batch directory is kept)."""
    now = now or datetime.now(UTC)
    cutoff = (now - older_than).timestamp()
    result = OrphanResult(table=name, dry_run=dry_run)
    table = tables.load(name)
    if table is None:
        result.message = f"no table {name}"
        return result
    root = local_path(table.location())
    listed = _list_files(root)
    result.scanned_files = len(listed)
    table = tables.load(name)  # after the listing: whatever committed meanwhile is referenced
    if table is None:
        raise MaintenanceError(f"table {name} vanished during the orphan scan; nothing deleted")
    referenced = _referenced(table)
    candidates = {p: st for p, st in listed.items() if _norm(p) not in referenced}
    batches = {b for p in candidates if (b := _batch_of(root, p)) is not None}
    committed = set(batches) if committed_batches is None else set(committed_batches(sorted(batches)))
    for path, (mtime, size) in sorted(candidates.items()):
        if _batch_of(root, path) in committed:
            result.kept_committed_batch += 1
            continue
        if mtime >= cutoff:
            result.kept_young += 1
            continue
        result.deleted_files.append(path)
        result.deleted_bytes += size
    if not dry_run:
        for path in result.deleted_files:
            _unlink(Path(path))
        _remove_empty_dirs(root, cutoff, result.deleted_files)
    verb = "would delete" if dry_run else "deleted"
    result.message = (f"{verb} {len(result.deleted_files)} orphan file(s) ({result.deleted_bytes} bytes); "
                      f"kept {result.kept_young} younger than the cut-off")
    if result.deleted_files and not dry_run:
        log.info("maintenance of %s: %s", name, result.message)
    return result


def _referenced(table: Table) -> set[str]:
    out = {_norm(table.metadata_location)}
    reader = _ManifestReader(table.io)
    versions = [table.metadata]
    for entry in table.metadata.metadata_log:
        out.add(_norm(entry.metadata_file))
        try:
            versions.append(FromInputFile.table_metadata(table.io.new_input(entry.metadata_file)))
        except (OSError, ValueError):
            continue
    seen: set[int] = set()
    for i, md in enumerate(versions):
        snaps = [s for s in md.snapshots if s.snapshot_id not in seen]
        seen |= {s.snapshot_id for s in snaps}
        out |= reader.reachable(snaps, live_only=False, missing_ok=i > 0)
        for stats in [*getattr(md, "statistics", []), *getattr(md, "partition_statistics", [])]:
            out.add(_norm(stats.statistics_path))
    return out


def _list_files(root: Path) -> dict[str, tuple[float, int]]:
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            try:
                st = os.lstat(p)
            except FileNotFoundError:
                continue
            out[os.path.abspath(p)] = (st.st_mtime, st.st_size)
    return out


def _batch_of(root: Path, path: str) -> str | None:
    """The batch id of a file under ``<root>/data/batch=<B>/``, else None."""
    try:
        rel = Path(path).relative_to(root / "data")
    except ValueError:
        return None
    top = rel.parts[0] if rel.parts else ""
    if top.startswith(BATCH_DIR_PREFIX):
        return top[len(BATCH_DIR_PREFIX):]
    if top.startswith(".") and top.endswith(".deleting"):  # a discard a crash interrupted
        return None
    return None


def _remove_empty_dirs(root: Path, cutoff: float, deleted: Iterable[str] = ()) -> None:
    """Remove empty directories older than the cut-off, and empty directories of a batch
    whose old files were just deleted (that touched them; a batch id is never written
    again). Other young ones may be about to receive a file (a batch, a compaction)."""
    emptied_batches = {_batch_of(root, p) for p in deleted} - {None}
    keep = {root, root / "data", root / "metadata"}
    for dirpath, _dirs, _files in os.walk(root, topdown=False):
        d = Path(dirpath)
        if d in keep:
            continue
        try:
            if any(d.iterdir()):
                continue
            if d.stat().st_mtime < cutoff or _batch_of(root, str(d / "x")) in emptied_batches:
                d.rmdir()
        except OSError:
            pass


# =========================================================================== import


@dataclass
class ImportResult:
    datasource: str
    dry_run: bool
    already_imported: bool = False
    files: int = 0
    rows: int = 0
    dead_files: int = 0
    batches: int = 0
    supervisors: list[str] = field(default_factory=list)
    promoted_staged_batches: int = 0
    unknown_batch_files: int = 0  # files whose batch the database does not know (imported anyway)
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        return _camel(asdict(self))


OLD_STAGING, OLD_DEADLETTER, OLD_CHUNK_PREFIX = "_staging", "_deadletter", "time_chunk="


def old_layout_datasources(segments_dir: str | os.PathLike[str]) -> list[str]:
    """Datasources that have files in the old layout under ``segments_dir``."""
    root = Path(segments_dir)
    names = set()
    if root.is_dir():
        for d in root.iterdir():
            if d.is_dir() and not d.name.startswith(("_", ".")) and any(
                    c.is_dir() and c.name.startswith(OLD_CHUNK_PREFIX) for c in d.iterdir()):
                names.add(d.name)
        dead = root / OLD_DEADLETTER
        if dead.is_dir():
            names |= {d.name for d in dead.iterdir() if d.is_dir() and not d.name.startswith(".")}
        staging = root / OLD_STAGING
        if staging.is_dir():
            for d in staging.iterdir():
                doc = _read_json(d / "_manifest.json")
                if doc and doc.get("datasource"):
                    names.add(doc["datasource"])
    return sorted(names)


def import_segments(
    tables: Tables,
    store: Any,
    segments_dir: str | os.PathLike[str],
    datasource: str,
    *,
    granularity: str | None = None,
    dry_run: bool = False,
    attempts: int = COMMIT_ATTEMPTS,
) -> ImportResult:
    """Add the committed segment files of the old layout to table ``datasource`` (and its
    dead letters to ``<datasource>_deadletter``), in place, once.

    ``store`` is the metadata store (``engine`` and ``committed_batch_ids`` are used):
    staged batches the database says are committed are moved to their final paths first
    (what the old start-up recovery did), and the offset ranges of the imported batches
    go into the import snapshots' summaries, one snapshot per supervisor, so ``verify``
    sees them. ``granularity`` is the segment granularity of a table created here
    (default hour). A table already marked ``reconciler.imported-segments`` is left alone."""
    root = Path(segments_dir).absolute()
    result = ImportResult(datasource=datasource, dry_run=dry_run)
    if not dry_run:
        result.promoted_staged_batches = _promote_staged(root, datasource, store)
    data_files = _old_files(root / datasource, chunked=True)
    dead_files = _old_files(root / OLD_DEADLETTER / datasource, chunked=False)
    done = None
    for attempt in range(1, attempts + 1):
        try:
            if done is None:
                done = _import_table(tables, store, datasource, data_files, granularity, result, dry_run)
            _import_dead(tables, datasource, dead_files, result, dry_run)
        except (CommitFailedException, ValidationException) as exc:
            log.info("import of %s: the table moved (%s); again", datasource, exc)
            time.sleep(min(0.05 * attempt, 0.5))
            continue
        if done == "already":
            result.already_imported = True
            result.message = "already imported"
        elif dry_run:
            result.message = (f"would import {result.files} file(s) ({result.rows} rows) and "
                              f"{result.dead_files} dead-letter file(s)")
        else:
            result.message = (f"imported {result.files} file(s) ({result.rows} rows), {result.dead_files} "
                              f"dead-letter file(s), ranges of {result.batches} batch(es)")
            log.info("import of %s: %s", datasource, result.message)
        return result
    raise MaintenanceError(f"import of {datasource}: gave up after {attempts} attempts: the table kept moving")


def _import_table(tables: Tables, store, datasource: str, files: list[Path], granularity: str | None,
                  result: ImportResult, dry_run: bool) -> str:
    table = tables.load(datasource)
    if table is not None and table.properties.get(IMPORTED) == "true":
        return "already"
    in_table = _batch_ids_in(table) if table is not None else set()
    batches = [b for b in _datasource_batches(store.engine, datasource) if b["batch_id"] not in in_table]
    known = {b["batch_id"]: b for b in batches}
    by_sup: dict[str, list[str]] = defaultdict(list)
    unknown: list[str] = []
    for f in files:
        b = known.get(_old_batch_id(f))
        (by_sup[b["supervisor_id"]] if b else unknown).append(str(f))
    result.files = len(files)
    result.rows = sum(pq.read_metadata(f).num_rows for f in files)
    result.batches = len(batches)
    result.unknown_batch_files = len(unknown)
    sups = sorted({b["supervisor_id"] for b in batches})
    result.supervisors = sups
    if dry_run or (table is None and not files and not batches):
        return "dry"
    if table is None:
        schema = _unified_schema(files) if files else pa.schema([pa.field(TIME, pa.timestamp("us", tz="UTC"))])
        table = tables.ensure(datasource, schema, granularity or "hour")
    with table.transaction() as tx:
        if files:
            schema = _unified_schema(files)
            have = {f.name for f in tx.table_metadata.schema().fields}
            if any(n not in have for n in schema.names):
                with tx.update_schema() as update:
                    update.union_by_name(schema)
                tx.set_properties(**{TableProperties.DEFAULT_NAME_MAPPING:
                                     tx.table_metadata.schema().name_mapping.model_dump_json()})
        for sid in sups:
            mine = [b for b in batches if b["supervisor_id"] == sid]
            ranges = fold_ranges({sid: [r for b in mine for r in b["ranges"]]}).get(sid, [])
            summary = {OPERATION: "import", DATASOURCE: datasource, SUPERVISOR: sid,
                       BATCH: f"import:{len(mine)}", EPOCH: str(max(b["epoch"] for b in mine)),
                       RANGES: json.dumps(ranges), RECORDS: str(sum(b["records"] for b in mine))}
            tx.add_files(by_sup.get(sid, []), snapshot_properties=summary)
        if unknown:  # files the database has no batch for: they were visible, so they are kept
            tx.add_files(unknown, snapshot_properties={OPERATION: "import", DATASOURCE: datasource})
        tx.set_properties({IMPORTED: "true"})
    return "done"


def _import_dead(tables: Tables, datasource: str, files: list[Path], result: ImportResult, dry_run: bool) -> None:
    name = deadletter_table(datasource)
    table = tables.load(name)
    if table is not None and table.properties.get(IMPORTED) == "true":
        return
    result.dead_files = len(files)
    if dry_run or not files:
        return
    if table is None:
        table = tables.ensure(name, _unified_schema(files), None)
    with table.transaction() as tx:
        tx.add_files([str(f) for f in files], snapshot_properties={OPERATION: "import", DATASOURCE: datasource})
        tx.set_properties({IMPORTED: "true"})


def _old_files(directory: Path, *, chunked: bool) -> list[Path]:
    if not directory.is_dir():
        return []
    dirs = sorted(d for d in directory.iterdir() if d.is_dir() and d.name.startswith(OLD_CHUNK_PREFIX)) \
        if chunked else [directory]
    out = []
    for d in dirs:
        for p in sorted(d.iterdir()):
            if p.is_file() and p.suffix == ".parquet" and not p.name.startswith((".", "_")):
                if pq.read_metadata(p).num_rows > 0:
                    out.append(p)
    return out


def _old_batch_id(path: Path) -> str:
    return path.stem.rsplit("-", 1)[0]  # <batch>-<n>.parquet


def _unified_schema(files: Sequence[Path]) -> pa.Schema:
    schemas = {str(pq.read_schema(f).remove_metadata()): pq.read_schema(f).remove_metadata() for f in files}
    return pa.unify_schemas(list(schemas.values()))


def _batch_ids_in(table: Table) -> set[str]:
    return {s.summary.additional_properties.get(BATCH) for s in table.metadata.snapshots
            if s.summary and s.summary.additional_properties.get(BATCH)}


_batches = sa.table("batches", sa.column("batch_id"), sa.column("supervisor_id"), sa.column("datasource"),
                    sa.column("epoch"), sa.column("status"), sa.column("ranges"), sa.column("records"))


def _datasource_batches(engine: sa.Engine, datasource: str) -> list[dict[str, Any]]:
    """Committed batches of a datasource (``batches`` table), ranges decoded."""
    with engine.connect().execution_options(readonly=True) as c, c.begin():
        rows = c.execute(sa.select(_batches).where(_batches.c.datasource == datasource,
                                                   _batches.c.status.in_(("committed", "promoted")))).mappings().all()
    out = []
    for r in rows:
        ranges = []
        for x in json.loads(r["ranges"] or "[]"):
            p, s, e = (x["partition"], x["start"], x["end"]) if isinstance(x, dict) else x
            ranges.append((str(p), int(s), int(e)))
        out.append({**dict(r), "ranges": ranges, "epoch": int(r["epoch"]), "records": int(r["records"] or 0)})
    return out


def _promote_staged(root: Path, datasource: str, store) -> int:
    """Finish the promote of old-layout staged batches the database says are committed
    (a crash between publish and promote before the upgrade)."""
    staging = root / OLD_STAGING
    if not staging.is_dir():
        return 0
    docs = {}
    for d in sorted(staging.iterdir()):
        doc = _read_json(d / "_manifest.json")
        if doc and doc.get("datasource") == datasource and doc.get("batch_id") == d.name:
            docs[d.name] = (d, doc)
    committed = store.committed_batch_ids(docs) if docs else set()
    for batch_id in sorted(committed):
        d, doc = docs[batch_id]
        for f in [*doc.get("files", ()), *doc.get("dead_files", ())]:
            src, dst = Path(f["staging_path"]), Path(f["final_path"])
            if src.exists():
                dst.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dst)
            elif not dst.exists():
                raise MaintenanceError(f"batch {batch_id}: {src} is gone and {dst} does not exist")
        shutil.rmtree(d, ignore_errors=True)
    return len(committed)


# =========================================================================== helpers


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _norm(location: str) -> str:
    try:
        return os.path.abspath(local_path(location))
    except ValueError:
        return location


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


def _iso(dt: datetime) -> str:
    return dt.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _camel(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {_camel_key(k): _camel(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_camel(v) for v in doc]
    return doc


def _camel_key(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(w.capitalize() for w in rest)


def table_names(tables: Tables, datasource: str | None = None) -> list[str]:
    """The tables a maintenance run covers: a datasource's table and its dead letters, or all."""
    if datasource is None:
        return tables.names()
    return [n for n in (datasource, deadletter_table(datasource)) if tables.load(n) is not None]


__all__ = [
    "COMPACTED_DIR", "EXPIRED_RANGES", "IMPORTED", "NAMESPACE", "OPERATION", "CompactResult", "ExpireResult",
    "ImportResult", "MaintenanceError", "OrphanResult", "Rollup", "compact", "expire_snapshots", "expired_ranges",
    "fold_ranges", "import_segments", "old_layout_datasources", "remove_orphans", "rollup_rows", "table_names",
]
