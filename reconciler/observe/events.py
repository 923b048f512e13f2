"""Audit entries as events: the JSON document a webhook receives for each one.

Every event is an audit entry, so what operators are told is what ``reconciler history``
keeps, in the same order (``id`` is the audit entry's id: a receiver that sees an id twice,
after a leader change, has seen that event). ``type`` is stable and names what happened;
``action`` is the audit log's own word. Secrets were scrubbed when the entry was written
(``Store._audit``), and are scrubbed again here, so nothing a client library echoed leaks.

A document::

    {"type": "reset.applied", "supervisor": "clicks", "time": "2026-11-20T10:00:00.1+00:00",
     "id": 42, "action": "reset-and-backfill", "actor": "policy", "trigger": "policy: ...",
     "reason": "lag policy: 1.4h > 1h", "details": {...}, "summary": "clicks: reset ..."}
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from reconciler.spec import secrets

# audit action -> event type. Types are a contract with receivers: add, never rename.
TYPES: Mapping[str, str] = {
    "create": "supervisor.created",
    "recreate": "supervisor.created",
    "update": "supervisor.updated",
    "suspended": "supervisor.suspended",
    "operator-suspend": "supervisor.suspended",
    "pending": "supervisor.resumed",  # a resume puts the supervisor back to PENDING
    "operator-resume": "supervisor.resumed",
    "terminated": "supervisor.terminated",
    "mark-invalid": "supervisor.invalid",
    "fresh-start": "supervisor.fresh-start",
    "reset": "reset.applied",
    "reset-and-backfill": "reset.applied",
    "reject-request": "reset.rejected",
    "create-backfill": "backfill.created",
    "backfill-progress": "backfill.progress",
    "completed": "backfill.completed",
    "suspend-backfill": "backfill.suspended",
    "resume-backfill": "backfill.resumed",
    "cancel-backfill": "backfill.cancelled",
    "retention-loss": "retention.loss",
    "lag-breach": "lag.breach",
    "lag-breach-end": "lag.recovered",
    "unhealthy": "health.unhealthy",
    "recovered": "health.recovered",
    "deadletter-replay": "deadletter.replayed",
}


def event_type(action: str) -> str:
    """The stable type of an audit action (``audit.<action>`` for one without a name here)."""
    return TYPES.get(action, f"audit.{action}")


def event(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The webhook document of one audit entry (``store.records.AuditEntry``)."""
    at = entry.get("at")
    if isinstance(at, datetime):
        at = (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC).isoformat()
    details = secrets.redact(entry.get("details")) if entry.get("details") is not None else None
    doc = {
        "type": event_type(str(entry["action"])),
        "supervisor": entry["supervisor_id"],
        "time": at,
        "id": int(entry["id"]),
        "action": entry["action"],
        "actor": entry.get("actor"),
        "trigger": secrets.scrub(entry.get("trigger")),
        "reason": secrets.scrub(entry.get("reason")),
        "details": details,
    }
    doc["summary"] = summary(doc)
    return doc


def summary(doc: Mapping[str, Any]) -> str:
    """One line for people: ``clicks: reset.applied by policy (lag policy: 1.4h > 1h)``."""
    d = doc.get("details") or {}
    text = f"{doc['supervisor']}: {doc['type']} by {doc.get('actor') or '?'}"
    extra = []
    if d.get("backfill"):
        extra.append(f"backfill {d['backfill']} of {int(d.get('backfillRecords') or 0):,} records")
    if d.get("percent"):
        extra.append(f"{d['percent']}%")
    if doc["type"] == "deadletter.replayed":
        extra.append(f"{int(d.get('replayed') or 0):,} replayed, {int(d.get('stayed') or 0):,} stayed")
    if d.get("lostRecords"):
        extra.append(f"{int(d['lostRecords']):,} records lost")
    if doc.get("reason"):
        extra.append(str(doc["reason"]))
    return text + (f" ({'; '.join(extra)})" if extra else "")
