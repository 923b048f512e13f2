"""The audit log: who did what to a supervisor, when and why (secrets redacted), and the
records lost to retention that it carries."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy as sa

from reconciler.model import canonical_json
from reconciler.spec import secrets
from reconciler.store.base import _aware, utcnow
from reconciler.store.records import AuditEntry
from reconciler.store.tables import audit_log


class AuditMixin:
    def audit(self, supervisor_id: str, action: str, actor: str, *, trigger: str | None = None,
              reason: str | None = None, details: Mapping[str, Any] | None = None) -> None:
        with self._write() as c:
            self._audit(c, supervisor_id, action, actor, trigger, reason, details, utcnow())

    @staticmethod
    def _audit(c, supervisor_id, action, actor, trigger, reason, details, now) -> None:
        c.execute(sa.insert(audit_log).values(
            supervisor_id=supervisor_id, at=now, action=action, actor=actor, trigger=trigger,
            reason=secrets.scrub(reason),
            details=canonical_json(secrets.redact(details)) if details is not None else None,
        ))

    def history(self, supervisor_id: str) -> list[AuditEntry]:
        with self._read() as c:
            rows = c.execute(
                sa.select(audit_log).where(audit_log.c.supervisor_id == supervisor_id).order_by(audit_log.c.id)
            ).mappings().all()
        return [_audit_entry(r) for r in rows]

    def recent_audit(self, actions: Sequence[str], limit: int = 20) -> list[AuditEntry]:
        """The newest audit entries of these actions, newest first (the status page's resets)."""
        with self._read() as c:
            rows = c.execute(
                sa.select(audit_log).where(audit_log.c.action.in_(list(actions)))
                .order_by(audit_log.c.id.desc()).limit(limit)
            ).mappings().all()
        return [_audit_entry(r) for r in rows]

    def lost_records(self, supervisor_id: str) -> int:
        """Records this supervisor lost to retention (skips and resets), from the audit log."""
        total = 0
        for e in self.history(supervisor_id):
            total += int((e.get("details") or {}).get("lostRecords") or 0)
        return total

    def all_lost_records(self) -> dict[str, int]:
        """``lost_records`` of every supervisor that lost any, in one query (``status`` of a thousand)."""
        with self._read() as c:
            rows = c.execute(sa.select(audit_log.c.supervisor_id, audit_log.c.details)
                             .where(audit_log.c.details.like('%"lostRecords"%'))).all()
        out: dict[str, int] = {}
        for sid, details in rows:
            lost = int((json.loads(details) or {}).get("lostRecords") or 0)
            if lost:
                out[sid] = out.get(sid, 0) + lost
        return out


def _audit_entry(r) -> AuditEntry:
    return AuditEntry(**{**r, "at": _aware(r["at"]), "details": json.loads(r["details"]) if r["details"] else None})
