"""Reset requests: the exactly-once reset transaction (checkpoint read under lock, the
backfill supervisor, the token), rejected requests, and the tokens handled."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from reconciler import faults
from reconciler.control.actual import DetailedState, Kind, State
from reconciler.control.requests import ResetRequest
from reconciler.control.resets import ResetOutcome, fill_missing, renew
from reconciler.errors import PermanentError, RetryableError, StaleRequest
from reconciler.model import BACKFILL_ID, canonical_json, document_hash
from reconciler.store.base import _aware, _short, utcnow
from reconciler.store.records import HandledRequest
from reconciler.store.tables import checkpoints, requests, spec_versions, supervisors


@dataclass(frozen=True)
class ResetResult:
    supervisor_id: str
    token: str
    outcome: ResetOutcome
    backfill_id: str | None
    applied_before: bool = False  # the token had been handled already: nothing changed now

    def to_dict(self) -> dict[str, Any]:
        return {
            "supervisor": self.supervisor_id,
            "token": self.token,
            "backfill": self.backfill_id,
            "partitions": [p.to_dict() for p in self.outcome.partitions],
            "warnings": list(self.outcome.warnings),
            "appliedBefore": self.applied_before,
        }


class RequestsMixin:
    def apply_reset(self, request: ResetRequest, compute: Callable[[Mapping[str, int]], ResetOutcome], *,
                    initial: Mapping[str, int], actor: str, earliest: Mapping[str, int] | None = None,
                    now=None) -> ResetResult:
        """The exactly-once reset: ONE transaction from the locked checkpoint to the token.

        Checkpoints that do not exist yet are filled by ``resets.fill_missing``: from
        ``initial`` (what startFrom gives) for a supervisor that never had one, from
        ``earliest`` for a partition that appeared later. ``compute`` is
        ``resets.compute_reset`` bound to the captured positions, run on the checkpoint
        read here, under lock, so a publish that landed after the positions were captured
        is accounted for, never overwritten.

        Two processes applying the same request at once: the token is checked after the
        supervisor row is locked, so the second waits for the first and then sees its
        token (READ COMMITTED reads what committed meanwhile) and reports "already applied".
        """
        now = now or utcnow()
        try:
            # The explorer switches threads here: a batch committing now must be read by the
            # transaction (its checkpoints are read under lock inside it, never before).
            faults.point("reset-begin", request.supervisor_id)
            with self._write() as c:
                return self._apply_reset(c, request, compute, initial, earliest, actor, now)
        except sa_exc.IntegrityError as exc:
            # The token's row is the last insert: a unique violation there means another
            # process applied the same request between our checks (belt and braces).
            done = self.request(request.token)
            if done is not None:
                return ResetResult(request.supervisor_id, request.token, ResetOutcome(()), done.result.get("backfill"),
                                   True)
            raise RetryableError(f"reset of {request.supervisor_id} collided with a concurrent write: {_short(exc)}") from exc

    def _apply_reset(self, c, request: ResetRequest, compute, initial, earliest, actor: str, now) -> ResetResult:
        row = c.execute(sa.select(supervisors).where(supervisors.c.id == request.supervisor_id).with_for_update()).first()
        prior = c.execute(sa.select(requests).where(requests.c.token == request.token)).first()
        if prior is not None:
            res = json.loads(prior.result or "{}")
            return ResetResult(request.supervisor_id, request.token, ResetOutcome(()), res.get("backfill"), True)
        if row is None or row.kind != Kind.MAIN:
            raise PermanentError(f"unknown supervisor '{request.supervisor_id}'")
        if request.trigger == "policy" and row.state == State.SUSPENDED:  # read under the lock: exact
            raise PermanentError(f"{row.id} is suspended: a lag policy never resets a suspended supervisor")
        if request.epoch is not None and row.epoch != request.epoch:  # another reset landed since it was decided
            raise StaleRequest(f"{row.id} was reset since its lag was observed (epoch {request.epoch}, now "
                               f"{row.epoch}): the lag is observed again before a policy acts")
        current = self._checkpoints(c, request.supervisor_id)
        filled = fill_missing(current, earliest if earliest is not None else initial, initial)
        missing = {p: o for p, o in filled.items() if p not in current}
        if missing:
            c.execute(sa.insert(checkpoints), [
                {"supervisor_id": row.id, "partition": p, "next_offset": int(o), "first_offset": int(o)}
                for p, o in missing.items()
            ])
            current.update(missing)
        outcome = compute(current)
        if request.started_over:  # what a rewind reads there is the new source's: a new generation
            outcome = renew(outcome, request.started_over, f"{row.id}@{row.generation + 1}")
        if not outcome.ok:
            raise PermanentError("; ".join(outcome.errors))
        backfill_id = None
        if request.backfill and outcome.backfill_ranges:
            backfill_id = self._insert_backfill(c, row, request, outcome, now)
        for p, new in outcome.new_offsets.items():
            if new != current[p]:
                c.execute(sa.update(checkpoints).where(
                    checkpoints.c.supervisor_id == row.id, checkpoints.c.partition == p
                ).values(next_offset=new))
        values: dict[str, Any] = dict(epoch=row.epoch + 1, updated_at=now)
        if request.trigger == "stanza":
            values["last_request"] = request.source
        renewed = {p.partition: p for p in outcome.partitions if p.renewed}
        if renewed:
            values["generation"] = row.generation + 1
        c.execute(sa.update(supervisors).where(supervisors.c.id == row.id).values(**values))
        if renewed:
            self._begin_generation(c, row, request, renewed, now)
        result = ResetResult(row.id, request.token, outcome, backfill_id)
        details = result.to_dict() | {"position": str(request.position), "backfillRecords": outcome.backfill_records}
        if renewed:
            details["generation"] = row.generation + 1
        if outcome.lost_records:
            details |= {"lostRecords": outcome.lost_records,
                        "lostRanges": {p: list(r) for p, r in outcome.lost_ranges.items()}}
        # Named for what happened, not for what was asked: a rewind or a jump with nothing to
        # backfill creates no backfill, and the audit, `history` and webhooks must not say so.
        action = "reset-and-backfill" if backfill_id else "reset"
        self._audit(c, row.id, action, actor, f"{request.trigger}: {request.source}", request.reason, details, now)
        c.execute(sa.insert(requests).values(
            token=request.token, supervisor_id=row.id, kind=request.trigger, status="applied",
            result=canonical_json(details), handled_at=now,
        ))
        faults.crash_point("inside-reset", row.id)
        return result

    def _begin_generation(self, c, row, request: ResetRequest, renewed, now) -> None:
        """The rewind of a source that started over begins its new source generation in the reset's
        own transaction, as ``restart_source`` does for the runtime: the offsets below the old
        checkpoints name new records, so ``verify`` tiles the generation apart from where each
        checkpoint now is (read once, never "read again"), and the runtime's next check finds
        this generation without an identity yet and records the one it sees."""
        c.execute(sa.update(checkpoints).where(checkpoints.c.supervisor_id == row.id)
                  .values(first_offset=checkpoints.c.next_offset))
        self._audit(c, row.id, "source-restarted", "reconciler", f"{request.trigger}: {request.source}",
                    f"{request.started_over}; rewound by the reset to read the new records once",
                    {"generation": row.generation + 1,
                     "restartedPartitions": {p: {"checkpoint": r.checkpoint, "new": r.new}
                                             for p, r in sorted(renewed.items())}}, now)

    @staticmethod
    def _next_backfill_id(c, main_id: str) -> str:
        """One past the highest ``<main>-backfill-<n>`` of any kind, skipping taken ids: counting
        children would collide with a spec that took such an id, and again after it is deleted."""
        prefix = f"{main_id}-backfill-"
        taken = set(c.execute(sa.select(supervisors.c.id).where(
            sa.func.substr(supervisors.c.id, 1, len(prefix)) == prefix)).scalars())
        numbers = [int(m["n"]) for t in taken if (m := BACKFILL_ID.match(t)) and m["parent"] == main_id]
        n = max(numbers, default=0) + 1
        while f"{prefix}{n}" in taken:
            n += 1
        return f"{prefix}{n}"

    def _insert_backfill(self, c, main, request: ResetRequest, outcome: ResetOutcome, now) -> str:
        bf_id = self._next_backfill_id(c, main.id)
        doc = json.loads(main.spec)
        doc.pop("backfill", None)
        doc.pop("suspended", None)
        doc.pop("lagPolicy", None)  # a bounded supervisor is never reset: the policy stays the main's
        doc["id"] = bf_id
        if request.backfill_task_count:
            doc["taskCount"] = request.backfill_task_count
        ranges = outcome.backfill_ranges
        c.execute(sa.insert(supervisors).values(
            id=bf_id, kind=Kind.BACKFILL, parent_id=main.id, spec=canonical_json(doc), spec_hash=document_hash(doc),
            spec_path=None, state=State.PENDING, detailed_state=DetailedState.PENDING, epoch=1,
            generation=main.generation,
            start_offsets=json.dumps({p: start for p, (start, _) in ranges.items()}),
            end_offsets=json.dumps({p: end for p, (_, end) in ranges.items()}), created_at=now, updated_at=now,
        ))
        c.execute(sa.insert(checkpoints), [
            {"supervisor_id": bf_id, "partition": p, "next_offset": start, "first_offset": start}
            for p, (start, _) in ranges.items()
        ])
        c.execute(sa.insert(spec_versions).values(supervisor_id=bf_id, spec_hash=document_hash(doc), spec=canonical_json(doc), created_at=now))
        self._audit(c, bf_id, "create-backfill", "reconciler", f"reset of {main.id}", request.reason,
                    {"ranges": {p: list(r) for p, r in ranges.items()}}, now)
        return bf_id

    def record_rejected(self, token: str, supervisor_id: str, kind: str, reason: str, *, actor: str, trigger: str) -> None:
        """A request that cannot be applied (bad marker): recorded once, like an applied one."""
        now = utcnow()
        with self._write() as c:
            if c.execute(sa.select(requests.c.token).where(requests.c.token == token)).first():
                return
            c.execute(sa.insert(requests).values(token=token, supervisor_id=supervisor_id, kind=kind, status="rejected",
                                                 result=json.dumps({"reason": reason}), handled_at=now))
            self._audit(c, supervisor_id, "reject-request", actor, trigger, reason, None, now)

    def request(self, token: str) -> HandledRequest | None:
        with self._read() as c:
            row = c.execute(sa.select(requests).where(requests.c.token == token)).first()
        if row is None:
            return None
        return HandledRequest(row.token, row.supervisor_id, row.kind, row.status,
                              json.loads(row.result) if row.result else {}, _aware(row.handled_at))
