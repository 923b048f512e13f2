"""Write fences: no file is deleted while a process may still commit it.

Every write of files into a table (a batch, a compaction, an import, an expiry's
metadata) is recorded here BEFORE its files are written (``begin_write``). Its commit
moves it from ``writing`` to done in the commit's own transaction (the row is deleted:
``batches`` says what committed). Whoever wants to delete the files of a write that did
not commit (the writer after a lost compare-and-swap or an unknown commit outcome, the
leader's recovery, orphan clean-up) first FENCES it (``fence_write``): ``writing`` ->
``discarded``. A commit of a discarded write fails on its compare-and-swap, so the two
cannot both happen, whatever the timing:

* on PostgreSQL a fence that meets a commit in flight waits for its row lock (the commit
  updated the row first), then sees the outcome: committed -> not fenced, files kept;
* on SQLite the writers serialise.

A ``discarded`` row is kept (a process that lost its connection may still try to
commit it); rows of committed writes are deleted by the commit itself.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from reconciler.errors import PublishConflict
from reconciler.store.base import _aware, utcnow
from reconciler.store.tables import batches, writes

WRITING, DISCARDED = "writing", "discarded"
COMMITTING = "committing"  # a write to an external catalog between its row and the catalog's commit
IN_CHUNK = 500  # ids per IN (...) query: PostgreSQL allows 65,535 parameters, SQLite 250,000 (Debian)


class WriteFenced(PublishConflict):
    """The write was discarded (fenced) before it could commit: its files may be gone."""


@dataclass(frozen=True)
class WriteIntent:
    """A write recorded before its files: who writes what, since when."""

    write_id: str
    kind: str  # batch | compact | import | expire
    status: str  # writing | discarded
    tables: tuple[str, ...]
    supervisor_id: str | None
    holder: str | None
    started_at: datetime | None


def holder() -> str:
    """This process, as recorded on its writes (for an operator reading the table)."""
    return f"{socket.gethostname()}:{os.getpid()}"[:256]


class WritesMixin:
    def begin_write(self, write_id: str, kind: str, *, tables: Sequence[str] = (),
                    supervisor_id: str | None = None, now=None) -> None:
        """Record a write before any of its files exists."""
        with self._write() as c:
            c.execute(sa.insert(writes).values(
                write_id=write_id, kind=kind, status=WRITING, tables=json.dumps(list(tables)),
                supervisor_id=supervisor_id, holder=holder(), started_at=now or utcnow()))

    def fence_write(self, write_id: str, *, lock_timeout: float = 10.0) -> bool:
        """Make sure write ``write_id`` can never commit; True when its files may now be
        deleted. False when it committed, or when nothing says it did not (a write that
        left no row and is a committed batch, or any other kind: its unreferenced files
        are orphan clean-up's to judge).

        On PostgreSQL a commit in flight holds the row: this waits for its outcome, at most
        ``lock_timeout`` seconds (then raises RetryableError: the next recovery decides)."""
        with self._write() as c:
            if c.dialect.name == "postgresql":
                c.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(lock_timeout * 1000)}ms'")
            moved = c.execute(sa.update(writes).where(writes.c.write_id == write_id, writes.c.status == WRITING)
                              .values(status=DISCARDED, finished_at=utcnow())).rowcount
            if moved == 1:
                return True
            status = c.execute(sa.select(writes.c.status).where(writes.c.write_id == write_id)).scalar()
            return status == DISCARDED

    def committing_or_fenced(self, write_id: str, kind: str, *, lock_timeout: float = 10.0) -> bool:
        """After the transaction that records write ``write_id`` as ``committing`` ended
        unknown (``Store.commit_tables``, external): True when it committed (the row says so);
        else the write is fenced now and False. Unlike ``fence_write``, a write without a row
        (a reset's fence records none before that transaction) is recorded as discarded,
        not taken for committed. On PostgreSQL a transaction still in flight holds the row
        (or its key): this waits for its outcome, at most ``lock_timeout`` seconds."""
        with self._write() as c:
            if c.dialect.name == "postgresql":
                c.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(lock_timeout * 1000)}ms'")
            now = utcnow()
            c.execute(_insert_ignore(c, [dict(write_id=write_id, kind=kind, status=DISCARDED, tables="[]",
                                              holder=holder(), started_at=now, finished_at=now)]))
            c.execute(sa.update(writes).where(writes.c.write_id == write_id, writes.c.status == WRITING)
                      .values(status=DISCARDED, finished_at=now))
            status = c.execute(sa.select(writes.c.status).where(writes.c.write_id == write_id)).scalar()
            return status == COMMITTING

    def fence_unknown_writes(self, write_ids: Iterable[str]) -> set[str]:
        """Orphan clean-up's fence: of ``write_ids`` (found as files), those whose files may
        be deleted: discarded ones, and ones nobody recorded that are not a committed batch
        (recorded as discarded here first, so a late commit of them fails). Writes still
        ``writing`` and committed batches are never returned."""
        ids = sorted(set(write_ids))
        out: set[str] = set()
        for i in range(0, len(ids), IN_CHUNK):
            chunk = ids[i:i + IN_CHUNK]
            with self._write() as c:
                known = dict(c.execute(sa.select(writes.c.write_id, writes.c.status)
                                       .where(writes.c.write_id.in_(chunk))).all())
                committed = set(c.execute(sa.select(batches.c.batch_id).where(batches.c.batch_id.in_(chunk)))
                                .scalars())
                unknown = [w for w in chunk if w not in known and w not in committed]
                if unknown:
                    now = utcnow()
                    c.execute(_insert_ignore(c, [dict(write_id=w, kind="unknown", status=DISCARDED, tables="[]",
                                                      holder=holder(), started_at=now, finished_at=now)
                                                 for w in unknown]))
                    # Read back: a writer may have recorded one of them meanwhile.
                    known |= dict(c.execute(sa.select(writes.c.write_id, writes.c.status)
                                            .where(writes.c.write_id.in_(unknown))).all())
                out |= {w for w in chunk if known.get(w) == DISCARDED}
        return out

    def write_statuses(self, write_ids: Iterable[str]) -> dict[str, str]:
        """``writing`` | ``discarded`` | ``committed`` (a committed batch) for the ids known."""
        ids = sorted(set(write_ids))
        out: dict[str, str] = {}
        for i in range(0, len(ids), IN_CHUNK):
            chunk = ids[i:i + IN_CHUNK]
            with self._read() as c:
                out.update(dict(c.execute(sa.select(writes.c.write_id, writes.c.status)
                                          .where(writes.c.write_id.in_(chunk))).all()))
                out.update({b: "committed" for b in c.execute(
                    sa.select(batches.c.batch_id).where(batches.c.batch_id.in_(chunk))).scalars()})
        return out

    def writes_in_flight(self) -> list[WriteIntent]:
        """Writes recorded and neither committed nor discarded (the leader's recovery fences them)."""
        with self._read() as c:
            rows = c.execute(sa.select(writes).where(writes.c.status == WRITING).order_by(writes.c.started_at)).all()
        return [_intent(r) for r in rows]

    def discarded_writes(self, *, limit: int = 1000) -> list[WriteIntent]:
        with self._read() as c:
            rows = c.execute(sa.select(writes).where(writes.c.status == DISCARDED)
                             .order_by(writes.c.started_at.desc()).limit(limit)).all()
        return [_intent(r) for r in rows]

    @staticmethod
    def _finish_write(c, write_id: str, kind: str, *, supervisor_id: str | None = None) -> None:
        """Inside a commit's transaction: the write must still be ``writing`` (a write nobody
        recorded is recorded now, so a fence that came first wins on the primary key)."""
        c.execute(_insert_ignore(c, [dict(write_id=write_id, kind=kind, status=WRITING, tables="[]",
                                          supervisor_id=supervisor_id, holder=holder(), started_at=utcnow())]))
        done = c.execute(sa.delete(writes).where(writes.c.write_id == write_id, writes.c.status == WRITING)).rowcount
        if done != 1:
            raise WriteFenced(f"{kind} {write_id} was discarded before it could commit (a clean-up fenced it); "
                              "nothing was committed")


def _insert_ignore(c, rows: list[dict]):
    """INSERT ... ON CONFLICT DO NOTHING, in the dialect at hand."""
    insert = pg_insert if c.dialect.name == "postgresql" else sqlite_insert
    return insert(writes).values(rows).on_conflict_do_nothing(index_elements=["write_id"])


def _intent(r) -> WriteIntent:
    return WriteIntent(r.write_id, r.kind, r.status, tuple(json.loads(r.tables or "[]")), r.supervisor_id, r.holder,
                       _aware(r.started_at))


