"""Fencing through the table, and the database rolled forward from it (external catalogs).

Each supervisor has one tag in its datasource's table, ``reconciler-fence-<id>``: a
compare-and-swap register whose value is a snapshot id. A batch's step reads the tag (H)
before it reads its checkpoints; its commit asserts the tag is still at H and moves it to
the batch's new snapshot, in the same catalog commit. A reset moves the tag away first (a
fence snapshot, empty, of its own). Snapshot ids are random and never reused, so a tag
never comes back to a value a stale batch read (no ABA). RELIABILITY.md, "External
catalogs", has the whole argument.

Every snapshot the tag points at names the tag's previous value (``reconciler.fence-prev``),
so the supervisor's commits form a chain. The database follows the table: the commits at
the head of the chain that it has not recorded (a crash between the table's commit and the
database's) are recorded by ``roll_forward``, oldest first, at the cost of reading the
table's current metadata once and asking the database about the head's batch.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from reconciler.model import PartitionRange
from reconciler.store.batches import TableConflict as StoreConflict
from reconciler.table.catalog import TIME, TableConflict, append_files, deadletter_table
from reconciler.table.catalogs.external import ExternalCommit, ExternalTables, FenceMoved, _ref
from reconciler.table.summary import BATCH, EPOCH, OPERATION, RECORDS, UNPARSEABLE, summary_ranges

log = logging.getLogger(__name__)

FENCE_PREV = "reconciler.fence-prev"  # the tag's value this snapshot was built on ("" for none)
FENCE_OF = "reconciler.fence-of"  # a reset's fence snapshot: the supervisor it fences
FENCE_EPOCH = "reconciler.fence-epoch"  # ... and the epoch from which batches may build on it
DEAD_FILES = "reconciler.dead-files"  # a batch's dead-letter files (JSON list), committed after it
FENCE = "fence"  # reconciler.operation of a fence snapshot
ATTEMPTS = 20
# A table a fence creates (a reset before the first batch): the first batch evolves it.
FIRST_SCHEMA = pa.schema([pa.field(TIME, pa.timestamp("us", tz="UTC"))])


def fence_leader_change(tables: ExternalTables, store, name: str, supervisor_id: str) -> Head:
    """A new leader's recovery, before it deletes any write in flight: the supervisor's tag
    moves (a zombie leader's batch built on the old tag fails its commit), then the database
    is rolled forward. The fence blocks no batch of the current epoch (a reset's fence not
    bumped yet still blocks: its epoch is kept, read from the tag each commit attempt builds
    on, since a reset may fence between this read of the row and the commit)."""
    from reconciler.table.writeids import new_write_id

    rec = store.get(supervisor_id)
    if rec is None:
        return roll_forward(tables, store, name, supervisor_id)
    return fence(tables, store, name, supervisor_id, rec.epoch, new_write_id(), keep_pending=True)


def tag_name(supervisor_id: str) -> str:
    return f"reconciler-fence-{supervisor_id}"


@dataclass(frozen=True)
class Head:
    """Where a supervisor's fence tag is, and what that says about its next batch."""

    snapshot_id: int | None
    fence_epoch: int | None = None  # the head is a reset's fence: batches of an older epoch wait
    pending: tuple[dict[str, str], ...] = field(default=())  # committed in the table, not in the database

    def blocks(self, epoch: int) -> bool:
        """A reset fenced the table and has not bumped the epoch yet (or crashed before it did)."""
        return self.fence_epoch is not None and epoch < self.fence_epoch


def read_head(tables: ExternalTables, name: str, supervisor_id: str, recorded: Callable[[str], bool]) -> Head:
    table = tables.load(name)
    if table is None:
        return Head(None)
    metadata = table.metadata
    head = _ref(table, tag_name(supervisor_id))
    fence_epoch, pending = None, []
    sid, first = head, True
    while sid is not None:
        snap = metadata.snapshot_by_id(sid)
        if snap is None:  # expired: recorded long ago (every step rolls the chain forward first)
            break
        props = dict(snap.summary.additional_properties) if snap.summary else {}
        if props.get(OPERATION) == FENCE:
            if first:
                fence_epoch = int(props.get(FENCE_EPOCH) or 0)
        elif recorded(props.get(BATCH, "")):
            break
        else:
            pending.append(props)
        first = False
        prev = props.get(FENCE_PREV)
        sid = int(prev) if prev else None
    return Head(head, fence_epoch, tuple(reversed(pending)))


def roll_forward(tables: ExternalTables, store, name: str, supervisor_id: str) -> Head:
    """Record in the database the supervisor's batches the table has and it has not
    (their dead letters committed first), oldest first; the head as it is then."""
    head = read_head(tables, name, supervisor_id, lambda b: bool(b) and bool(store.committed_batch_ids([b])))
    for props in head.pending:
        commit_dead_letters(tables, name, supervisor_id, props)
        ranges = [PartitionRange(p, s, e) for p, s, e in summary_ranges(props)]
        store.roll_forward(supervisor_id=supervisor_id, batch_id=props[BATCH], datasource=name,
                           epoch=int(props.get(EPOCH) or 0), ranges=ranges, records=int(props.get(RECORDS) or 0),
                           unparseable=int(props.get(UNPARSEABLE) or 0), rows=int(props.get("added-records") or 0))
        log.warning("batch %s of %s was in table %s but not in the database (a crash between the two commits): "
                    "rolled forward", props[BATCH][:12], supervisor_id, name, extra={"supervisor": supervisor_id})
    return Head(head.snapshot_id, head.fence_epoch, ())


def commit_dead_letters(tables: ExternalTables, name: str, supervisor_id: str, props: dict[str, str]) -> None:
    """The dead letters of the batch ``props`` describes, appended to the dead-letter table
    unless they are there already (its own fence tag is at that batch): idempotent, so the
    publish and any roll-forward may race for it."""
    files = json.loads(props.get(DEAD_FILES) or "[]")
    if not files:
        return
    dead, ref = deadletter_table(name), tag_name(supervisor_id)
    batch = props[BATCH]
    for attempt in range(ATTEMPTS):
        table = tables.current(dead)
        at = _ref(table, ref)
        # The whole chain, not its head: a later batch's dead letters may have moved the tag
        # since (a zombie's publish woke after the next leader rolled it forward and went on).
        if _in_chain(table.metadata, at, batch):
            return
        # ours only: pyiceberg writes its own totals into a summary, and refuses them given
        summary = {k: v for k, v in props.items() if k.startswith("reconciler.") and k not in (DEAD_FILES, FENCE_PREV)}
        summary[FENCE_PREV] = str(at or "")
        try:
            tables.commit_fenced(dead, lambda tx, s=summary: append_files(tx, files, s), fence=(ref, at),
                                 write_id=batch, attempt=100 + attempt)
            return
        except (TableConflict, FenceMoved):
            continue
    raise TableConflict(f"table {dead}: dead letters of batch {batch[:12]} not committed after {ATTEMPTS} attempts")


def _fence_epoch(metadata, sid: int | None) -> int | None:
    """The epoch a fence snapshot ``sid`` records, None if it is no fence."""
    snap = metadata.snapshot_by_id(sid) if sid is not None else None
    props = snap.summary.additional_properties if snap is not None and snap.summary else {}
    return int(props.get(FENCE_EPOCH) or 0) if props.get(OPERATION) == FENCE else None


def _in_chain(metadata, at: int | None, batch: str) -> bool:
    """Whether ``batch`` is on the tag's chain from ``at`` back (fence-prev), as far as the
    table's history goes (a commit keeps ``snapshotsKept`` snapshots)."""
    sid = at
    while sid is not None:
        snap = metadata.snapshot_by_id(sid)
        if snap is None:
            return False
        props = snap.summary.additional_properties if snap.summary else {}
        if props.get(BATCH) == batch:
            return True
        prev = props.get(FENCE_PREV)
        sid = int(prev) if prev else None
    return False


def fence(tables: ExternalTables, store, name: str, supervisor_id: str, next_epoch: int, write_id: str, *,
          keep_pending: bool = False) -> Head:
    """A reset's first step: move the supervisor's tag to a new, empty snapshot saying which
    epoch may build on it (a batch in flight from before can no longer commit), then roll the
    database forward to the table. The reset then captures offsets and bumps the epoch; a
    crash anywhere is resumed by doing the same again.

    A table that does not exist yet is created first (``__time`` only, the first batch
    evolves it): a first batch that read no table must find a tag where it read none.

    ``keep_pending`` (a leader change's fence): a reset's fence the new one replaces keeps
    its epoch if higher; a reset's own fence (and the one lifting a refused reset) records
    ``next_epoch`` as given."""
    if tables.load(name) is None:
        tables.ensure(name, FIRST_SCHEMA, None)
    ref = tag_name(supervisor_id)
    # Recorded as committing while its catalog commits are under way (``Store.commit_tables``):
    # orphan clean-up takes a write nobody recorded for one that committed and deletes its
    # unreferenced files, the manifest list of the commit in flight too, and a new leader's
    # recovery deletes the files of a write still ``writing``, though its commit landed.
    commit = ExternalCommit(name, "", None, write_id,
                            lambda: _commit_fence(tables, name, supervisor_id, next_epoch, write_id, ref, keep_pending))
    try:
        store.commit_tables(write_id, FENCE, [commit])
    except StoreConflict as exc:
        raise TableConflict(str(exc)) from None
    return roll_forward(tables, store, name, supervisor_id)


def _commit_fence(tables: ExternalTables, name: str, supervisor_id: str, next_epoch: int, write_id: str,
                  ref: str, keep_pending: bool = False) -> None:
    from reconciler.table.catalog import tagged

    for attempt in range(ATTEMPTS):
        table = tables.current(name)
        at = _ref(table, ref)
        epoch = next_epoch
        if keep_pending:
            # Read from the very snapshot this attempt asserts: a reset that fenced since the
            # caller read the row would otherwise be lifted, and a batch of the old epoch read
            # checkpoints the reset's capture then duplicates (explorer seed 1006).
            epoch = max(epoch, _fence_epoch(table.metadata, at) or 0)
        summary = {OPERATION: FENCE, FENCE_OF: supervisor_id, FENCE_EPOCH: str(epoch), FENCE_PREV: str(at or "")}

        def build(tx: Any, summary: dict[str, str] = summary) -> None:
            with tagged(tx.update_snapshot(snapshot_properties=summary).fast_append(), tx):
                pass

        try:
            tables.commit_fenced(name, build, fence=(ref, at), write_id=write_id, attempt=attempt)
            break
        except (TableConflict, FenceMoved):
            continue
    else:
        raise TableConflict(f"table {name}: the reset's fence for {supervisor_id} not committed after {ATTEMPTS} "
                            "attempts (the table kept moving); the reset is tried again")
