"""The applier: executes planned actions, each in its own database transaction.

Idempotent by construction: every handler writes the state the action describes
(not a delta), and reset requests are guarded by their token inside the reset
transaction. Running the same plan twice, or crashing half way and planning again,
ends in the same state. Runtimes are not touched here: they read the database.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from reconciler import faults
from reconciler import positions as positions_mod
from reconciler.actual import DetailedState, Kind, State
from reconciler.errors import PermanentError, ReconcilerError
from reconciler.plan import Action, ActionKind
from reconciler.resets import Positions, compute_reset
from reconciler.spec import secrets
from reconciler.spec.markerfiles import retire
from reconciler.spec.model import Position, SupervisorSpec
from reconciler.store.store import ResetResult, Store

log = logging.getLogger(__name__)

Capture = Callable[[SupervisorSpec, Position, datetime], tuple[Positions, dict[str, int]]]


@dataclass(frozen=True)
class ActionResult:
    action: Action
    ok: bool
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action.to_dict(), "ok": self.ok, "message": self.message, "details": self.details}


@dataclass
class Applier:
    store: Store
    actor: str = "reconciler"
    state_dir: Path | None = None
    capture: Capture = positions_mod.capture
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)

    def apply(self, actions: Iterable[Action]) -> list[ActionResult]:
        results = []
        for action in actions:
            try:
                message, details = self._handlers[action.kind](self, action)
                results.append(ActionResult(action, True, message, details))
                log.info("%s %s: %s", action.kind, action.supervisor_id, message)
            except ReconcilerError as exc:
                results.append(ActionResult(action, False, str(exc)))
                log.error("%s %s failed: %s", action.kind, action.supervisor_id, exc)
        return results

    # -- lifecycle ---------------------------------------------------------------------

    def _create(self, a: Action):
        self.store.create_supervisor(a.spec, a.path, actor=self.actor)
        return ("created (suspended)" if a.spec.suspended else "created; PENDING until a runtime starts it"), {}

    def _update(self, a: Action):
        self.store.update_spec(a.spec, a.path, actor=self.actor)
        return f"spec updated to {a.spec.spec_hash}", {}

    def _suspend(self, a: Action):
        self.store.set_state(a.supervisor_id, State.SUSPENDED, actor=self.actor, reason=a.reason)
        return "suspended; checkpoint kept", {}

    def _resume(self, a: Action):
        self.store.set_state(a.supervisor_id, State.PENDING, actor=self.actor, reason=a.reason)
        return "resumed; PENDING until a runtime starts it", {}

    def _terminate(self, a: Action):
        rec = self.store.get(a.supervisor_id)
        if rec is None or rec.state == State.TERMINATED:
            return "terminated already", {}
        # The epoch bump fences a batch in flight: its publish fails and its output is discarded.
        self.store.set_state(a.supervisor_id, State.TERMINATED, DetailedState.TERMINATED, actor=self.actor,
                             reason=a.reason, bump_epoch=True)
        return "terminated; checkpoint and history kept", {}

    def _mark_invalid(self, a: Action):
        self.store.mark_invalid(a.supervisor_id, a.error or a.reason, None, actor=self.actor, path=a.path)
        return "marked invalid; keeps running on its last valid spec", {"error": a.error}

    # -- requests ----------------------------------------------------------------------

    def _reset(self, a: Action):
        req = a.request
        rec = self.store.get(req.supervisor_id)
        if rec is None:
            return self._reject(a, f"unknown supervisor '{req.supervisor_id}'")
        spec = rec.spec
        now = self.clock()
        try:
            pos, initial = self.capture(spec, req.position, now)
            compute = lambda cp: compute_reset(req.position, cp, pos, backfill=req.backfill,  # noqa: E731
                                               allow_rewind=req.allow_rewind)
            result = self.store.apply_reset(req, compute, initial=initial, actor=self.actor)
        except PermanentError as exc:
            if req.trigger == "cli":
                raise
            return self._reject(a, str(exc))
        faults.crash_point("after-reset", req.supervisor_id)
        if result.backfill_id and self.state_dir is not None:
            self._render_backfill(result.backfill_id)
        summary = _summary(result)
        if req.trigger == "marker" and a.path:
            retire(a.path, "applied", summary)
        return _message(result), summary

    def _reject(self, a: Action, reason: str):
        req = a.request
        token = req.token if req else _rejected_token(a.path or "")
        self.store.record_rejected(token, a.supervisor_id, req.trigger if req else "marker", reason, actor=self.actor,
                                   trigger=a.path or (req.source if req else ""))
        if a.path and (req is None or req.trigger == "marker"):
            retire(a.path, "rejected", {"reason": reason})
        raise PermanentError(f"rejected: {reason}")

    def _reject_marker(self, a: Action):
        return self._reject(a, a.error or a.reason)

    def _retire_marker(self, a: Action):
        handled = self.store.request(a.request.token) or {}
        status = handled.get("status", "applied")
        new = retire(a.path, status, {"note": "already handled", "status": status})
        return (f"renamed to {new}" if new else "could not rename; will retry"), {}

    def render_missing_backfills(self, actual) -> None:
        """Render backfill specs that are missing from the state directory (the process died
        between the reset transaction and the rendering): the audit copy exists for every one."""
        if self.state_dir is None:
            return
        for sid, rec in actual.supervisors.items():
            if rec.kind == Kind.BACKFILL and not (self.state_dir / "backfills" / f"{sid}.yaml").exists():
                try:
                    self._render_backfill(sid)
                except OSError as exc:
                    log.warning("cannot render the backfill spec of %s: %s", sid, exc)

    def _render_backfill(self, backfill_id: str) -> None:
        """The generated bounded spec, for audit; never in the watched directory."""
        rec = self.store.get(backfill_id)
        out = self.state_dir / "backfills" / f"{backfill_id}.yaml"
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = {"generated": {"parent": rec.parent_id, "endOffsets": dict(rec.end_offsets or {})}} | dict(rec.spec_document)
        out.write_text("# generated by stream-reconciler: a bounded backfill supervisor\n"
                       + yaml.safe_dump(secrets.redact(doc), sort_keys=False), encoding="utf-8")

    _handlers = {
        ActionKind.CREATE: _create,
        ActionKind.UPDATE: _update,
        ActionKind.SUSPEND: _suspend,
        ActionKind.RESUME: _resume,
        ActionKind.TERMINATE: _terminate,
        ActionKind.MARK_INVALID: _mark_invalid,
        ActionKind.RESET: _reset,
        ActionKind.RESET_AND_BACKFILL: _reset,
        ActionKind.REJECT_MARKER: _reject_marker,
        ActionKind.RETIRE_MARKER: _retire_marker,
    }


def _rejected_token(path: str) -> str:
    """An invalid marker's token: its path and bytes, hashed (fits the column whatever the path;
    the same file is recorded once, a corrected one dropped at the same path is a new request)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with open(fd, "rb") as fh:
            data = fh.read(1 << 20)
    except OSError:
        data = b""
    return "marker-rejected:" + hashlib.sha256(path.encode() + b"\0" + data).hexdigest()


def _summary(result: ResetResult) -> dict[str, Any]:
    if result.applied_before:
        return {"supervisor": result.supervisor_id, "appliedBefore": True, "backfill": result.backfill_id}
    return result.to_dict() | {"backfillRecords": result.outcome.backfill_records}


def _message(result: ResetResult) -> str:
    if result.applied_before:
        return "already applied earlier (same token); nothing changed"
    moved = ", ".join(f"{p.partition}: {p.checkpoint}→{p.new}" for p in result.outcome.partitions if p.new != p.checkpoint)
    msg = f"checkpoint moved ({moved or 'no change'})"
    if result.backfill_id:
        msg += f"; backfill {result.backfill_id} covers {result.outcome.backfill_records} records"
    return msg
