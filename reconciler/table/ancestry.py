"""What happened to a table since a snapshot: whether ``main`` only appended files since.

A compaction that lost its commit to a batch keeps its plan when this says so: every
file it read is still live (an append deletes none), so the same overwrite staged on the
table as it is now is right, and a partition that keeps receiving files (a backfill
publishing back to back) no longer moves the plan at every attempt."""

from __future__ import annotations

from pyiceberg.table import Table
from pyiceberg.table.snapshots import Operation


def only_appends_since(table: Table, snapshot_id: int | None) -> bool:
    """True when ``main`` is at ``snapshot_id`` or reached it from there through snapshots
    that only appended. False when a snapshot between replaced or deleted files (another
    compaction, an import, a delete) or when the chain cannot be followed: a snapshot in it
    was expired, or ``snapshot_id`` is not among ``main``'s ancestors (the table was
    created again, ``main`` was rolled back)."""
    metadata = table.metadata
    at = metadata.current_snapshot_id
    while at != snapshot_id:
        snap = metadata.snapshot_by_id(at) if at is not None else None
        if snap is None or snap.summary is None or snap.summary.operation != Operation.APPEND:
            return False
        at = snap.parent_snapshot_id
    return True
