"""The metadata store: every SQL statement of the product lives in this module.

Each public method is one transaction. Writers on SQLite take the write lock at
``BEGIN`` (see ``engine.py``); on PostgreSQL they run under READ COMMITTED and lock
the supervisor row (``FOR UPDATE``) where they read-then-write, so a publish and a
reset of the same supervisor serialise and the loser of a compare-and-swap sees
0 rows updated and raises ``PublishConflict``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from reconciler import faults
from reconciler.control.actual import (
    ActualState,
    DetailedState,
    Kind,
    Override,
    State,
    SupervisorRecord,
)
from reconciler.control.requests import ResetRequest
from reconciler.control.resets import ResetOutcome, fill_missing
from reconciler.errors import PermanentError, PublishConflict, RetryableError
from reconciler.model import (
    BACKFILL_ID,
    PartitionRange,
    SupervisorSpec,
    canonical_json,
    document_hash,
)
from reconciler.spec import secrets
from reconciler.store.engine import create_engine
from reconciler.store.freshness import FreshnessStore
from reconciler.store.records import (
    AuditEntry,
    BatchTotals,
    DaemonBeat,
    HandledRequest,
    Lease,
    SegmentRow,
)
from reconciler.store.tables import (
    audit_log,
    batches,
    checkpoints,
    iceberg_tables,
    leases,
    overrides,
    requests,
    segments,
    spec_versions,
    supervisors,
)

MIGRATIONS = Path(__file__).parent / "migrations"


TABLE_CATALOG, TABLE_NAMESPACE = "reconciler", "default"  # reconciler.table.catalog's names


class TableConflict(RetryableError):
    """A table's metadata pointer moved since the commit was staged (another batch of
    the same datasource, a compaction): nothing was published; stage again and retry."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def _aware(ts: datetime | None) -> datetime | None:
    if ts is None or ts.tzinfo is not None:
        return ts
    return ts.replace(tzinfo=UTC)  # SQLite returns naive datetimes; we only ever write UTC


@dataclass(frozen=True)
class SegmentFile:
    """One committed Parquet file, as the pipeline reports it to publish."""

    segment: str
    interval_start: str
    interval_end: str
    path: str
    rows: int
    bytes: int


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


