"""Whether the files a compaction planned on are all still live in a table as it is now.

A compaction that lost its commit to a batch keeps its plan when they are: the same
overwrite staged on the table as it is now is right, and a partition that keeps receiving
files (a backfill publishing back to back) no longer moves the plan at every attempt.
``only_appends_since`` answers from the snapshots' summaries alone; when the chain cannot
be followed (the publish's own expiry removed a snapshot of it, at one commit every 50 ms
within a few seconds), ``all_live`` reads the current snapshot's manifests."""

from __future__ import annotations

from collections.abc import Iterable

from pyiceberg.io import FileIO
from pyiceberg.table import DataScan
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Operation


def only_appends_since(metadata: TableMetadata, snapshot_id: int | None) -> bool:
    """True when ``main`` is at ``snapshot_id`` or reached it from there through snapshots
    that only appended (no data file removed, no delete file added). False when a snapshot
    between replaced or deleted files (another compaction, an import, a delete) or when the
    chain cannot be followed: a snapshot in it was expired, or ``snapshot_id`` is not among
    ``main``'s ancestors (the table was created again, ``main`` was rolled back)."""
    at = metadata.current_snapshot_id
    while at != snapshot_id:
        snap = metadata.snapshot_by_id(at) if at is not None else None
        if snap is None or snap.summary is None or snap.summary.operation != Operation.APPEND:
            return False
        at = snap.parent_snapshot_id
    return True


def all_live(metadata: TableMetadata, io: FileIO, paths: Iterable[str]) -> bool:
    """True when every data file in ``paths`` is live in the current snapshot of
    ``metadata``, with no delete file applying to it (a merge of it would bring the deleted
    rows back)."""
    wanted = set(paths)
    if metadata.current_snapshot_id is None:
        return not wanted
    found = set()
    for task in DataScan(metadata, io).plan_files():
        if task.file.file_path in wanted:
            if task.delete_files:
                return False
            found.add(task.file.file_path)
    return found == wanted


def unchanged_for(metadata: TableMetadata, io: FileIO, read_on: int | None, paths: Iterable[str]) -> bool:
    """Whether a merge of ``paths`` read on snapshot ``read_on`` is still right on
    ``metadata``: only appends since (nothing to read), else every file still live with no
    delete file (the manifests read)."""
    return only_appends_since(metadata, read_on) or all_live(metadata, io, paths)
