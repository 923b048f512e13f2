"""``verify`` between an external catalog's two commits: what the table holds past the checkpoint.

With an external catalog the table commits first and the database follows it
(``catalogs/fence.py``): a ``verify`` run between a batch's table commit and its database
commit (or after a crash there) sees the table past the main checkpoint. That is not a
batch "committed by no checkpoint": the next step, the next leader's recovery or a reset
walks the supervisor's fence tag chain back to the first batch the database knows and
records the others (``fence.roll_forward``). So the batches at the head of that chain, which
tile each partition exactly from the checkpoint on, oldest first, are pending here; anything
else past the checkpoint (a batch off the chain, another generation's, one that does not
start where the database stopped) stays a failure.

The database is not asked which batches it holds: a batch is recorded once a checkpoint
moved to its end, so the walk stops at the first batch whose range ends at or below the
checkpoint. A rewind that put the checkpoint back at a recorded batch's start is explained
by the audit log's rewind first (``verify.explanations`` comes before these).
"""

from __future__ import annotations

from collections.abc import Mapping

from reconciler.table.catalogs.fence import FENCE, FENCE_PREV, tag_name
from reconciler.table.files import BatchSnapshot
from reconciler.table.summary import OPERATION


def head_ranges(metadata, supervisor_id: str, generation: int, checkpoints: Mapping[str, int],
                snaps: list[BatchSnapshot]) -> dict[str, tuple[int, int, tuple[str, ...]]]:
    """Per partition, ``(checkpoint, end, batch ids)``: what the supervisor's unrecorded
    batches at the head of its tag chain hold past the checkpoint, where they tile it exactly."""
    by_id = {s.snapshot_id: s for s in snaps}
    ref = metadata.refs.get(tag_name(supervisor_id))
    batches: list[BatchSnapshot] = []
    sid = ref.snapshot_id if ref is not None else None
    while sid is not None:
        snap = metadata.snapshot_by_id(sid)
        if snap is None:  # expired: recorded long ago (every step rolls the chain forward first)
            break
        props = dict(snap.summary.additional_properties) if snap.summary else {}
        if props.get(OPERATION) != FENCE:  # a reset's or a leader's fence holds no records
            batch = by_id.get(sid)
            if batch is None or batch.supervisor_id != supervisor_id or batch.generation != generation:
                break
            if any(p in checkpoints and e <= checkpoints[p] for p, s, e in batch.ranges if e > s):
                break  # recorded: the checkpoint moved past it
            batches.append(batch)
        prev = props.get(FENCE_PREV)
        sid = int(prev) if prev else None
    cursor = dict(checkpoints)
    broken: set[str] = set()
    ids: dict[str, list[str]] = {}
    for batch in reversed(batches):
        for p, s, e in batch.ranges:
            if e <= s or p not in cursor:
                continue
            if s != cursor[p]:
                broken.add(p)  # not where the database stopped: rolled forward by nobody
            cursor[p] = e
            ids.setdefault(p, []).append(batch.batch_id)
    return {p: (checkpoints[p], end, tuple(ids[p])) for p, end in cursor.items()
            if p not in broken and end > checkpoints[p]}
