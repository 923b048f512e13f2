"""Reset requests: one type for the three triggers (spec stanza, marker file, CLI).

Each request carries an idempotency token; the reset transaction records it, so a
request is applied once even when the daemon crashes half way and runs again.
"""

from __future__ import annotations

import getpass
from dataclasses import dataclass
from typing import Literal

from reconciler.spec.model import Marker, Position, SupervisorSpec

Trigger = Literal["stanza", "marker", "cli"]


@dataclass(frozen=True)
class ResetRequest:
    supervisor_id: str
    token: str
    trigger: Trigger
    source: str  # stanza request id, marker path, or CLI user@operation
    position: Position
    backfill: bool = True
    backfill_task_count: int | None = None
    allow_rewind: bool = False
    reason: str | None = None

    @property
    def action_kind(self) -> str:
        return "reset-and-backfill" if self.backfill else "reset"

    def describe(self) -> str:
        what = f"reset to {self.position}" + (" with backfill" if self.backfill else " without backfill")
        return f"{what} ({self.trigger} {self.source})"


def from_stanza(spec: SupervisorSpec) -> ResetRequest | None:
    bf = spec.backfill
    if bf is None:
        return None
    return ResetRequest(
        supervisor_id=spec.id,
        token=stanza_token(spec.id, bf.request),
        trigger="stanza",
        source=bf.request,
        position=bf.reset_to,
        backfill=True,
        backfill_task_count=bf.task_count,
        allow_rewind=bf.allow_rewind,
        reason=bf.reason or f"backfill request {bf.request}",
    )


def stanza_token(supervisor_id: str, request: str) -> str:
    return f"stanza:{supervisor_id}:{request}"[:160]


def from_marker(marker: Marker) -> ResetRequest:
    return ResetRequest(
        supervisor_id=marker.supervisor_id,
        token=f"marker:{marker.token}",
        trigger="marker",
        source=marker.path,
        position=marker.reset_to,
        backfill=marker.backfill,
        backfill_task_count=marker.backfill_task_count,
        allow_rewind=marker.allow_rewind,
        reason=marker.reason,
    )


def from_cli(
    supervisor_id: str,
    position: Position,
    *,
    operation_id: str,
    backfill: bool = True,
    backfill_task_count: int | None = None,
    allow_rewind: bool = False,
    reason: str | None = None,
) -> ResetRequest:
    user = _user()
    return ResetRequest(
        supervisor_id=supervisor_id,
        token=f"cli:{operation_id}",
        trigger="cli",
        source=f"{user} (operation {operation_id})",
        position=position,
        backfill=backfill,
        backfill_task_count=backfill_task_count,
        allow_rewind=allow_rewind,
        reason=reason,
    )


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in a container: still an operator
        return "unknown"
