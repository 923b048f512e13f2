"""Compaction: rewrite the small files of CLOSED time partitions (a partition is closed
once its end is ``lateness`` in the past) into large ones, in ONE table commit (one
``overwrite`` snapshot that deletes the old files and adds the new ones: readers see the
old files or the new ones, never both, never neither). With rollup it also aggregates
across batches: one row per (``__time``, dimensions), counts and sums added, mins and
maxes taken. A batch published meanwhile makes the commit fail cleanly: while every file
the plan read is still live (``ancestry``: ``main`` only appended since, or the manifests
say so), the same merge is staged again on the new table (a partition a backfill keeps
filling no longer moves the plan at each attempt); else it is planned again on the new
metadata (partitions whose files did not change reuse the files already written) and
retried; so is one that finds the table's partitioning changed since its plan
(the merged files belong to the plan's partition spec: staged under another, pyiceberg
would file them under the new spec with the old partition value, out of reach of every
time-filtered scan). A partition whose candidates were all written by one earlier
compaction has nothing new to merge and is left alone (rewriting it would write the same
files again, run after run). It never touches offsets: its snapshot carries
``reconciler.operation=compact`` and no ``reconciler.ranges``.
"""

from __future__ import annotations

import itertools
import logging
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
from pyiceberg.exceptions import ValidationException
from pyiceberg.expressions import AlwaysTrue
from pyiceberg.io.pyarrow import ArrowScan, bin_pack_arrow_table, pyarrow_to_schema, write_file
from pyiceberg.manifest import DataFile
from pyiceberg.partitioning import PartitionKey
from pyiceberg.table import Table, TableProperties, WriteTask

from reconciler import faults
from reconciler.errors import CommitOutcomeUnknown, ReconcilerError
from reconciler.pipeline.rollup import aggregate
from reconciler.store.batches import TableConflict
from reconciler.store.writes import WriteFenced
from reconciler.table import durable
from reconciler.table.ancestry import unchanged_for
from reconciler.table.catalog import (
    DATASOURCE,
    ROLLUP_PROPERTY,
    TIME,
    Tables,
    local_path,
    tagged,
)
from reconciler.table.files import partition_interval
from reconciler.table.reach import _unlink
from reconciler.table.reports import MaintenanceError, _camel, _iso
from reconciler.table.writeids import COMPACTED_DIR, new_write_id, tag

log = logging.getLogger(__name__)

OPERATION = "reconciler.operation"  # snapshot summary: compact | import (a batch has none)
DEFAULT_LATENESS = timedelta(hours=1)
DEFAULT_TARGET_FILE_SIZE = 128 * 1024 * 1024  # Parquet bytes per output file (the selection's measure too)
COMMIT_ATTEMPTS = 10
ROLLING = "reconciler.rolling"  # snapshot summary: "true" on a rolling compaction of open partitions

_SUMS = {"count", "longSum", "doubleSum"}
_MINS = {"longMin", "doubleMin"}
_MAXES = {"longMax", "doubleMax"}


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

    @classmethod
    def of_all(cls, data_schemas: Iterable[Any]) -> Rollup | None:
        """The rollup of a datasource written by several specs: every spec's metrics (a
        metric column only one spec names, read as a grouping key, would keep its rows
        apart forever), the first spec's type for a name two specs give; None when none
        rolls up."""
        rollups = [r for r in map(cls.of, data_schemas) if r is not None]
        if not rollups:
            return None
        metrics: dict[str, str] = {}
        for r in rollups:
            for name, kind in r.metrics:
                metrics.setdefault(name, kind)
        dims = dict.fromkeys(d for r in rollups for d in r.dimensions if d not in metrics)
        return cls(tuple(dims), tuple(metrics.items()))


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
class Group:
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


class Selector(Protocol):
    """Which groups of files a compaction rewrites: ``(table, rollup, target file size, now)``."""

    def __call__(self, table: Table, rollup: Rollup | None, target: int, now: datetime) -> list[Group]: ...


