"""Engine construction: SQLite in WAL mode with ``BEGIN IMMEDIATE``, or PostgreSQL.

SQLite's deferred ``BEGIN`` under contention gives ``SQLITE_BUSY`` storms when two
writers upgrade their read locks; taking the write lock at ``BEGIN`` serialises
writers cleanly behind ``busy_timeout``. Read-only connections (execution option
``readonly=True``) keep a deferred ``BEGIN`` so status queries never wait on a publish.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy import event


def create_engine(url: str) -> sa.Engine:
    if url.startswith("sqlite"):
        return _sqlite_engine(url)
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return sa.create_engine(url, pool_pre_ping=True, isolation_level="READ COMMITTED")


def _sqlite_engine(url: str) -> sa.Engine:
    db = sa.engine.make_url(url).database
    if db and db != ":memory:":
        Path(db).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None  # we issue BEGIN ourselves, below
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA busy_timeout=30000")
        _enable_wal(cur)
        cur.execute("PRAGMA synchronous=FULL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        mode = "DEFERRED" if conn.get_execution_options().get("readonly") else "IMMEDIATE"
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


def _enable_wal(cur, patience: float = 30.0) -> None:
    """Switch a database to WAL once (the mode is persistent).

    Switching needs an exclusive lock, and SQLite answers "locked" at once, without its
    busy handler, when two processes open a brand-new database together (the daemon and
    a CLI command, or two daemons): retry for a while instead of failing the start.
    """
    deadline = time.monotonic() + patience
    while True:
        try:
            if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
