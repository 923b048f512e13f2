"""Supervisors and their checkpoints: lifecycle writes (create, update, states), operator
overrides, backfill control, and the checkpoint moves that are not a publish (start
offsets, retention skips)."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from reconciler.control.actual import (
    ActualState,
    DetailedState,
    Kind,
    Override,
    State,
    SupervisorRecord,
)
from reconciler.errors import PermanentError, PublishConflict
from reconciler.model import SupervisorSpec, canonical_json
from reconciler.spec import secrets
from reconciler.store.base import _aware, utcnow
from reconciler.store.tables import checkpoints, overrides, requests, spec_versions, supervisors


class SupervisorsMixin:
    def read_actual(self) -> ActualState:
        with self._read() as c:
            sups = {r.id: _record(r) for r in c.execute(sa.select(supervisors))}
            tokens = frozenset(c.execute(sa.select(requests.c.token)).scalars())
            cps: dict[str, dict[str, int]] = {}
            for sid, p, o in c.execute(sa.select(checkpoints.c.supervisor_id, checkpoints.c.partition,
                                                 checkpoints.c.next_offset)):
                cps.setdefault(sid, {})[p] = int(o)
            held = {r.supervisor_id: Override(r.supervisor_id, r.kind, r.reason, r.actor, _aware(r.at))
                    for r in c.execute(sa.select(overrides))}
        return ActualState(supervisors=sups, handled_tokens=tokens, checkpoints=cps, overrides=held)

    def suspend_by_operator(self, supervisor_id: str, reason: str, *, actor: str, now=None) -> None:
        """Suspend a main supervisor until ``resume_by_operator``, whatever its file says."""
        now = now or utcnow()
        with self._write() as c:
            c.execute(sa.delete(overrides).where(overrides.c.supervisor_id == supervisor_id))
            c.execute(sa.insert(overrides).values(supervisor_id=supervisor_id, kind="suspend", reason=reason,
                                                  actor=actor, at=now))
            c.execute(sa.update(supervisors).where(supervisors.c.id == supervisor_id).where(
                supervisors.c.state != State.TERMINATED).values(
                state=State.SUSPENDED, detailed_state=DetailedState.SUSPENDED, updated_at=now))
            self._audit(c, supervisor_id, "operator-suspend", actor, "cli", reason, None, now)

    def resume_by_operator(self, supervisor_id: str, reason: str | None, *, actor: str, file_suspended: bool,
                           now=None) -> bool:
        """Lift the override; the file is the desired state again (PENDING unless it says
        ``suspended: true``). False when there was no override."""
        now = now or utcnow()
        with self._write() as c:
            gone = c.execute(sa.delete(overrides).where(overrides.c.supervisor_id == supervisor_id)).rowcount
            if not gone:
                return False
            if not file_suspended:
                c.execute(sa.update(supervisors).where(supervisors.c.id == supervisor_id).where(
                    supervisors.c.state == State.SUSPENDED).values(
                    state=State.PENDING, detailed_state=DetailedState.PENDING, updated_at=now))
            self._audit(c, supervisor_id, "operator-resume", actor, "cli", reason, None, now)
        return True

    def control_backfill(self, backfill_id: str, verb: str, reason: str | None, *, actor: str,
                         now=None) -> dict[str, Any]:
        """suspend | resume | cancel a bounded supervisor, in one transaction with its audit entry.

        Cancel bumps the epoch (an in-flight batch fails its publish) and records the range
        left unread, per partition, read under that lock: the gap ``verify`` must explain."""
        now = now or utcnow()
        with self._write() as c:
            # Locked first: a publish of this backfill holds the row until it commits, so the
            # checkpoints read below include it (an unlocked read recorded as "left unread" a
            # range a publish was committing that moment).
            row = c.execute(sa.select(supervisors).where(supervisors.c.id == backfill_id).with_for_update()).first()
            if row is None or row.kind != Kind.BACKFILL:
                raise PermanentError(f"no backfill supervisor '{backfill_id}' (see `reconciler backfill list`)")
            state = State(row.state)
            if state in (State.COMPLETED, State.TERMINATED):
                raise PermanentError(f"backfill '{backfill_id}' is {state}: nothing to {verb}")
            details: dict[str, Any] = {}
            if verb == "suspend":
                values = dict(state=State.SUSPENDED, detailed_state=DetailedState.SUSPENDED)
            elif verb == "resume":
                if state != State.SUSPENDED:
                    raise PermanentError(f"backfill '{backfill_id}' is {state}, not SUSPENDED: nothing to resume")
                values = dict(state=State.PENDING, detailed_state=DetailedState.PENDING)
            else:
                ends = json.loads(row.end_offsets or "{}")
                at = {p: int(o) for p, o in c.execute(sa.select(checkpoints.c.partition, checkpoints.c.next_offset)
                                                      .where(checkpoints.c.supervisor_id == backfill_id))}
                unread = {p: [at.get(p, end), end] for p, end in ends.items() if at.get(p, end) < end}
                details = {"unreadRanges": unread, "unreadRecords": sum(e - s for s, e in unread.values())}
                values = dict(state=State.TERMINATED, detailed_state=DetailedState.TERMINATED,
                              epoch=supervisors.c.epoch + 1)
            c.execute(sa.update(supervisors).where(supervisors.c.id == backfill_id).values(**values, updated_at=now))
            self._audit(c, backfill_id, f"{verb}-backfill", actor, "cli", reason, details or None, now)
        return details

    def get(self, supervisor_id: str) -> SupervisorRecord | None:
        with self._read() as c:
            row = c.execute(sa.select(supervisors).where(supervisors.c.id == supervisor_id)).first()
        return _record(row) if row else None

    def first_offsets(self, supervisor_id: str) -> dict[str, int | None]:
        """Where each partition started (None for checkpoints from before revision 0003)."""
        with self._read() as c:
            rows = c.execute(sa.select(checkpoints.c.partition, checkpoints.c.first_offset)
                             .where(checkpoints.c.supervisor_id == supervisor_id))
            return {p: (int(o) if o is not None else None) for p, o in rows}

    def checkpoints(self, supervisor_id: str) -> dict[str, int]:
        with self._read() as c:
            rows = c.execute(
                sa.select(checkpoints.c.partition, checkpoints.c.next_offset).where(
                    checkpoints.c.supervisor_id == supervisor_id
                )
            )
            return {p: int(o) for p, o in rows}

    def create_supervisor(self, spec: SupervisorSpec, path: str | None, *, actor: str, fresh_start: str | None = None,
                          now=None) -> None:
        """Insert a main supervisor, or bring a TERMINATED one back (checkpoints kept, unless
        ``fresh_start`` says how the source changed: then they are dropped, see ``_fresh_start``)."""
        now = now or utcnow()
        doc = canonical_json(spec.document)
        state = State.SUSPENDED if spec.suspended else State.PENDING
        with self._write() as c:
            existing = c.execute(
                sa.select(supervisors.c.kind, supervisors.c.epoch, supervisors.c.state, supervisors.c.spec_hash)
                .where(supervisors.c.id == spec.id).with_for_update()
            ).first()
            if existing is not None and existing.kind == Kind.MAIN and existing.state != State.TERMINATED:
                if existing.spec_hash == spec.spec_hash:
                    return  # applied already: applying the same plan twice changes nothing
                raise PermanentError(f"supervisor '{spec.id}' exists already; plan again (it needs an update)")
            values = dict(
                spec=doc, spec_hash=spec.spec_hash, spec_path=path, state=state, detailed_state=DetailedState(state),
                spec_error=None, last_attempted_hash=spec.spec_hash, updated_at=now,
            )
            if existing is None:
                c.execute(sa.insert(supervisors).values(id=spec.id, kind=Kind.MAIN, epoch=1, created_at=now, **values))
            elif existing.kind != Kind.MAIN:
                raise PermanentError(f"id '{spec.id}' is taken by a generated backfill supervisor; choose another id")
            else:
                c.execute(sa.update(supervisors).where(supervisors.c.id == spec.id).values(epoch=existing.epoch + 1, **values))
                if fresh_start:
                    self._fresh_start(c, spec.id, fresh_start, actor, path, now)
            self._version(c, spec, now)
            self._audit(c, spec.id, "create" if existing is None else "recreate", actor, path, None,
                        {"specHash": spec.spec_hash, "state": state}, now)

    def update_spec(self, spec: SupervisorSpec, path: str | None, *, actor: str, fresh_start: str | None = None,
                    now=None) -> None:
        """A changed file: the new spec continues from the checkpoint; the epoch is kept,
        so an in-flight batch of the old spec may still publish its (correct) range.
        With ``fresh_start`` (the source identity changed and the spec allows it) the old
        checkpoints are dropped and the epoch bumped: a batch of the old source is fenced."""
        now = now or utcnow()
        with self._write() as c:
            values: dict[str, Any] = dict(spec=canonical_json(spec.document), spec_hash=spec.spec_hash, spec_path=path,
                                          spec_error=None, last_attempted_hash=spec.spec_hash, updated_at=now)
            if fresh_start:
                values["epoch"] = supervisors.c.epoch + 1
            c.execute(sa.update(supervisors).where(supervisors.c.id == spec.id).values(**values))
            if fresh_start:
                self._fresh_start(c, spec.id, fresh_start, actor, path, now)
            self._version(c, spec, now)
            self._audit(c, spec.id, "update", actor, path, None, {"specHash": spec.spec_hash}, now)

    def set_state(self, supervisor_id: str, state: State, detailed: DetailedState | None = None, *,
                  actor: str | None = None, reason: str | None = None, bump_epoch: bool = False,
                  error: str | None = None, clear_error: bool = False, now=None) -> None:
        now = now or utcnow()
        values: dict[str, Any] = dict(state=state, detailed_state=detailed or DetailedState(state), updated_at=now)
        if bump_epoch:
            values["epoch"] = supervisors.c.epoch + 1
        if error is not None or clear_error:
            values["runtime_error"] = secrets.scrub(error)  # a client library may echo a secret
        with self._write() as c:
            c.execute(sa.update(supervisors).where(supervisors.c.id == supervisor_id).values(**values))
            if actor:
                self._audit(c, supervisor_id, state.lower(), actor, None, reason, None, now)

    def set_detailed(self, supervisor_id: str, state: State, detailed: DetailedState, error: str | None) -> None:
        """Runtime status updates; written only when something changed (callers track that).
        Only ``runtime_error`` is the runtime's: the spec file's error is ``mark_invalid``'s."""
        now = utcnow()
        values: dict[str, Any] = dict(state=state, detailed_state=detailed, runtime_error=secrets.scrub(error),
                                      updated_at=now)
        with self._write() as c:
            before = c.execute(sa.select(supervisors.c.state).where(supervisors.c.id == supervisor_id)
                               .with_for_update()).scalar()
            hit = c.execute(
                sa.update(supervisors).where(supervisors.c.id == supervisor_id).where(
                    supervisors.c.state.notin_([State.TERMINATED, State.SUSPENDED, State.COMPLETED])
                ).values(**values)
            ).rowcount
            if hit and before is not None:  # UNHEALTHY and back are audited (and so sent to the webhook)
                self._health_event(c, supervisor_id, State(before), state, detailed, error, now)

    def mark_invalid(self, supervisor_id: str, error: str, attempted_hash: str | None, *, actor: str, path: str | None, now=None) -> None:
        now = now or utcnow()
        values: dict[str, Any] = dict(spec_error=error, updated_at=now)
        if attempted_hash is not None:  # an unparseable file has no hash: keep the last attempted one
            values["last_attempted_hash"] = attempted_hash
        with self._write() as c:
            c.execute(sa.update(supervisors).where(supervisors.c.id == supervisor_id).values(**values))
            self._audit(c, supervisor_id, "mark-invalid", actor, path, error, None, now)

    def _fresh_start(self, c, supervisor_id: str, change: str, actor: str, path: str | None, now) -> None:
        """Drop the checkpoints of the old source (recorded in the audit log, so nothing is lost
        silently); the runtime then starts from startFrom, as for a new supervisor."""
        old = self._checkpoints(c, supervisor_id)
        c.execute(sa.delete(checkpoints).where(checkpoints.c.supervisor_id == supervisor_id))  # first offsets too
        c.execute(sa.update(supervisors).where(supervisors.c.id == supervisor_id)
                  .values(generation=supervisors.c.generation + 1))
        generation = c.execute(sa.select(supervisors.c.generation).where(supervisors.c.id == supervisor_id)).scalar()
        self._audit(c, supervisor_id, "fresh-start", actor, path, change,
                    {"droppedCheckpoints": old, "generation": int(generation or 0)}, now)

    def init_checkpoints(self, supervisor_id: str, offsets: Mapping[str, int]) -> dict[str, int]:
        """Insert checkpoints for partitions that have none (startFrom); returns all of them."""
        with self._write() as c:
            have = self._checkpoints(c, supervisor_id)
            missing = {p: o for p, o in offsets.items() if p not in have}
            if missing:
                c.execute(sa.insert(checkpoints), [
                    {"supervisor_id": supervisor_id, "partition": p, "next_offset": int(o), "first_offset": int(o)}
                    for p, o in missing.items()
                ])
            have.update(missing)
            return have

    @staticmethod
    def _checkpoints(c, supervisor_id: str) -> dict[str, int]:
        rows = c.execute(
            sa.select(checkpoints.c.partition, checkpoints.c.next_offset).where(checkpoints.c.supervisor_id == supervisor_id)
        )
        return {p: int(o) for p, o in rows}

    def skip_lost(self, supervisor_id: str, epoch: int, lost: Mapping[str, tuple[int, int]], *, actor: str,
                  now=None) -> None:
        """Move checkpoints past ranges the broker deleted before they were ingested, recording
        the loss (ranges and count) in the audit log: never a silent skip. Compare-and-swap like
        a publish (epoch and start offsets), so it cannot overwrite a reset or a publish."""
        now = now or utcnow()
        with self._write() as c:
            hit = c.execute(sa.update(supervisors).where(supervisors.c.id == supervisor_id, supervisors.c.epoch == epoch)
                            .values(updated_at=now)).rowcount
            if hit != 1:
                raise PublishConflict(f"{supervisor_id}: epoch is no longer {epoch}; retention skip not applied")
            for p, (start, end) in lost.items():
                moved = c.execute(sa.update(checkpoints).where(
                    checkpoints.c.supervisor_id == supervisor_id, checkpoints.c.partition == p,
                    checkpoints.c.next_offset == start).values(next_offset=end)).rowcount
                if moved != 1:
                    raise PublishConflict(f"{supervisor_id}: partition {p} checkpoint is no longer {start}")
            total = sum(end - start for start, end in lost.values())
            self._audit(c, supervisor_id, "retention-loss", actor, "broker retention",
                        f"{total} records deleted by the broker before they were ingested",
                        {"lostRecords": total, "lostRanges": {p: list(r) for p, r in lost.items()}}, now)

    @staticmethod
    def _version(c, spec: SupervisorSpec, now) -> None:
        c.execute(sa.insert(spec_versions).values(
            supervisor_id=spec.id, spec_hash=spec.spec_hash, spec=canonical_json(spec.document), created_at=now
        ))


@functools.lru_cache(maxsize=16384)  # every pass reads every stored spec again: decode each text once
def _document(text: str) -> Mapping[str, Any]:
    return json.loads(text)


def _record(r) -> SupervisorRecord:
    return SupervisorRecord(
        id=r.id, kind=Kind(r.kind), spec_document=_document(r.spec), spec_hash=r.spec_hash,
        state=State(r.state), detailed_state=DetailedState(r.detailed_state), epoch=int(r.epoch),
        parent_id=r.parent_id, spec_path=r.spec_path, last_request=r.last_request, spec_error=r.spec_error,
        runtime_error=r.runtime_error,
        last_attempted_hash=r.last_attempted_hash,
        start_offsets={k: int(v) for k, v in json.loads(r.start_offsets).items()} if r.start_offsets else None,
        end_offsets={k: int(v) for k, v in json.loads(r.end_offsets).items()} if r.end_offsets else None,
        created_at=_aware(r.created_at), updated_at=_aware(r.updated_at), generation=int(r.generation or 0),
    )