def compact(
    tables: Tables,
    datasource: str,
    *,
    store: Any,
    rollup: Rollup | Any | None = None,
    lateness: timedelta = DEFAULT_LATENESS,
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
    now: datetime | None = None,
    dry_run: bool = False,
    attempts: int = COMMIT_ATTEMPTS,
    cancel: threading.Event | None = None,
    select: Selector | None = None,
) -> CompactResult:
    """Rewrite the small files of the closed time partitions of table ``datasource``.

    A partition is closed when its end lies ``lateness`` before ``now``. Without rollup a
    closed partition is rewritten when it has two or more small files (under half of
    ``target_file_size`` in Parquet bytes), only those files; with rollup when it has two
    or more files, all of them, aggregated. Whether rows roll up is the table's to say
    (``reconciler.rollup``, recorded when it was created): raw rows are never merged
    because a spec says rollup today. ``rollup`` (a ``Rollup`` or a ``DataSchema``) gives
    the metrics, and decides only for a table from before that property.

    The run is one write (``store.begin_write``): its files go under
    ``data/compacted/<write id>/``, are made durable, and the commit finishes the write in
    the same transaction as the pointer move (``store.commit_tables``); a clean-up that
    fenced the write first makes the commit fail. All partitions go in one commit; a commit
    that lost against another writer is staged again (the same plan, while the files it
    read are all live) or planned again, and retried up to ``attempts`` times.

    ``select`` chooses the groups instead of the closed-partition rule (the rolling
    compaction of open partitions, ``rolling.py``); everything from the rewrite on is the
    same. It is asked again at each attempt, on the table as it is then.
    """
    if rollup is not None and not isinstance(rollup, Rollup):
        rollup = Rollup.of(rollup)
    now = now or datetime.now(UTC)
    result = CompactResult(table=datasource, dry_run=dry_run, rollup=rollup is not None)
    written: dict[tuple, list[DataFile]] = {}  # (group key, inputs and their deletes) -> files written
    write_id: str | None = None
    done: set[str] = set()  # the files the committed snapshot references
    kept: int | None = None  # the snapshot the plan was made on, while a lost commit keeps it
    inputs: list[str] = []  # the data files the plan merges
    try:
        for attempt in range(attempts):
            result.attempts = attempt + 1
            if tables.load(datasource) is None:
                result.message = f"no table {datasource}"
                return result
            table = tables.current(datasource)
            if kept is not None and unchanged_for(table.metadata, table.io, kept, inputs):
                pass  # every file the plan read is still live: the same overwrite, staged on this table
            else:
                kept = None
                effective = rollup_of_table(table, rollup)
                result.rollup = effective is not None
                if select is None:
                    groups, open_count = _plan(table, effective, lateness, target_file_size, now)
                else:
                    groups, open_count = select(table, effective, target_file_size, now), 0
                result.open_partitions = open_count
                planned_spec, planned_on = table.metadata.default_spec_id, table.metadata.current_snapshot_id
                groups = [g for g in groups if g.key[0] == planned_spec]  # merged files belong to the plan's spec
                inputs = [f.file_path for g in groups for f in g.files]
                result.partitions = [CompactedPartition(g.label, g.start, g.end, len(g.tasks),
                                                        sum(f.record_count for f in g.files),
                                                        sum(f.file_size_in_bytes for f in g.files)) for g in groups]
            if not groups:
                result.message = "nothing to compact"
                return result
            if dry_run:
                result.message = f"would compact {len(groups)} partition(s)"
                return result
            if write_id is None:
                write_id = new_write_id()
                store.begin_write(write_id, "compact", tables=[datasource])
            new_files: list[DataFile] = []
            for group, part in zip(groups, result.partitions, strict=True):
                if cancel is not None and cancel.is_set():
                    result.message = "cancelled"
                    return result
                # a delete file (an outside engine's DELETE) changes a file: no merge from before it
                key = (group.key, frozenset((t.file.file_path, *sorted(d.file_path for d in t.delete_files))
                                            for t in group.tasks))
                if key not in written:
                    written[key] = _rewrite(table, group, effective, target_file_size, write_id)
                out = written[key]
                part.files_after = len(out)
                part.rows_after = sum(f.record_count for f in out)
                part.bytes_after = sum(f.file_size_in_bytes for f in out)
                new_files += out
            faults.point("compact-written", datasource)
            if not tables.storage.remote:  # on an object store a PUT that returned is durable
                durable.sync([local_path(f.file_path) for f in new_files], _dirs_up_to_data(table, new_files))
            summary = {OPERATION: "compact", DATASOURCE: datasource, "reconciler.partitions": str(len(groups)),
                       "reconciler.rollup": str(effective is not None).lower()}
            if select is not None:
                summary[ROLLING] = "true"

            def build(tx, groups=groups, new_files=new_files, summary=summary, planned_spec=planned_spec,
                      read_on=table.metadata.current_snapshot_id, io=table.io, inputs=inputs):
                now_spec = tx.table_metadata.default_spec_id
                if now_spec != planned_spec:  # a publish evolved the partitioning since the plan
                    raise ValidationException(f"the partitioning changed (spec {planned_spec} -> {now_spec})")
                if not unchanged_for(tx.table_metadata, io, read_on, inputs):  # pyiceberg checks data files only
                    raise ValidationException("a file planned on was deleted from or merged since it was read")
                producer = tagged(tx.update_snapshot(snapshot_properties=summary).overwrite(), tx)
                with producer as ow:
                    for group in groups:
                        for f in group.files:
                            ow.delete_data_file(f)
                    for f in new_files:
                        ow.append_data_file(f)

            try:
                commit = tables.stage(datasource, build, write_id=write_id, attempt=attempt)
            except ValidationException as exc:  # a concurrent change pyiceberg's own checks saw
                kept = None
                log.info("compaction of %s: %s; planning again", datasource, exc)
                continue
            faults.point("compact-commit", datasource)
            try:
                store.commit_tables(write_id, "compact", [commit])
            except TableConflict as exc:
                tables.discard_staged([commit])
                kept = planned_on  # kept while every file it read is live (``ancestry``)
                log.info("compaction of %s: the table moved (%s); staging again", datasource, exc)
                time.sleep(min(0.05 * (attempt + 1), 0.5))
                continue
            except WriteFenced as exc:  # a clean-up took the write: its files are the clean-up's now
                written.clear()
                write_id = None
                result.message = str(exc)
                log.warning("compaction of %s: %s", datasource, exc)
                return result
            except CommitOutcomeUnknown as exc:
                faults.point("compact-unknown", datasource)
                if not store.fence_write(write_id):  # it committed after all
                    log.info("compaction of %s: the commit whose outcome was unknown committed", datasource)
                else:
                    tables.discard_staged([commit])
                    written.clear()  # fenced: deleted below
                    result.message = f"commit outcome unknown ({exc}); not committed"
                    return result
            tables.committed([commit])
            done = {f.file_path for f in new_files}
            snap = commit.staged.current_snapshot() if commit.staged is not None else None
            result.committed = True
            result.snapshot_id = snap.snapshot_id if snap else None
            result.message = (f"compacted {len(groups)} partition(s): {result.files_before} file(s) -> "
                              f"{result.files_after}")
            log.info("compaction of %s: %s", datasource, result.message)
            return result
        result.message = f"gave up after {attempts} attempts: the table kept moving"
        return result
    finally:
        if write_id is not None:
            _finish(tables, store, datasource, write_id, written, done)


