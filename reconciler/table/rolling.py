"""Rolling compaction: merge the small files of the time partitions still being written.

``compact.py`` waits until a partition is closed. Within the open hour every batch adds
files (one per task and partition), so the hour's live files, each publish's manifest
work and a reader's file count grow with the commit rate until the hour closes: at one
commit a second, 3,600 files. The leader (``runtime/compactor.py``) therefore also runs
this compaction of the OPEN partitions every ``rollingCompaction`` seconds, and sooner
when many files arrived since its last run.

What it selects, per partition of the table's current partitioning that is not closed:
the small files (under half the target size) whose data sequence number is at most the
cutoff, the current snapshot's sequence number minus ``keep_recent``: the files of the
last few commits are left to the next run. A partition whose selected files all came out
of one earlier compaction has nothing new and is left alone: an hour that has ended but
is still open would otherwise be rewritten whole at every run. The cutoff is taken once
per run, at its first plan. A run that loses the compare-and-swap (a publish moved the table) plans
again with the same cutoff, so it selects the same files: publishes only add files of
newer sequence numbers, and ``compact`` reuses what it wrote for an unchanged set. Without
that, each lost race would select a slightly different set, rewrite it, and lose again
at one commit a second.

Its safety is compaction's, unchanged: the same write (``begin_write``, files under
``data/compacted/<write id>/``, durable before the commit), the same ``overwrite``
snapshot (``reconciler.operation=compact``, no offsets, plus ``reconciler.rolling``)
committed by compare-and-swap with the database, the same fence and clean-up. It
deletes only files it read; rows are rolled up when the table rolls up.

The bound: after a run the open partition holds its merged file(s), the files of the
last ``keep_recent`` commits, and what arrived during the run. Between runs it grows by
the commits of one interval, and the compactor runs early once ``TRIGGER_FILES`` new
files appeared (checked every few seconds), so it stays near 100 at any commit rate the
compaction keeps up with.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from pyiceberg.manifest import ManifestContent, ManifestEntryStatus
from pyiceberg.table import FileScanTask, Table

from reconciler.table.catalog import Tables
from reconciler.table.compact import (
    COMMIT_ATTEMPTS,
    DEFAULT_LATENESS,
    DEFAULT_TARGET_FILE_SIZE,
    CompactResult,
    Group,
    Rollup,
    compact,
    has_news,
    time_field_id,
    time_interval,
)

DEFAULT_KEEP_RECENT = 3  # commits whose files a run leaves alone (a publish in flight rarely loses)
TRIGGER_FILES = 50  # new live files since the last run that bring the next run forward
MIN_FILES = 2  # a partition is merged when at least this many of its files are selected


class OpenSelector:
    """The rolling rule as a ``compact.Selector``: one instance per run (it keeps the cutoff)."""

    def __init__(self, lateness: timedelta = DEFAULT_LATENESS, keep_recent: int = DEFAULT_KEEP_RECENT):
        self.lateness = lateness
        self.keep_recent = keep_recent
        self.cutoff: int | None = None  # the highest data sequence number this run merges

    def __call__(self, table: Table, rollup: Rollup | None, target: int, now: datetime) -> list[Group]:
        snap = table.current_snapshot()
        if snap is None:
            return []
        if self.cutoff is None:
            self.cutoff = (snap.sequence_number or 0) - self.keep_recent
        return select_open(table, snap, self.cutoff, self.lateness, target, now)


def select_open(table: Table, snap: Any, cutoff: int, lateness: timedelta, target: int,
                now: datetime) -> list[Group]:
    """The groups to merge: per open partition of the current partitioning, its small
    files of data sequence number at most ``cutoff``, when there are ``MIN_FILES`` or more
    and they are not all one earlier compaction's output (``compact.has_news``)."""
    metadata = table.metadata
    spec = metadata.spec()
    time_id = time_field_id(metadata.schema())
    if len(spec.fields) != 1 or time_id is None:
        return []  # unpartitioned, or partitioned on more than time: left to the closed rule
    small = target // 2
    by_key: dict[tuple, Group] = {}
    manifests = snap.manifests(table.io)
    if any(m.content != ManifestContent.DATA for m in manifests):
        return []  # an outside engine's row-level deletes: the closed rule's scan applies them, this one would not
    for manifest in manifests:
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            f = entry.data_file
            if entry.status == ManifestEntryStatus.DELETED or f.spec_id != metadata.default_spec_id:
                continue  # an older partitioning's files are left alone, as compact.py does
            if (entry.sequence_number or 0) > cutoff or f.file_size_in_bytes >= small:
                continue
            start, end = time_interval(spec, f.partition, time_id)
            if end is None or end + lateness <= now:
                continue  # closed: the hourly compaction's (rewriting it here would race it)
            key = (f.spec_id, tuple(f.partition))
            by_key.setdefault(key, Group(key, start, end, [])).tasks.append(FileScanTask(f))
    groups = [g for g in by_key.values() if len(g.tasks) >= MIN_FILES and has_news(g.files)]
    return sorted(groups, key=lambda g: (g.start or datetime.min.replace(tzinfo=UTC), g.key))


def compact_open(
    tables: Tables,
    datasource: str,
    *,
    store: Any,
    rollup: Rollup | Any | None = None,
    lateness: timedelta = DEFAULT_LATENESS,
    keep_recent: int = DEFAULT_KEEP_RECENT,
    target_file_size: int = DEFAULT_TARGET_FILE_SIZE,
    now: datetime | None = None,
    dry_run: bool = False,
    attempts: int = COMMIT_ATTEMPTS,
    cancel: threading.Event | None = None,
) -> CompactResult:
    """One rolling compaction of ``datasource``'s open partitions (see the module's
    docstring); committed, retried and cleaned up exactly as ``compact.compact``."""
    return compact(tables, datasource, store=store, rollup=rollup, lateness=lateness,
                   target_file_size=target_file_size, now=now, dry_run=dry_run, attempts=attempts,
                   cancel=cancel, select=OpenSelector(lateness, keep_recent))


def live_files(table: Table) -> int:
    """Live data files of the table's current snapshot, from its summary (no manifest read);
    None-safe: 0 for an empty table."""
    snap = table.current_snapshot()
    if snap is None or snap.summary is None:
        return 0
    return int(snap.summary.additional_properties.get("total-data-files", 0) or 0)
