"""What the store hands out besides supervisor records: typed, never raw rows.

Dataclasses for values the product computes with (batch totals, a handled request, the
leader lease, a daemon's heartbeat); ``TypedDict`` for the audit log and segment rows,
which ``history -o json`` and the tests read as documents, so their shape is the contract.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypedDict


@dataclass(frozen=True)
class BatchTotals:
    """The committed batches of one supervisor."""

    batches: int = 0
    records: int = 0
    unparseable: int = 0
    first: datetime | None = None  # commit time of the first and the last batch
    last: datetime | None = None


NO_BATCHES = BatchTotals()


@dataclass(frozen=True)
class HandledRequest:
    """A reset request (marker, ``reconciler reset``, backfill stanza) applied or rejected once."""

    token: str
    supervisor_id: str
    kind: str  # marker | cli | stanza
    status: str  # applied | rejected
    result: dict[str, Any]
    handled_at: datetime | None


@dataclass(frozen=True)
class Lease:
    """The leader lease: who holds it, its fencing token, until when."""

    name: str
    holder: str
    token: int
    expires_at: datetime

    def live(self, now: datetime) -> bool:
        return self.expires_at > now

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "holder": self.holder, "token": self.token, "expires_at": self.expires_at}


@dataclass(frozen=True)
class DaemonBeat:
    """A live daemon, from its heartbeat."""

    daemon: str
    role: str  # leader | standby
    expires_at: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"daemon": self.daemon, "role": self.role, "expires_at": self.expires_at}


class AuditEntry(TypedDict):
    id: int
    supervisor_id: str
    at: datetime
    action: str
    actor: str
    trigger: str | None
    reason: str | None
    details: dict[str, Any] | None


class SegmentRow(TypedDict):
    id: int
    datasource: str
    supervisor_id: str
    batch_id: str
    segment: str
    interval_start: str
    interval_end: str
    path: str
    rows: int
    bytes: int
    created_at: datetime
    ranges: str  # the batch's ranges, JSON