def _finish(tables: Tables, store: Any, datasource: str, write_id: str,
            written: dict[tuple, list[DataFile]], done: set[str]) -> None:
    """After the run: files of attempts the commit does not reference go now (never
    referenced by anything); a run that did not commit is fenced first, then deleted
    (a fence that cannot be set now leaves them to the leader's recovery)."""
    if done:
        for files in written.values():
            for f in files:
                if f.file_path not in done:
                    _unlink(f.file_path)
        return
    try:
        if not store.fence_write(write_id):
            return
    except ReconcilerError as exc:
        log.warning("compaction of %s: write %s left for recovery (%s)", datasource, write_id, exc)
        return
    table = tables.load(datasource)
    if table is not None:
        tables.storage.delete_dir(tables.storage.join(table.location(), "data", COMPACTED_DIR, write_id))
        for f in tables.write_metadata_files(datasource, write_id):
            _unlink(f)


def _dirs_up_to_data(table: Table, files: list[DataFile]) -> set[Path]:
    """The directories between the new files and the table's ``data/`` (their entries)."""
    data = local_path(table.location()) / "data"
    out: set[Path] = {data, data.parent}
    for f in files:
        d = local_path(f.file_path).parent
        while d != data and data in d.parents:
            out.add(d)
            d = d.parent
    return out


def rollup_of_table(table: Table, rollup: Rollup | None) -> Rollup | None:
    """The rollup a table's rows were written with: its ``reconciler.rollup`` property
    decides (``false``: never aggregate, whatever the spec says now); a table from before
    the property goes by ``rollup``."""
    recorded = table.metadata.properties.get(ROLLUP_PROPERTY)
    if recorded is None:
        return rollup
    if recorded != "true":
        return None
    if rollup is None:
        raise MaintenanceError(f"table {table.name()[-1]} rolls up, but no spec gives its metrics; nothing compacted")
    return rollup


def _plan(table: Table, rollup: Rollup | None, lateness: timedelta, target: int,
          now: datetime) -> tuple[list[Group], int]:
    metadata = table.metadata
    time_id = time_field_id(metadata.schema())
    by_key: dict[tuple, Group] = {}
    for task in table.scan().plan_files():
        f = task.file
        spec = metadata.specs()[f.spec_id]
        start, end = time_interval(spec, f.partition, time_id)
        key = (f.spec_id, tuple(f.partition))
        by_key.setdefault(key, Group(key, start, end, [])).tasks.append(task)
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
        if len(g.tasks) >= 2 and has_news(g.files):
            groups.append(g)
    return groups, open_count


