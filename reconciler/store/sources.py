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
overwrite a reset or a publish that came first.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import sqlalchemy as sa

from reconciler.errors import PublishConflict
from reconciler.store.base import utcnow
from reconciler.store.tables import audit_log, checkpoints, supervisors

IDENTITY_ACTIONS = ("source-identity", "source-restarted")


class SourcesMixin:
    def source_identity(self, supervisor_id: str) -> tuple[str, int] | None:
        """The last source identity recorded for the supervisor, with the generation it was seen in."""
        with self._read() as c:
            row = c.execute(sa.select(audit_log.c.details).where(
                audit_log.c.supervisor_id == supervisor_id, audit_log.c.action.in_(IDENTITY_ACTIONS))
                .order_by(audit_log.c.id.desc()).limit(1)).first()
        if row is None or not row.details:
            return None
        details = json.loads(row.details)
        if not details.get("identity"):
            return None
        return str(details["identity"]), int(details.get("generation") or 0)

    def note_identity(self, supervisor_id: str, identity: str, generation: int, *, actor: str) -> None:
        """The first identity seen for this generation of the source."""
        with self._write() as c:
            self._audit(c, supervisor_id, "source-identity", actor, "stream", f"source identity {identity}",
                        {"identity": identity, "generation": int(generation)}, utcnow())

    def restart_source(self, supervisor_id: str, epoch: int, moves: Mapping[str, tuple[int, int]], *,
                       identity: str | None, previous: str | None, reason: str, actor: str) -> int:
        """Move each partition of ``moves`` from its checkpoint back to the new earliest offset,
        begin a new source generation, record it; returns the new generation."""
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
            c.execute(sa.update(checkpoints).where(checkpoints.c.supervisor_id == supervisor_id)
                      .values(first_offset=checkpoints.c.next_offset))
            generation = int(c.execute(sa.select(supervisors.c.generation)
                                       .where(supervisors.c.id == supervisor_id)).scalar() or 0)
            details = {"generation": generation,
                       "restartedPartitions": {p: {"checkpoint": s, "new": n} for p, (s, n) in sorted(moves.items())}}
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
