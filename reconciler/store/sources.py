"""Which source the checkpoints were taken on, and starting over on a source that started over.

The identity seen (Kafka's topic id) is kept in the audit log, not in a column: it changes
only when the source is deleted and created again, which is an event worth a line of history
anyway, and the log already carries the supervisor's generation beside it.

``restart_source`` is the one write for a topic deleted and re-created, or a partition
truncated below its checkpoint (``runtime.truncation``): the offsets below the checkpoint
now name other records, so the supervisor begins a new source generation (``verify`` checks
each generation's offsets apart, as after a fresh start), the truncated partitions go back
to the new earliest offset and every partition's tiling of the new generation starts where
its checkpoint now is. Compare-and-swap like a publish (epoch and checkpoints), so it cannot
overwrite a reset or a publish that came first. Partitions the new source does not have lose
their checkpoints (recorded), so one that comes back starts at its earliest offset.

The fingerprint (``runtime.fingerprint``) is kept in the audit log too, written only when a
generation's first one is taken or retention deleted the record of the last one: a few
lines per source generation. ``end_backfill_lost`` ends a backfill whose source started over,
its unread range recorded as lost (counted in status like retention loss).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import sqlalchemy as sa

from reconciler.errors import PublishConflict
from reconciler.store.base import utcnow
from reconciler.store.tables import audit_log, batches, checkpoints, supervisors

IDENTITY_ACTIONS = ("source-identity", "source-restarted")
FINGERPRINT = "source-fingerprint"
_LAST_BATCHES = 200  # batches looked at for the one that set a checkpoint (the upgrade's one check)


class SourcesMixin:
    def source_identity(self, supervisor_id: str, generation: int) -> str | None:
        """The source identity recorded for this generation of the supervisor's source (a
        backfill asks its main supervisor's, for the generation it was created in)."""
        for details in self._source_entries(supervisor_id, IDENTITY_ACTIONS):
            seen = int(details.get("generation") or 0)
            if seen < generation:
                return None
            if seen == generation:
                return str(details["identity"]) if details.get("identity") else None
        return None

    def note_identity(self, supervisor_id: str, identity: str, generation: int, *, actor: str) -> None:
        """The first identity seen for this generation of the source."""
        with self._write() as c:
            self._audit(c, supervisor_id, "source-identity", actor, "stream",
                        f"the topic's id recorded, to tell a re-created topic from this one (id {identity})",
                        {"identity": identity, "generation": int(generation)}, utcnow())

    def source_fingerprint(self, supervisor_id: str, generation: int) -> dict[str, tuple[int, int]]:
        """Per partition, ``(offset, timestamp)`` of a record ingested in this source generation
        (``runtime.fingerprint``); empty when none was taken."""
        for details in self._source_entries(supervisor_id, (FINGERPRINT, "source-restarted")):
            if int(details.get("generation") or 0) != generation:
                return {}
            return {p: (int(o), int(t)) for p, (o, t) in (details.get("fingerprint") or {}).items()}
        return {}

    def note_fingerprint(self, supervisor_id: str, generation: int, marks: Mapping[str, tuple[int, int]], *,
                         actor: str) -> None:
        """Written when the first fingerprint of a generation is taken, or when retention
        deleted the record of the last one: a few lines per source generation, not one a step."""
        with self._write() as c:
            self._audit(c, supervisor_id, FINGERPRINT, actor, "stream",
                        "fingerprint of the source: the timestamps of records already ingested",
                        {"generation": int(generation),
                         "fingerprint": {p: [o, t] for p, (o, t) in sorted(marks.items())}}, utcnow())

    def _source_entries(self, supervisor_id: str, actions):
        with self._read() as c:
            rows = c.execute(sa.select(audit_log.c.details).where(
                audit_log.c.supervisor_id == supervisor_id, audit_log.c.action.in_(actions))
                .order_by(audit_log.c.id.desc())).all()
        for row in rows:
            if row.details:
                yield json.loads(row.details)

    def ingested_at(self, supervisor_id: str, checkpoint: Mapping[str, int]) -> dict[str, datetime]:
        """Per partition, when the batch that moved its checkpoint to where it is committed
        (among the last batches; absent when a reset or a start set it)."""
        with self._read() as c:
            rows = c.execute(sa.select(batches.c.ranges, batches.c.committed_at)
                             .where(batches.c.supervisor_id == supervisor_id)
                             .order_by(batches.c.committed_at.desc()).limit(_LAST_BATCHES)).all()
        out: dict[str, datetime] = {}
        for row in rows:
            for r in json.loads(row.ranges):  # [partition, start, end]
                p, end = (str(r[0]), int(r[2])) if isinstance(r, list) else (str(r["partition"]), int(r["end"]))
                if p not in out and checkpoint.get(p) == end:
                    at = row.committed_at
                    out[p] = at if at.tzinfo else at.replace(tzinfo=UTC)
        return out

    def end_backfill_lost(self, backfill_id: str, epoch: int, lost: Mapping[str, tuple[int, int]], *,
                          reason: str, actor: str) -> None:
        """A backfill whose source was deleted and created again can no longer read its range
        (those offsets name other records now): its checkpoints go to its end offsets and the
        unread ranges are recorded as lost, like records deleted by retention (status counts
        them). Compare-and-swap like a publish."""
        now = utcnow()
        with self._write() as c:
            hit = c.execute(sa.update(supervisors).where(supervisors.c.id == backfill_id,
                                                         supervisors.c.epoch == epoch)
                            .values(updated_at=now)).rowcount
            if hit != 1:
                raise PublishConflict(f"{backfill_id}: epoch is no longer {epoch}; backfill end not applied")
            for p, (start, end) in lost.items():
                moved = c.execute(sa.update(checkpoints).where(
                    checkpoints.c.supervisor_id == backfill_id, checkpoints.c.partition == p,
                    checkpoints.c.next_offset == start).values(next_offset=end)).rowcount
                if moved != 1:
                    raise PublishConflict(f"{backfill_id}: partition {p} checkpoint is no longer {start}")
            total = sum(end - start for start, end in lost.values())
            self._audit(c, backfill_id, "retention-loss", actor, "source re-created", reason,
                        {"lostRecords": total, "lostRanges": {p: list(r) for p, r in sorted(lost.items())}}, now)

    def restart_source(self, supervisor_id: str, epoch: int, moves: Mapping[str, tuple[int, int]], *,
                       identity: str | None, previous: str | None, reason: str, actor: str,
                       dropped: Sequence[str] = ()) -> int:
        """Move each partition of ``moves`` from its checkpoint back to the new earliest offset,
        forget the checkpoints of ``dropped`` (partitions the new source does not have: if they
        come back they start at their earliest offset, as any new partition does), begin a new
        source generation, record it; returns the new generation. The new generation's
        identity is ``identity`` or unknown, never the old one."""
        now = utcnow()
        with self._write() as c:
            hit = c.execute(sa.update(supervisors).where(supervisors.c.id == supervisor_id,
                                                         supervisors.c.epoch == epoch)
                            .values(generation=supervisors.c.generation + 1, updated_at=now)).rowcount
            if hit != 1:
                raise PublishConflict(f"{supervisor_id}: epoch is no longer {epoch}; source restart not applied")
            for p, (start, new) in moves.items():
                moved = c.execute(sa.update(checkpoints).where(
                    checkpoints.c.supervisor_id == supervisor_id, checkpoints.c.partition == p,
                    checkpoints.c.next_offset == start).values(next_offset=new)).rowcount
                if moved != 1:
                    raise PublishConflict(f"{supervisor_id}: partition {p} checkpoint is no longer {start}")
            for p in dropped:
                c.execute(sa.delete(checkpoints).where(checkpoints.c.supervisor_id == supervisor_id,
                                                       checkpoints.c.partition == p))
            c.execute(sa.update(checkpoints).where(checkpoints.c.supervisor_id == supervisor_id)
                      .values(first_offset=checkpoints.c.next_offset))
            generation = int(c.execute(sa.select(supervisors.c.generation)
                                       .where(supervisors.c.id == supervisor_id)).scalar() or 0)
            details = {"generation": generation,
                       "restartedPartitions": {p: {"checkpoint": s, "new": n} for p, (s, n) in sorted(moves.items())}}
            if dropped:
                details["droppedPartitions"] = sorted(dropped)
            if identity:
                details["identity"] = identity
            if previous:
                details["previousIdentity"] = previous
            self._audit(c, supervisor_id, "source-restarted", actor, "stream", reason, details, now)
            return generation

    def source_restarts(self) -> dict[str, int]:
        """Per supervisor, how many times its source started over (re-created or truncated)."""
        with self._read() as c:
            rows = c.execute(sa.select(audit_log.c.supervisor_id, sa.func.count())
                             .where(audit_log.c.action == "source-restarted")
                             .group_by(audit_log.c.supervisor_id)).all()
        return {sid: int(n) for sid, n in rows}
