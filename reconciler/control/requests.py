"""Reset requests: one type for the four triggers (spec stanza, marker file, CLI, lag policy).

Each request carries an idempotency token; the reset transaction records it, so a
request is applied once even when the daemon crashes half way and runs again.
"""

from __future__ import annotations

import getpass
import hashlib
from dataclasses import dataclass
from typing import Literal

from reconciler.model import Marker, Position, SupervisorSpec

Trigger = Literal["stanza", "marker", "cli", "policy"]  # policy: see ``control.lagpolicy``


@dataclass(frozen=True)
class ResetRequest:
    supervisor_id: str
    token: str
    trigger: Trigger
    source: str  # stanza request id, marker path, CLI user@operation, or the policy's breach
    position: Position
    backfill: bool = True
    backfill_task_count: int | None = None
    allow_rewind: bool = False
    reason: str | None = None
    epoch: int | None = None  # a policy's: the supervisor's epoch its observation saw (applied only at it)
    started_over: str | None = None  # why the source started over below the checkpoint (reset asked it): a new generation

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


TOKEN_MAX = 160  # characters of the requests.token column


def fit_token(token: str) -> str:
    """The token as stored: itself when it fits the column, else a readable head and the hash
    of the whole, so two long request ids that share their first 160 characters stay two
    requests (cutting them made the second one "already handled")."""
    if len(token) <= TOKEN_MAX:
        return token
    digest = hashlib.sha256(token.encode()).hexdigest()
    return f"{token[:TOKEN_MAX - 72]}~sha256:{digest}"


def stanza_token(supervisor_id: str, request: str) -> str:
    return fit_token(f"stanza:{supervisor_id}:{request}")


def marker_token(marker: Marker) -> str:
    """One request per appearance of a marker file: its name and bytes, and the file's identity
    on disk (device, inode, ctime).

    * The same file seen again (the rename to ``.applied`` failed, or the process died before
      it) has the same identity: the token is handled, the request is not applied again.
    * The same text dropped again for a new incident is a new file: a new inode, or a reused
      inode number with a later ctime (the kernel sets ctime when the file is created and it
      cannot be set back by hand), so a new token and a new reset.
    * Changing the file's metadata while it sits un-renamed (chmod, touch, a hard link) changes
      ctime and makes it a new request too; delete such a marker instead. A repeated
      ``resetTo: latest`` is harmless anyway (the checkpoint never moves back, the backfill
      covers the new gap), and rewinds need ``allowRewind``.
    * Markers are for incidents, not for a git checkout: a checkout that restores a renamed
      marker restores a new file. Keep repeatable requests as a ``backfill:`` stanza in git.
    """
    base = f"marker:{marker.token}"
    return fit_token(f"{base}:{marker.appearance}" if marker.appearance else base)


def from_marker(marker: Marker) -> ResetRequest:
    return ResetRequest(
        supervisor_id=marker.supervisor_id,
        token=marker_token(marker),
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
    started_over: str | None = None,
) -> ResetRequest:
    user = _user()
    return ResetRequest(
        supervisor_id=supervisor_id,
        token=fit_token(f"cli:{operation_id}"),
        trigger="cli",
        source=f"{user} (operation {operation_id})",
        position=position,
        backfill=backfill,
        backfill_task_count=backfill_task_count,
        allow_rewind=allow_rewind,
        reason=reason,
        started_over=started_over,
    )


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry in a container: still an operator
        return "unknown"