_COMPACTED = re.compile(rf"/data/{COMPACTED_DIR}/([0-9a-f]{{24}})/")


def compaction_of(path: str) -> str | None:
    """The write id of the compaction that wrote data file ``path`` (its directory names the
    write, its name carries the write's tag), or None: a batch's, a replay's, an import's."""
    m = _COMPACTED.search(path)
    if m is None or str(tag(m.group(1))) not in path.rsplit("/", 1)[-1]:
        return None
    return m.group(1)


def has_news(files: Iterable[DataFile]) -> bool:
    """Whether ``files`` are more than one earlier compaction's output: every file not
    written by a compaction is news, and so are the outputs of a second compaction."""
    return len({compaction_of(f.file_path) or f.file_path for f in files}) >= 2


def _rewrite(table: Table, group: Group, rollup: Rollup | None, target: int, write_id: str) -> list[DataFile]:
    """Read a partition's files, (roll up,) and write them again as files of about
    ``target`` Parquet bytes, of the same partition and partition spec, under
    ``<table>/data/compacted/<write id>/``."""
    metadata = table.metadata
    schema = metadata.schema()
    rows = ArrowScan(metadata, table.io, schema, AlwaysTrue()).to_table(group.tasks)
    # pyiceberg packs by Arrow bytes, several times the Parquet bytes: packed by ``target``
    # the outputs would be "small" (Parquet) again and rewritten at every run. The inputs'
    # ratio estimates the outputs' (a merged file compresses a little better, not worse).
    parquet = sum(f.file_size_in_bytes for f in group.files)
    arrow_target = int(target * max(1.0, rows.nbytes / parquet)) if parquet else target
    if rollup is not None:
        rows = rollup_rows(rows, rollup)
    if TIME in rows.column_names:
        rows = rows.sort_by(TIME)
    props = dict(metadata.properties)
    props[TableProperties.WRITE_DATA_PATH] = f"{table.location().rstrip('/')}/data/{COMPACTED_DIR}/{write_id}"
    spec_id = group.files[0].spec_id
    write_meta = metadata.model_copy(update={"properties": props})
    key = PartitionKey([], metadata.specs()[spec_id], schema)  # the path and value of the inputs' spec
    key.__dict__["partition"] = group.tasks[0].file.partition  # the files' own partition (same spec)
    task_schema = pyarrow_to_schema(rows.schema, name_mapping=schema.name_mapping,
                                    format_version=metadata.format_version)
    write_uuid, counter = tag(write_id), itertools.count()
    tasks = (WriteTask(write_uuid=write_uuid, task_id=next(counter), schema=task_schema, record_batches=batches,
                       partition_key=key)
             for batches in bin_pack_arrow_table(rows, arrow_target))
    out = list(write_file(table.io, write_meta, tasks))
    for f in out:  # pyiceberg's DataFile drops the spec id it is given; ours says where it belongs
        f.spec_id = spec_id
    return out


def rollup_rows(rows: pa.Table, rollup: Rollup) -> pa.Table:
    """One row per (``__time``, dimensions): count and sums add up, mins and maxes combine.

    Columns that are neither a metric nor ``__time`` are grouping keys too (a dimension
    the spec no longer names still separates rows: never merge what may differ). Those
    are the table's, any spec's of the datasource, so the results are named as in the
    tasks' rollup (``rollup.aggregate``): a column ``bytes_sum`` beside a sum of ``bytes``
    is no clash."""
    metrics = {name: kind for name, kind in rollup.metrics if name in rows.column_names}
    aggs = []
    for name, kind in metrics.items():
        fn = "sum" if kind in _SUMS else "min" if kind in _MINS else "max" if kind in _MAXES else None
        if fn is None:
            raise MaintenanceError(f"metric {name}: type {kind!r} cannot be rolled up")
        aggs.append((name, rows.column(name), fn))
    grouped = aggregate({c: rows.column(c) for c in rows.column_names if c not in metrics}, aggs)
    columns = []
    for f in rows.schema:
        col = grouped.column(f.name)
        columns.append(col.cast(f.type) if col.type != f.type else col)
    return pa.Table.from_arrays(columns, schema=rows.schema)


def time_field_id(schema) -> int | None:
    try:
        return schema.find_field(TIME).field_id
    except ValueError:
        return None


def time_interval(spec, partition, time_id: int | None) -> tuple[datetime | None, datetime | None]:
    """``[start, end)`` of a file's ``__time`` partition, or (None, None) without one."""
    for pos, pf in enumerate(spec.fields):
        if pf.source_id != time_id:
            continue
        return partition_interval(pf.transform, partition[pos])
    return None, None
