"""Issue 41.12: what a commit unreferences (a metadata file 10 versions back, a compaction's
inputs 25-30 commits later) is deleted only ``readerGrace`` after that commit, so a reader
pinned to an older metadata file (DuckDB's ``iceberg_scan(<metadata file>)``, a long Trino
query) can still read it; then it goes, by the same path. Issue 41.13: a staging names the
write its caller recorded, or is refused. Real Store and Tables (SQLite and PostgreSQL)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest
from pyiceberg.table import StaticTable

from reconciler.table import catalog as cat
from reconciler.table import reach
from reconciler.table.compact import compact
from reconciler.table.orphans import remove_orphans
from tests.table.test_retention_races import FAR, KEPT, SCHEMA, _publish
from tests.table.test_retention_races import env as _env  # noqa: F401  (the fixture, reused)

GRACE = 600.0


class Clock:
    """The retiring process's clock, moved by the test (a real grace would make it slow)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def env(_env):
    store, tables = _env
    tables = cat.Tables(store.engine, tables.warehouse, snapshots_kept=KEPT, reader_grace=GRACE)
    tables.retired.clock = Clock()
    return store, tables


def _later() -> datetime:
    return datetime.now(UTC) + timedelta(seconds=GRACE + 60)


def _live(path: str) -> bool:
    return os.path.exists(cat.local_path(path))


def _pinned_rows(location: str) -> int:
    """What a reader holding only the metadata file's location reads (DuckDB's recipe)."""
    return StaticTable.from_metadata(location).scan().to_arrow().num_rows


def test_a_reader_pinned_to_an_old_version_reads_it_within_the_grace_and_it_goes_after(env):
    store, tables = env
    _publish(store, tables, 0, 10)
    pinned = tables.current("clicks").metadata_location
    first_files = {t.file.file_path for t in tables.current("clicks").scan().plan_files()}
    _publish(store, tables, 10, 20)
    compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR, target_file_size=1 << 30)
    for n in range(2, 2 + 16):  # the pinned version leaves the metadata log, its snapshot expires
        _publish(store, tables, n * 10, n * 10 + 10)
    table = tables.current("clicks")
    assert pinned not in {e.metadata_file for e in table.metadata.metadata_log}
    assert table.metadata.snapshot_by_id(StaticTable.from_metadata(pinned).metadata.current_snapshot_id) is None
    live_now = {t.file.file_path for t in table.scan().plan_files()}
    assert first_files - live_now, "the compaction replaced the first batch's file"
    tables.retired.clock.now += GRACE - 1  # not yet
    # Within the grace: the metadata file, the compaction's input and everything the old version needs.
    assert _live(pinned) and all(_live(f) for f in first_files)
    assert _pinned_rows(pinned) == 10
    reach._LISTS._data.clear()
    result = remove_orphans(tables, "clicks", store=store, older_than=timedelta(0))
    assert pinned not in result.deleted_files and not (first_files & set(result.deleted_files))
    assert _pinned_rows(pinned) == 10 and _live(pinned)
    _publish(store, tables, 180, 190)
    assert _live(pinned)
    tables.retired.clock.now += 2  # the grace has passed: the next commit deletes what is due
    _publish(store, tables, 190, 200)
    assert not _live(pinned) and not any(_live(f) for f in first_files - live_now)
    assert tables.current("clicks").scan().to_arrow().num_rows == 200  # the table itself lost nothing


def test_orphan_clean_up_releases_an_old_version_once_the_grace_has_passed(env):
    store, tables = env
    _publish(store, tables, 0, 10)
    pinned = tables.current("clicks").metadata_location
    for n in range(1, 14):
        _publish(store, tables, n * 10, n * 10 + 10)
    fresh = cat.Tables(store.engine, tables.warehouse, snapshots_kept=KEPT, reader_grace=GRACE)  # another process
    reach._LISTS._data.clear()
    kept = remove_orphans(fresh, "clicks", store=store, older_than=timedelta(0))
    assert pinned not in kept.deleted_files and _live(pinned)
    # The process that retired it is gone: once the grace has passed, orphan clean-up deletes it.
    reach._LISTS._data.clear()
    gone = remove_orphans(fresh, "clicks", store=store, older_than=timedelta(0), now=_later())
    assert os.path.abspath(cat.local_path(pinned)) in gone.deleted_files and not _live(pinned)
    assert fresh.current("clicks").scan().to_arrow().num_rows == 140


def test_without_a_grace_superseded_files_go_at_once(env):
    store, tables = env
    now = cat.Tables(store.engine, tables.warehouse, snapshots_kept=KEPT, reader_grace=0)
    _publish(store, now, 0, 10)
    pinned = now.current("clicks").metadata_location
    for n in range(1, 13):
        _publish(store, now, n * 10, n * 10 + 10)
    assert not _live(pinned) and now.retired.pending() == []


def test_a_staging_without_the_write_id_its_caller_recorded_is_refused(env):
    _, tables = env
    with pytest.raises(TypeError):
        tables.stage("clicks", lambda tx: None)  # noqa - the id is mandatory
    with pytest.raises(TypeError):
        tables.stage_append("clicks", [], {})
    with pytest.raises(ValueError, match="not a recorded write id"):
        tables.stage("clicks", lambda tx: None, write_id=None)
