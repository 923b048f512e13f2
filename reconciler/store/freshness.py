"""The store's freshness queries (issue 32): lag observations, policy resets, backfill
milestones, health transitions, the webhook's cursors, and what the status page reads.

A mixin of the ``Store`` facade like the other aggregates (it uses ``base``'s ``_read`` and
``_write`` and ``audit``'s ``_audit``).

* ``lag_observations``: one row per supervisor with a ``lagPolicy``, written by the leader's
  lag observer (``observe.lagwatch``) with the audit entries of the breaches it saw start and
  end, in one transaction; ``lag_states`` hands the planner those rows and the last reset each
  policy made (from the ``requests`` table, where every reset records its token).
* backfill milestones (25, 50, 75 %) and health transitions (UNHEALTHY and back) are audit
  entries like any other, written once: a milestone is looked for before it is written, a
  transition is seen inside the transaction that changes the state. The webhook follows the
  audit log, so what is audited is what operators are told.
* ``webhook_cursors``: how far each endpoint got in the audit log, and whether it is failing,
  so a new leader goes on where the last one stopped and ``reconciler status`` can say so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from reconciler.control.actual import DetailedState, State
from reconciler.control.lagpolicy import LagObservation, LagState
from reconciler.spec import secrets
from reconciler.store.audit import _audit_entry
from reconciler.store.base import _aware
from reconciler.store.records import AuditEntry
from reconciler.store.tables import audit_log, batches, lag_observations, requests, webhook_cursors

UNHEALTHY = (State.UNHEALTHY_SUPERVISOR, State.UNHEALTHY_TASKS)
HEALTHY = (State.RUNNING, State.IDLE)
MILESTONES = (25, 50, 75)  # percent of a backfill's range; its completion is audited as COMPLETED


@dataclass(frozen=True)
class AuditNote:
    """An audit entry to write with other changes (the observer's breach events)."""

    supervisor_id: str
    action: str
    actor: str
    reason: str | None = None
    details: Mapping[str, Any] | None = None
    trigger: str | None = None


@dataclass(frozen=True)
class WebhookCursor:
    endpoint: str  # sha256 of the URL
    label: str  # scheme://host:port
    last_id: int  # the last audit entry delivered (or given up)
    failing_since: datetime | None = None
    last_error: str | None = None
    delivered_at: datetime | None = None
    pending: int = 0  # audit entries after last_id (filled by ``webhook_cursors``)

    def to_dict(self) -> dict[str, Any]:
        return {"endpoint": self.label, "id": self.endpoint[:12], "lastDelivered": self.last_id,
                "pending": self.pending, "failing": self.failing_since is not None,
                "failingSince": _iso(self.failing_since), "lastError": self.last_error,
                "deliveredAt": _iso(self.delivered_at)}


class FreshnessStore:
    """Mixed into ``Store``; every method is one transaction."""

    # -- lag observations (the planner's input for lag policies) --------------------------

    def lag_observations(self) -> dict[str, LagObservation]:
        with self._read() as c:
            return {r.supervisor_id: _observation(r) for r in c.execute(sa.select(lag_observations))}

    def lag_states(self) -> dict[str, LagState]:
        """Per supervisor: its last observation and the last reset its policy made (token,
        time and backfill, from the handled requests of trigger ``policy``)."""
        with self._read() as c:
            seen = {r.supervisor_id: _observation(r) for r in c.execute(sa.select(lag_observations))}
            last: dict[str, tuple[datetime, str | None]] = {}
            for r in c.execute(sa.select(requests.c.supervisor_id, requests.c.handled_at, requests.c.result)
                               .where(requests.c.kind == "policy", requests.c.status == "applied")
                               .order_by(requests.c.handled_at)):
                last[r.supervisor_id] = (_aware(r.handled_at), (json.loads(r.result or "{}") or {}).get("backfill"))
        out = {sid: LagState(observation=o) for sid, o in seen.items()}
        for sid, (at, backfill) in last.items():
            out[sid] = LagState(observation=seen.get(sid), last_reset_at=at, last_backfill=backfill)
        return out

    def save_lag(self, rows: Sequence[LagObservation], notes: Sequence[AuditNote] = (),
                 forget: Iterable[str] = (), *, now: datetime) -> None:
        """Write the observations (whole rows), drop those of supervisors no longer observed,
        and write the audit entries of what changed, together."""
        forget = list(forget)
        with self._write() as c:
            ids = [r.supervisor_id for r in rows] + forget
            if ids:
                c.execute(sa.delete(lag_observations).where(lag_observations.c.supervisor_id.in_(ids)))
            if rows:
                c.execute(sa.insert(lag_observations), [_row(r) for r in rows])
            for n in notes:
                self._audit(c, n.supervisor_id, n.action, n.actor, n.trigger, n.reason,
                            dict(n.details) if n.details is not None else None, now)

    # -- backfill milestones ------------------------------------------------------------------

    def backfill_milestones(self, backfill_ids: Iterable[str]) -> dict[str, set[int]]:
        """The progress milestones already audited, per backfill supervisor."""
        ids = list(backfill_ids)
        out: dict[str, set[int]] = {sid: set() for sid in ids}
        if not ids:
            return out
        with self._read() as c:
            for sid, details in c.execute(sa.select(audit_log.c.supervisor_id, audit_log.c.details).where(
                    audit_log.c.supervisor_id.in_(ids), audit_log.c.action == "backfill-progress")):
                out[sid].add(int((json.loads(details or "{}") or {}).get("percent") or 0))
        return out

    def record_milestone(self, backfill_id: str, percent: int, details: Mapping[str, Any], *, now: datetime) -> bool:
        """Audit that a backfill passed ``percent`` of its range, once (False: recorded before)."""
        with self._write() as c:
            for (text,) in c.execute(sa.select(audit_log.c.details).where(
                    audit_log.c.supervisor_id == backfill_id, audit_log.c.action == "backfill-progress")):
                if int((json.loads(text or "{}") or {}).get("percent") or 0) == percent:
                    return False
            self._audit(c, backfill_id, "backfill-progress", "reconciler", None,
                        f"{percent}% of the range ingested", {"percent": percent, **details}, now)
        return True

    # -- health transitions (called inside ``Store.set_detailed``'s transaction) -----------------

    def _health_event(self, c, supervisor_id: str, before: State, after: State, detailed: DetailedState,
                      error: str | None, now: datetime) -> None:
        if after in UNHEALTHY and before not in UNHEALTHY:
            self._audit(c, supervisor_id, "unhealthy", "reconciler", str(detailed), secrets.scrub(error),
                        {"state": str(after), "detailedState": str(detailed), "from": str(before)}, now)
        elif before in UNHEALTHY and after in HEALTHY:
            self._audit(c, supervisor_id, "recovered", "reconciler", str(detailed), None,
                        {"state": str(after), "from": str(before)}, now)

    # -- the audit log, followed by the webhook ----------------------------------------------

    def audit_after(self, after_id: int, limit: int = 100) -> list[AuditEntry]:
        """Audit entries with an id above ``after_id``, oldest first."""
        with self._read() as c:
            rows = c.execute(sa.select(audit_log).where(audit_log.c.id > after_id)
                             .order_by(audit_log.c.id).limit(limit)).mappings().all()
        return [_audit_entry(r) for r in rows]

    def last_audit_id(self) -> int:
        with self._read() as c:
            return int(c.execute(sa.select(sa.func.coalesce(sa.func.max(audit_log.c.id), 0))).scalar_one())

    def webhook_cursor(self, endpoint: str) -> WebhookCursor | None:
        with self._read() as c:
            row = c.execute(sa.select(webhook_cursors).where(webhook_cursors.c.endpoint == endpoint)).first()
        return _cursor(row) if row else None

    def save_webhook_cursor(self, cursor: WebhookCursor, *, now: datetime) -> None:
        values = dict(label=cursor.label, last_id=cursor.last_id, failing_since=cursor.failing_since,
                      last_error=secrets.scrub(cursor.last_error), delivered_at=cursor.delivered_at, updated_at=now)
        with self._write() as c:
            hit = c.execute(sa.update(webhook_cursors).where(webhook_cursors.c.endpoint == cursor.endpoint)
                            .values(**values)).rowcount
            if not hit:
                c.execute(sa.insert(webhook_cursors).values(endpoint=cursor.endpoint, **values))

    def webhook_cursors(self) -> list[WebhookCursor]:
        """Every endpoint's cursor with the number of audit entries it has not delivered yet."""
        with self._read() as c:
            rows = c.execute(sa.select(webhook_cursors).order_by(webhook_cursors.c.label)).all()
            top = int(c.execute(sa.select(sa.func.coalesce(sa.func.max(audit_log.c.id), 0))).scalar_one())
            out = []
            for r in rows:
                pending = 0
                if r.last_id < top:
                    pending = int(c.execute(sa.select(sa.func.count()).where(audit_log.c.id > r.last_id)).scalar_one())
                out.append(_cursor(r, pending))
        return out

    # -- what the status page reads ---------------------------------------------------------

    def last_commits(self) -> dict[str, datetime]:
        """Per datasource, when its table last committed a batch."""
        with self._read() as c:
            rows = c.execute(sa.select(batches.c.datasource, sa.func.max(batches.c.committed_at))
                             .group_by(batches.c.datasource)).all()
        return {ds: _aware(at) for ds, at in rows}

    def recent_batches(self, supervisor_id: str, limit: int = 20) -> list[dict[str, Any]]:
        """The newest committed batches of one supervisor, newest first."""
        with self._read() as c:
            rows = c.execute(sa.select(batches.c.batch_id, batches.c.committed_at, batches.c.records,
                                       batches.c.unparseable, batches.c.rows, batches.c.ranges, batches.c.epoch)
                             .where(batches.c.supervisor_id == supervisor_id)
                             .order_by(batches.c.committed_at.desc()).limit(limit)).mappings().all()
        return [{**r, "committed_at": _aware(r["committed_at"]), "ranges": json.loads(r["ranges"])} for r in rows]


def _observation(r) -> LagObservation:
    return LagObservation(
        supervisor_id=r.supervisor_id, observed_at=_aware(r.observed_at), epoch=int(r.epoch),
        records=None if r.records is None else int(r.records),
        seconds=None if r.lag_ms is None else int(r.lag_ms) / 1000.0,
        breach_since=_aware(r.breach_since), fired_at=_aware(r.fired_at))


def _row(o: LagObservation) -> dict[str, Any]:
    return dict(supervisor_id=o.supervisor_id, observed_at=o.observed_at, epoch=o.epoch, records=o.records,
                lag_ms=None if o.seconds is None else int(round(o.seconds * 1000)),
                breach_since=o.breach_since, fired_at=o.fired_at)


def _cursor(r, pending: int = 0) -> WebhookCursor:
    return WebhookCursor(r.endpoint, r.label, int(r.last_id), _aware(r.failing_since), r.last_error,
                         _aware(r.delivered_at), pending)


def _iso(ts: datetime | None) -> str | None:
    return ts.isoformat() if ts is not None else None
