"""The store's plumbing: the engine, one transaction per public method, migrations, and
the helpers every aggregate shares (times in UTC, short error texts).

Writers on SQLite take the write lock at ``BEGIN`` (see ``engine.py``); on PostgreSQL they
run under READ COMMITTED and lock the supervisor row (``FOR UPDATE``) where they
read-then-write, so a publish and a reset of the same supervisor serialise and the loser
of a compare-and-swap sees 0 rows updated and raises ``PublishConflict``.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import exc as sa_exc

from reconciler import faults
from reconciler.errors import CommitOutcomeUnknown, RetryableError
from reconciler.store.engine import create_engine

MIGRATIONS = Path(__file__).parent / "migrations"


def utcnow() -> datetime:
    return datetime.now(UTC)


def _aware(ts: datetime | None) -> datetime | None:
    if ts is None or ts.tzinfo is not None:
        return ts
    return ts.replace(tzinfo=UTC)  # SQLite returns naive datetimes; we only ever write UTC


class StoreBase:
    """The engine and the transaction helpers the aggregates' mixins share."""

    def __init__(self, url: str):
        self.url = url
        self.engine = create_engine(url)
        self._pinned = threading.local()  # the connection of a ``snapshot``, per thread

    def close(self) -> None:
        self.engine.dispose()

    # -- plumbing ---------------------------------------------------------------------

    @contextmanager
    def _write(self):
        """One write transaction. A failure before COMMIT rolled everything back
        (RetryableError); a failure of the COMMIT itself (a connection dropped after it was
        sent) leaves the outcome unknown (CommitOutcomeUnknown): the caller must not guess.

        ``faults.commit_point`` is the schedule explorer's seam: it may fail either side of
        the COMMIT, or take the open transaction over and commit it later from another
        thread, as a server does when the client's connection dropped mid-COMMIT."""
        try:
            conn = self.engine.connect()
        except sa_exc.OperationalError as exc:
            raise RetryableError(f"database unavailable or busy: {_short(exc)}") from exc
        owned = True
        try:
            trans = conn.begin()
            try:
                yield conn
            except BaseException:
                try:
                    trans.rollback()
                except sa_exc.SQLAlchemyError:  # a dead connection: the server rolls back itself
                    pass
                raise
            try:
                if faults.commit_point("before", (conn, trans)):
                    owned = False  # the explorer commits it later: the outcome is unknown here
                    raise CommitOutcomeUnknown("database connection lost while committing (outcome unknown)")
                trans.commit()
                faults.commit_point("after")
            except sa_exc.OperationalError as exc:
                raise CommitOutcomeUnknown(f"database connection failed while committing: {_short(exc)}") from exc
        except sa_exc.OperationalError as exc:
            raise RetryableError(f"database unavailable or busy: {_short(exc)}") from exc
        finally:
            if owned:
                conn.close()

    @contextmanager
    def snapshot(self):
        """The reads of this thread inside see one moment of the database: ``status`` reads the
        checkpoints and the batch totals in two queries, and a publish between them showed the lag
        from before it beside the records from after it. PostgreSQL's READ COMMITTED gives each
        statement its own snapshot, so the transaction is REPEATABLE READ there; SQLite's (WAL)
        read transaction already is one snapshot."""
        if getattr(self._pinned, "conn", None) is not None:
            yield
            return
        level = {"isolation_level": "REPEATABLE READ"} if self.engine.dialect.name == "postgresql" else {}
        with self._read(**level) as conn:
            self._pinned.conn = conn
            try:
                yield
            finally:
                self._pinned.conn = None

    @contextmanager
    def _read(self, **options):
        pinned = getattr(self._pinned, "conn", None)
        if pinned is not None:  # inside ``snapshot``: its transaction, not a newer moment
            yield pinned
            return
        try:
            with self.engine.connect().execution_options(readonly=True, **options) as conn, conn.begin():
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


def _short(exc: Exception) -> str:
    return str(getattr(exc, "orig", exc)).splitlines()[0][:300]
