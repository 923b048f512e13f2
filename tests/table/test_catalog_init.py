"""Opening the catalog on a fresh database while another connection writes (a daemon's
first batch beside its lease renewal) waits for the writer instead of failing with
SQLite's "database is locked"."""

from __future__ import annotations

import threading
import time

import sqlalchemy as sa

from reconciler.store.store import Store
from reconciler.table import catalog as cat


def test_catalog_tables_are_created_behind_a_concurrent_writer(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'reconciler.db'}")
    store.migrate()
    holding, release = threading.Event(), threading.Event()

    def writer():
        with store.engine.begin() as c:  # BEGIN IMMEDIATE: holds the write lock
            c.execute(sa.text("CREATE TABLE busy (x INTEGER)"))
            holding.set()
            release.wait(5)
            time.sleep(0.3)  # the catalog is opening meanwhile
            c.execute(sa.text("INSERT INTO busy VALUES (1)"))

    t = threading.Thread(target=writer)
    t.start()
    try:
        assert holding.wait(5)
        release.set()
        tables = cat.Tables(store.engine, tmp_path / "segments")  # waited, not failed
    finally:
        t.join(10)
    assert tables.names() == []
    with store.engine.connect() as c:
        names = {r[0] for r in c.execute(sa.text("SELECT name FROM sqlite_master WHERE type = 'table'"))}
    assert {"iceberg_tables", "iceberg_namespace_properties", "busy"} <= names
    store.close()
