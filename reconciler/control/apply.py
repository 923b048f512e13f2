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
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from reconciler import faults
from reconciler.control import positions as positions_mod
from reconciler.control.actual import DetailedState, Kind, State
from reconciler.control.plan import Action, ActionKind
from reconciler.control.resets import RENEWED, Positions, compute_reset
from reconciler.errors import PermanentError, ReconcilerError, StaleRequest
from reconciler.model import Position, SupervisorSpec
from reconciler.spec import secrets
from reconciler.spec.markerfiles import retire
from reconciler.store.store import ResetResult, Store
from reconciler.streams.base import SourceMissing

log = logging.getLogger(__name__)

Capture = Callable[[SupervisorSpec, Position, datetime], tuple[Positions, dict[str, int]]]


class _DryRun(Exception):
    """A reset's checks passed: its transaction is rolled back (``Applier._dry_run``)."""


class _AlreadyRecorded(Exception):
    """The table's refusal of this spec is the supervisor's spec error already."""


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
    # A missing topic or stream is asked again after these pauses before a request naming it
    # is rejected: a broker may answer "unknown topic" for a moment (just created, leader moving).
    missing_retry_delays: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
    sleep: Callable[[float], None] = time.sleep
    # The output tables' warehouse: a spec whose columns its table cannot take (a long
    # column now a string) is refused here as an invalid spec; None: not checked.
    warehouse: str | None = None
    # settings.catalog: with the lake's catalog a reset fences the table before it captures
    catalog: dict | None = None
    # Whether a reset's rewind lands on a source that started over below the checkpoint
    # (``runtime.startedover.asker``, handed in: this layer may not import the runtime); a
    # request that does not say so already is asked, whatever its trigger. None: not asked.
    started_over: Callable[[Any, Position], str | None] | None = None
    _tables: Any = field(default=None, repr=False)

    def apply(self, actions: Iterable[Action]) -> list[ActionResult]:
        """Each action on its own: one supervisor's failure is reported on it and the pass goes on."""
        results = []
        for action in actions:
            try:
                message, details = self._handlers[action.kind](self, action)
                results.append(ActionResult(action, True, message, details))
                log.info("%s %s: %s", action.kind, action.supervisor_id, message)
            except _AlreadyRecorded as exc:  # refused in an earlier pass: said then, not every tick
                results.append(ActionResult(action, False, f"{exc}; keeps running on its last valid spec"))
            except ReconcilerError as exc:
                results.append(ActionResult(action, False, str(exc)))
                log.error("%s %s failed: %s", action.kind, action.supervisor_id, exc)
            except Exception as exc:  # noqa: BLE001 - a bug or an untranslated library error must not stop the pass
                message = f"unexpected {type(exc).__name__}: {exc}"
                results.append(ActionResult(action, False, message))
                log.exception("%s %s failed: %s", action.kind, action.supervisor_id, message)
        return results

    # -- lifecycle ---------------------------------------------------------------------

    def _table_refuses(self, a: Action) -> None:
        """Record a spec whose columns the table refuses as the supervisor's spec error (it
        keeps running on its last valid spec) and fail the action; once recorded, again quietly."""
        if self.warehouse is None or a.spec is None:
            return
        from reconciler.table.locations import catalog_names

        try:  # the lake's catalog is asked below (its load says whether the table exists)
            names = catalog_names(self.store.engine) if not self.catalog else None
        except Exception:  # noqa: BLE001 - unreadable here: the full check below says why
            names = None
        if names is not None and a.spec.data_schema.datasource not in names:
            return  # no table yet (a new datasource, a first start): nothing to refuse, no pyiceberg to import
        from reconciler.table.types import table_refusal

        try:
            if self._tables is None:
                from reconciler.table.catalogs import open_tables

                self._tables = open_tables(self.store.engine, self.warehouse, self.catalog)
            why = table_refusal(self._tables, a.spec.data_schema)
        except Exception as exc:  # noqa: BLE001 - a warehouse out of reach: the publish refuses such a change
            log.warning("%s: its table could not be checked (%s: %s); a change it cannot take fails at publish",
                        a.supervisor_id, type(exc).__name__, exc)
            return
        if why is None:
            return
        error = f"{a.path}: {why}" if a.path else why
        rec = self.store.get(a.supervisor_id)
        if rec is not None and rec.spec_error == error and rec.last_attempted_hash == a.spec.spec_hash:
            raise _AlreadyRecorded(error)
        if rec is not None:
            self.store.mark_invalid(a.supervisor_id, error, a.spec.spec_hash, actor=self.actor, path=a.path)
        raise PermanentError(f"{error}; keeps running on its last valid spec")

    def _create(self, a: Action):
        self._table_refuses(a)
        self._fence_epoch_bump(a.supervisor_id, a.fresh_start)
        self.store.create_supervisor(a.spec, a.path, actor=self.actor, fresh_start=a.fresh_start)
        message = "created (suspended)" if a.spec.suspended else "created; PENDING until a runtime starts it"
        if a.fresh_start:
            message += f"; fresh start on the new source ({a.fresh_start}): old checkpoints dropped"
        return message, {}

    def _update(self, a: Action):
        self._table_refuses(a)
        self._fence_epoch_bump(a.supervisor_id, a.fresh_start)
        self.store.update_spec(a.spec, a.path, actor=self.actor, fresh_start=a.fresh_start)
        message = f"spec updated to {a.spec.spec_hash}"
        if a.fresh_start:
            message += f"; fresh start on the new source ({a.fresh_start}): old checkpoints dropped"
        return message, {}

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
        self._fence_epoch_bump(a.supervisor_id, True)
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
        if req.started_over is None and self.started_over is not None:
            why = self.started_over(rec, req.position)
            if why:  # the records below the checkpoint are new ones: the transaction begins a new generation
                req = replace(req, started_over=why)
        # a lag policy's reset is the policy's act, whichever daemon applied it (the audit says `policy`)
        actor = "policy" if req.trigger == "policy" else self.actor
        try:
            # Checked before the fence: a request refused after it would leave the fence, and
            # the supervisor waiting for an epoch no transaction bumps.
            fenced = self._external() and self._dry_run(req, spec, now, actor) and self._fence_table(rec, rec.epoch + 1)
            try:
                pos, initial = self._capture(spec, req.position, now)
                result = self.store.apply_reset(req, self._compute(req, pos), initial=initial, earliest=pos.earliest,
                                                actor=actor)
            except (PermanentError, StaleRequest):  # refused before its transaction: nothing bumped the epoch
                if fenced:  # (a roll-forward moved the checkpoint under the check): the fence is lifted
                    self._fence_table(rec, rec.epoch)
                raise
        except PermanentError as exc:
            if req.trigger == "cli":
                raise
            return self._reject(a, str(exc))
        except StaleRequest as exc:  # not handled: the next pass decides on what is true then
            return f"not applied: {exc}", {"stale": True}
        faults.crash_point("after-reset", req.supervisor_id)
        summary = _summary(result)
        message = _message(result)
        if result.backfill_id and self.state_dir is not None:
            try:
                self._render_backfill(result.backfill_id)
            except OSError as exc:
                # The reset committed; only the audit copy is missing. Said here, retried each pass.
                problem = f"the audit copy of {result.backfill_id} cannot be written under {self.state_dir}: {exc}"
                log.warning("%s: %s", req.supervisor_id, problem)
                summary["renderError"] = problem
                message += f"; {problem} (will retry)"
        if req.trigger == "marker" and a.path:
            retire(a.path, "applied", summary)
        return message, summary

    def _fence_epoch_bump(self, supervisor_id: str, bumps: Any) -> None:
        """An external catalog's table commits before the database's epoch check, and a batch
        refused there is rolled forward whatever the epoch: an epoch bump (terminate, a fresh
        start) fences the table first, as a reset does."""
        rec = self.store.get(supervisor_id) if bumps and self._external() else None
        if rec is not None and rec.state != State.TERMINATED:
            self._fence_table(rec, rec.epoch + 1)

    def control_backfill(self, backfill_id: str, verb: str, reason: str | None) -> dict[str, Any]:
        """``backfill suspend|resume|cancel`` (the CLI's, and anyone's who cancels one). A cancel
        bumps the backfill's epoch, which an external catalog's table never checks: its batch
        in flight would land and be rolled forward, into the range the cancel reports unread.
        So the table is fenced first, as for terminate; the fence's roll-forward also records
        a batch that landed before it, so the unread range is read from a database that
        holds every batch the table does."""
        rec = self.store.get(backfill_id) if verb == "cancel" else None
        if rec is not None and rec.kind == Kind.BACKFILL and rec.state != State.COMPLETED:
            self._fence_epoch_bump(backfill_id, True)  # a refusal (no such backfill, ended) fences nothing
        return self.store.control_backfill(backfill_id, verb, reason, actor=self.actor)

    @staticmethod
    def _compute(req, pos: Positions):
        return lambda cp: compute_reset(req.position, cp, pos, backfill=req.backfill, allow_rewind=req.allow_rewind)

    def _external(self) -> bool:
        return bool(self.catalog) and self.warehouse is not None

    def _dry_run(self, req, spec: SupervisorSpec, now: datetime, actor: str) -> bool:
        """The reset's own transaction on offsets captured now, rolled back: raises what it
        would refuse (PermanentError, StaleRequest). False when the token was applied already
        (nothing to fence)."""
        pos, initial = self._capture(spec, req.position, now)
        compute = self._compute(req, pos)

        def check(cp):
            outcome = compute(cp)
            if outcome.ok:
                raise _DryRun  # rolls the transaction back
            return outcome

        try:
            done = self.store.apply_reset(req, check, initial=initial, earliest=pos.earliest, actor=actor)
        except _DryRun:
            return True
        return not done.applied_before

    def _fence_table(self, rec, epoch: int) -> bool:
        """With an external catalog the table is the truth: first the supervisor's fence moves (a
        batch in flight from the old checkpoint can no longer commit) and the database is rolled
        forward to the table; only then are offsets captured and the epoch bumped. A crash
        anywhere is resumed by the same steps (table/catalogs/fence.py). ``epoch``: from which
        epoch batches may build on the fence (the current one: a fence that blocks nobody)."""
        if not self._external():
            return False
        from reconciler.table.catalogs import open_tables
        from reconciler.table.catalogs.fence import fence
        from reconciler.table.writeids import new_write_id

        tables = open_tables(self.store.engine, self.warehouse, self.catalog)
        fence(tables, self.store, rec.spec.data_schema.datasource, rec.id, epoch, new_write_id())
        faults.crash_point("after-fence", rec.id)
        return True

    def _capture(self, spec: SupervisorSpec, position: Position, now: datetime):
        """``capture``, asking again while the broker says the topic or stream is missing."""
        for delay in (*self.missing_retry_delays, None):
            try:
                return self.capture(spec, position, now)
            except SourceMissing as exc:
                if delay is None:
                    raise SourceMissing(f"{exc} (asked {len(self.missing_retry_delays) + 1} times over "
                                        f"{sum(self.missing_retry_delays):g}s)") from None
                log.info("%s: %s; asking again in %gs", spec.id, exc, delay)
                self.sleep(delay)
        raise AssertionError("unreachable")

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
        handled = self.store.request(a.request.token)
        status = handled.status if handled is not None else "applied"
        new = retire(a.path, status, {"note": "already handled", "status": status})
        return (f"renamed to {new}" if new else "could not rename; will retry"), {}

    def render_missing_backfills(self, actual) -> None:
        """Render backfill specs that are missing from the state directory (the process died
        between the reset transaction and the rendering): the audit copy exists for every one."""
        if self.state_dir is None:
            return
        for sid, rec in actual.supervisors.items():
            if rec.kind != Kind.BACKFILL:
                continue
            try:
                if not (self.state_dir / "backfills" / f"{sid}.yaml").exists():
                    self._render_backfill(sid)
            except Exception as exc:  # noqa: BLE001 - an audit copy must never stop the pass
                log.warning("cannot render the backfill spec of %s under %s: %s", sid, self.state_dir, exc)

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
    out = result.to_dict() | {"backfillRecords": result.outcome.backfill_records}
    if result.outcome.lost_records:
        out |= {"lostRecords": result.outcome.lost_records,
                "lostRanges": {p: list(r) for p, r in result.outcome.lost_ranges.items()}}
    return out


def _message(result: ResetResult) -> str:
    if result.applied_before:
        return "already applied earlier (same token); nothing changed"
    moved = ", ".join(f"{p.partition}: {p.checkpoint}→{p.new}" for p in result.outcome.partitions if p.new != p.checkpoint)
    msg = f"checkpoint moved ({moved or 'no change'})"
    # a rewind of a source that started over: the log and `reconciler apply` say what the CLI's reset says
    msg += "".join(f"; {w}" for w in result.outcome.warnings if w.startswith(RENEWED))
    if result.backfill_id:
        msg += f"; backfill {result.backfill_id} covers {result.outcome.backfill_records} records"
    if result.outcome.lost_records:
        ranges = ", ".join(f"{p}: [{a}, {b})" for p, (a, b) in result.outcome.lost_ranges.items())
        msg += (f"; {result.outcome.lost_records} records LOST: deleted by the broker's retention "
                f"before they were ingested ({ranges})")
    return msg