class Store(FreshnessStore):
    """Actual state: supervisors, checkpoints, batches, segments, audit log, tokens, leases
    (and, from ``FreshnessStore``, lag observations and webhook cursors)."""

    def __init__(self, url: str):
        self.url = url
        self.engine = create_engine(url)

    def close(self) -> None:
        self.engine.dispose()

    # -- plumbing ---------------------------------------------------------------------

    @contextmanager
    def _write(self):
        try:
            with self.engine.begin() as conn:
                yield conn
        except sa_exc.OperationalError as exc:
            raise RetryableError(f"database unavailable or busy: {_short(exc)}") from exc

    @contextmanager
    def _read(self):
        try:
            with self.engine.connect().execution_options(readonly=True) as conn, conn.begin():
                yield conn
        except sa_exc.OperationalError as exc:
            raise RetryableError(f"database unavailable or busy: {_short(exc)}") from exc

    def migrate(self) -> str:
        """Bring the schema to the newest revision (idempotent); returns the revision."""
        from alembic import command  # here, not at the top: commands that only read start faster
        from alembic.config import Config

        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS))
        try:
            with self.engine.begin() as conn:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
                return conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar_one()
        except sa_exc.OperationalError as exc:
            raise RetryableError(f"cannot migrate the database: {_short(exc)}") from exc

    def revision(self) -> str | None:
        """The schema revision, or None for a database that was never migrated."""
        with self._read() as c:
            # SQLite reports a missing table as an OperationalError, which _read turns
            # into "database unavailable": ask the catalogue first instead.
            if not sa.inspect(c).has_table("alembic_version"):
                return None
            return c.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()

    # -- reading the actual state -------------------------------------------------------

    def read_actual(self) -> ActualState:
        with self._read() as c:
            sups = {r.id: _record(r) for r in c.execute(sa.select(supervisors))}
            tokens = frozenset(c.execute(sa.select(requests.c.token)).scalars())
            cps: dict[str, dict[str, int]] = {}
            for sid, p, o in c.execute(sa.select(checkpoints)):
                cps.setdefault(sid, {})[p] = int(o)
            held = {r.supervisor_id: Override(r.supervisor_id, r.kind, r.reason, r.actor, _aware(r.at))
                    for r in c.execute(sa.select(overrides))}
        return ActualState(supervisors=sups, handled_tokens=tokens, checkpoints=cps, overrides=held)

    # -- operator control (overrides of the file, bounded supervisors) -----------------------

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
            row = c.execute(sa.select(supervisors).where(supervisors.c.id == backfill_id)).first()
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

    def checkpoints(self, supervisor_id: str) -> dict[str, int]:
        with self._read() as c:
            rows = c.execute(
                sa.select(checkpoints.c.partition, checkpoints.c.next_offset).where(
                    checkpoints.c.supervisor_id == supervisor_id
                )
            )
            return {p: int(o) for p, o in rows}

    # -- lifecycle writes (apply) -------------------------------------------------------

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
        c.execute(sa.delete(checkpoints).where(checkpoints.c.supervisor_id == supervisor_id))
        self._audit(c, supervisor_id, "fresh-start", actor, path, change, {"droppedCheckpoints": old}, now)

    # -- checkpoints ------------------------------------------------------------------

    def init_checkpoints(self, supervisor_id: str, offsets: Mapping[str, int]) -> dict[str, int]:
        """Insert checkpoints for partitions that have none (startFrom); returns all of them."""
        with self._write() as c:
            have = self._checkpoints(c, supervisor_id)
            missing = {p: o for p, o in offsets.items() if p not in have}
            if missing:
                c.execute(sa.insert(checkpoints), [
                    {"supervisor_id": supervisor_id, "partition": p, "next_offset": int(o)} for p, o in missing.items()
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

    # -- publish (compare-and-swap) ----------------------------------------------------------

    def publish(self, *, supervisor_id: str, epoch: int, batch_id: str, datasource: str,
                ranges: Sequence[PartitionRange], files: Iterable[SegmentFile], records: int,
                unparseable: int, lease: tuple[str, int] | None = None, now=None,
                table_commits: Sequence[Any] = ()) -> None:
        """Commit a batch's table snapshots and move its checkpoints, or nothing.

        ``table_commits`` (``reconciler.table.catalog.TableCommit``: table, expected, new)
        move each table's metadata pointer with a compare-and-swap on its current
        location, in this transaction: readers see the batch's rows exactly when the
        checkpoints move. Raises PublishConflict when the supervisor's epoch changed
        (reset, terminate, recreate), any checkpoint is no longer at its range's start, or
        the lease (holder, token) is no longer ours; TableConflict when a table moved since
        its commit was staged (nothing is published: stage again).
        """
        now = now or utcnow()
        files = list(files)
        with self._write() as c:
            if lease is not None:
                self._check_lease(c, *lease)
            hit = c.execute(
                sa.update(supervisors).where(supervisors.c.id == supervisor_id, supervisors.c.epoch == epoch)
                .values(updated_at=now)
            ).rowcount
            if hit != 1:
                raise PublishConflict(f"{supervisor_id}: epoch is no longer {epoch} (reset, recreate or terminate); batch {batch_id} discarded")
            for rng in ranges:
                moved = c.execute(
                    sa.update(checkpoints).where(
                        checkpoints.c.supervisor_id == supervisor_id,
                        checkpoints.c.partition == rng.partition,
                        checkpoints.c.next_offset == rng.start,
                    ).values(next_offset=rng.end)
                ).rowcount
                if moved != 1:
                    raise PublishConflict(
                        f"{supervisor_id}: partition {rng.partition} checkpoint is no longer {rng.start}; batch {batch_id} discarded"
                    )
            for tc in table_commits:
                moved = c.execute(
                    sa.update(iceberg_tables).where(
                        iceberg_tables.c.catalog_name == TABLE_CATALOG,
                        iceberg_tables.c.table_namespace == TABLE_NAMESPACE,
                        iceberg_tables.c.table_name == tc.table,
                        iceberg_tables.c.metadata_location == tc.expected,
                    ).values(metadata_location=tc.new, previous_metadata_location=tc.expected)
                ).rowcount
                if moved != 1:
                    raise TableConflict(f"table {tc.table} changed since batch {batch_id} was staged")
            c.execute(sa.insert(batches).values(
                batch_id=batch_id, supervisor_id=supervisor_id, datasource=datasource, epoch=epoch,
                status="committed", ranges=json.dumps([[r.partition, r.start, r.end] for r in ranges]),
                rows=sum(f.rows for f in files), records=records, unparseable=unparseable, committed_at=now,
            ))
            if files:
                c.execute(sa.insert(segments), [
                    dict(datasource=datasource, supervisor_id=supervisor_id, batch_id=batch_id, segment=f.segment,
                         interval_start=f.interval_start, interval_end=f.interval_end, path=f.path, rows=f.rows,
                         bytes=f.bytes, created_at=now)
                    for f in files
                ])

    def committed_batch_ids(self, batch_ids: Iterable[str]) -> set[str]:
        ids = list(batch_ids)
        if not ids:
            return set()
        with self._read() as c:
            return set(c.execute(sa.select(batches.c.batch_id).where(batches.c.batch_id.in_(ids))).scalars())

    def batch_totals(self, supervisor_id: str) -> BatchTotals:
        with self._read() as c:
            row = c.execute(sa.select(
                sa.func.count(), sa.func.coalesce(sa.func.sum(batches.c.records), 0),
                sa.func.coalesce(sa.func.sum(batches.c.unparseable), 0), sa.func.min(batches.c.committed_at),
                sa.func.max(batches.c.committed_at),
            ).where(batches.c.supervisor_id == supervisor_id)).one()
        return BatchTotals(int(row[0]), int(row[1]), int(row[2]), _aware(row[3]), _aware(row[4]))

    def all_batch_totals(self) -> dict[str, BatchTotals]:
        """``batch_totals`` of every supervisor with batches, in one query (``status`` of a thousand)."""
        with self._read() as c:
            rows = c.execute(sa.select(
                batches.c.supervisor_id, sa.func.count(), sa.func.coalesce(sa.func.sum(batches.c.records), 0),
                sa.func.coalesce(sa.func.sum(batches.c.unparseable), 0), sa.func.min(batches.c.committed_at),
                sa.func.max(batches.c.committed_at),
            ).group_by(batches.c.supervisor_id)).all()
        return {r[0]: BatchTotals(int(r[1]), int(r[2]), int(r[3]), _aware(r[4]), _aware(r[5])) for r in rows}

    def segments(self, datasource: str) -> list[SegmentRow]:
        with self._read() as c:
            rows = c.execute(
                sa.select(segments, batches.c.ranges).join(batches, batches.c.batch_id == segments.c.batch_id)
                .where(segments.c.datasource == datasource).order_by(segments.c.interval_start, segments.c.id)
            ).mappings().all()
        return [SegmentRow(**r) for r in rows]

    # -- reset and backfill -----------------------------------------------------------------

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
        current = self._checkpoints(c, request.supervisor_id)
        filled = fill_missing(current, earliest if earliest is not None else initial, initial)
        missing = {p: o for p, o in filled.items() if p not in current}
        if missing:
            c.execute(sa.insert(checkpoints), [
                {"supervisor_id": row.id, "partition": p, "next_offset": int(o)} for p, o in missing.items()
            ])
            current.update(missing)
        outcome = compute(current)
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
        c.execute(sa.update(supervisors).where(supervisors.c.id == row.id).values(**values))
        result = ResetResult(row.id, request.token, outcome, backfill_id)
        details = result.to_dict() | {"position": str(request.position), "backfillRecords": outcome.backfill_records}
        if outcome.lost_records:
            details |= {"lostRecords": outcome.lost_records,
                        "lostRanges": {p: list(r) for p, r in outcome.lost_ranges.items()}}
        self._audit(c, row.id, request.action_kind, actor, f"{request.trigger}: {request.source}", request.reason, details, now)
        c.execute(sa.insert(requests).values(
            token=request.token, supervisor_id=row.id, kind=request.trigger, status="applied",
            result=canonical_json(details), handled_at=now,
        ))
        faults.crash_point("inside-reset", row.id)
        return result

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
            start_offsets=json.dumps({p: start for p, (start, _) in ranges.items()}),
            end_offsets=json.dumps({p: end for p, (_, end) in ranges.items()}), created_at=now, updated_at=now,
        ))
        c.execute(sa.insert(checkpoints), [
            {"supervisor_id": bf_id, "partition": p, "next_offset": start} for p, (start, _) in ranges.items()
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

    # -- audit -----------------------------------------------------------------------

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

    @staticmethod
    def _version(c, spec: SupervisorSpec, now) -> None:
        c.execute(sa.insert(spec_versions).values(
            supervisor_id=spec.id, spec_hash=spec.spec_hash, spec=canonical_json(spec.document), created_at=now
        ))

    # -- leader lease -----------------------------------------------------------------

    def acquire_lease(self, holder: str, ttl: float, *, name: str = "leader", now=None) -> int | None:
        """Take or renew the lease; returns our fencing token, or None while another holds it."""
        now = now or utcnow()
        expires = now + timedelta(seconds=ttl)
        try:
            with self._write() as c:
                row = c.execute(sa.select(leases).where(leases.c.name == name).with_for_update()).first()
                if row is None:
                    c.execute(sa.insert(leases).values(name=name, holder=holder, token=1, expires_at=expires))
                    return 1
                if row.holder == holder and _aware(row.expires_at) > now:
                    c.execute(sa.update(leases).where(leases.c.name == name).values(expires_at=expires))
                    return int(row.token)
                if _aware(row.expires_at) <= now:
                    token = int(row.token) + 1
                    c.execute(sa.update(leases).where(leases.c.name == name).values(holder=holder, token=token, expires_at=expires))
                    return token
                return None
        except sa_exc.IntegrityError:
            return None  # another daemon inserted the first lease at the same moment

    def release_lease(self, holder: str, *, name: str = "leader") -> None:
        with self._write() as c:
            c.execute(sa.update(leases).where(leases.c.name == name, leases.c.holder == holder).values(expires_at=utcnow()))

    def lease(self, *, name: str = "leader") -> Lease | None:
        with self._read() as c:
            row = c.execute(sa.select(leases).where(leases.c.name == name)).first()
        return Lease(row.name, row.holder, int(row.token), _aware(row.expires_at)) if row else None

    # Daemon heartbeats share the leases table: name "daemon:<holder>", the holder
    # column holds the daemon's role ("leader" or "standby"), token is unused (0).

    def heartbeat(self, holder: str, role: str, ttl: float, *, now=None) -> None:
        """Record that daemon ``holder`` is alive as ``role`` until now + ttl (for ``reconciler status``)."""
        now = now or utcnow()
        name = f"daemon:{holder}"[:128]
        with self._write() as c:
            hit = c.execute(sa.update(leases).where(leases.c.name == name)
                            .values(holder=role, expires_at=now + timedelta(seconds=ttl))).rowcount
            if not hit:
                c.execute(sa.insert(leases).values(name=name, holder=role, token=0,
                                                   expires_at=now + timedelta(seconds=ttl)))
            # heartbeats of daemons gone for a day (SIGKILL, power cut) are forgotten
            c.execute(sa.delete(leases).where(leases.c.name.like("daemon:%"),
                                              leases.c.expires_at < now - timedelta(days=1)))

    def forget_daemon(self, holder: str) -> None:
        with self._write() as c:
            c.execute(sa.delete(leases).where(leases.c.name == f"daemon:{holder}"[:128]))

    def daemons(self, *, now=None) -> list[DaemonBeat]:
        """Live daemons (heartbeat not expired), leader first."""
        now = now or utcnow()
        with self._read() as c:
            rows = c.execute(sa.select(leases).where(leases.c.name.like("daemon:%"))).mappings().all()
        live = [DaemonBeat(r["name"][len("daemon:"):], r["holder"], _aware(r["expires_at"]))
                for r in rows if _aware(r["expires_at"]) > now]
        return sorted(live, key=lambda d: (d.role != "leader", d.daemon))

    @staticmethod
    def _check_lease(c, holder: str, token: int) -> None:
        row = c.execute(sa.select(leases).where(leases.c.name == "leader").with_for_update(read=True)).first()
        if row is None or row.holder != holder or int(row.token) != token or _aware(row.expires_at) <= utcnow():
            raise PublishConflict(f"leader lease lost by {holder} (token {token}); publish fenced")


def _audit_entry(r) -> AuditEntry:
    return AuditEntry(**{**r, "at": _aware(r["at"]), "details": json.loads(r["details"]) if r["details"] else None})


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
        created_at=_aware(r.created_at), updated_at=_aware(r.updated_at),
    )


def _short(exc: Exception) -> str:
    return str(getattr(exc, "orig", exc)).splitlines()[0][:300]
