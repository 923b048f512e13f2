"""Issue 41.12: what a commit unreferences (a metadata file 10 versions back, a compaction's
inputs 25-30 commits later) is deleted only ``readerGrace`` after that commit, so a reader
pinned to an older metadata file (DuckDB's ``iceberg_scan(<metadata file>)``, a long Trino
query) can still read it; then it goes, by the same path. Issue 41.13: a staging names the
write its caller recorded, or is refused. Real Store and Tables (SQLite and PostgreSQL).

From the review of d850ed2: with ``snapshotsKept`` below 10 a version among the last 10
lost its snapshot's files (expired by the publish's own expiry, or by ``maintain``); orphan
clean-up's bound on each held version was quadratic in the metadata files and read every
held one on every run; a negative ``readerGrace`` was taken; the retired files waited for a
commit however long none came, without bound."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta

import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import StaticTable

from reconciler import settings
from reconciler.errors import PermanentError
from reconciler.table import catalog as cat
from reconciler.table import grace, reach
from reconciler.table.compact import compact
from reconciler.table.expire import expire_snapshots
from reconciler.table.orphans import remove_orphans
from tests.table.test_retention_races import FAR, KEPT, _publish
from tests.table.test_retention_races import env as _env  # noqa: F401  (the fixture, reused)

GRACE = 600.0


class Clock:
    """The retiring process's clock, moved by the test (a real grace would make it slow)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def env(_env):  # noqa: F811 - wraps the imported fixture
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


def test_the_readers_bound_in_orphan_clean_up_is_not_quadratic_in_the_metadata_files():
    # For every metadata file on storage, the oldest file of a version two or more later was
    # found by a scan of all of them: at one commit a second and readerGrace 6h (21,600
    # files) about half a minute per table per orphan run.
    # 12,000 metadata files: 3.3 h of one-second commits kept by a grace of that length.
    # All old enough to be released, so no metadata file is read: only the bound is timed.
    n = 12_000
    listed = {f"/w/t/metadata/{v:05d}-x.metadata.json": (1_000.0 + v, 10) for v in range(n)}
    started = time.perf_counter()
    held = grace.held_by_readers(PyArrowFileIO(), listed, 10.0**9, 600.0,
                                 f"/w/t/metadata/{n - 1:05d}-x.metadata.json")
    took = time.perf_counter() - started
    assert len(held) == 2  # the two newest (nothing later bounds them)
    # A sort and a suffix minimum take milliseconds; the nested scan takes ~9 s here.
    assert took < 3.0, f"held_by_readers took {took:.1f}s for {n} metadata files"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_version_among_the_last_ten_stays_readable_with_few_snapshots_kept(env):
    # With snapshotsKept below ~10 the publish's own expiry retired the pinned version's
    # snapshot files while its metadata file was still in the 10-entry log; on a table
    # committing less often than readerGrace they were deleted at the next commit.
    store, tables = env  # snapshotsKept 3, readerGrace 600 s on a clock the test moves
    _publish(store, tables, 0, 10)
    pinned = tables.current("clicks").metadata_location  # DuckDB's iceberg_scan('<this file>')
    for n in range(1, 10):  # a table committing every 11 minutes (taskDuration 11m, a quiet topic)
        tables.retired.clock.now += GRACE + 60
        _publish(store, tables, n * 10, n * 10 + 10)
    log = [e.metadata_file for e in tables.current("clicks").metadata.metadata_log]
    assert pinned in log  # still among the last 10 versions: the README says it may be held
    assert StaticTable.from_metadata(pinned).scan().to_arrow().num_rows == 10


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_maintain_expires_no_snapshot_a_version_of_the_metadata_log_holds(env):
    store, tables = env
    tables = cat.Tables(store.engine, tables.warehouse, snapshots_kept=0, reader_grace=GRACE)  # no publish expires
    tables.retired.clock = Clock()
    for n in range(13):
        _publish(store, tables, n * 10, n * 10 + 10)
    pinned = tables.current("clicks").metadata.metadata_log[2].metadata_file  # 8 versions back
    rows = _pinned_rows(pinned)
    result = expire_snapshots(tables, "clicks", store=store, older_than=timedelta(0), retain_last=1)
    assert result.committed and result.expired_snapshots == 2, result.message  # those out of the log only
    assert "orphan clean-up" in result.message  # ``maintain`` exits before the grace: who deletes them
    tables.retired.clock.now += GRACE + 1
    _publish(store, tables, 130, 140)  # deletes what the expiry retired
    assert pinned in {e.metadata_file for e in tables.current("clicks").metadata.metadata_log}
    assert _pinned_rows(pinned) == rows


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_orphan_clean_up_reads_a_held_metadata_file_once(env, tmp_path):
    store, tables = env
    for n in range(12):
        _publish(store, tables, n * 10, n * 10 + 10)
    table = tables.current("clicks")
    folder = cat.local_path(table.metadata_location).parent
    listed = {str(p): (p.stat().st_mtime, p.stat().st_size) for p in folder.glob("*.metadata.json")}
    reads: list[str] = []

    class Counting(PyArrowFileIO):
        def new_input(self, location):
            if location.endswith(".metadata.json"):
                reads.append(location)
            return super().new_input(location)

    first = grace.held_by_readers(Counting(), listed, time.time(), GRACE, table.metadata_location)
    assert len(listed) > 10 and _norm(table.metadata_location) in first
    reads.clear()
    again = grace.held_by_readers(Counting(), listed, time.time(), GRACE, table.metadata_location)
    assert again == first and reads == []  # a metadata file is never rewritten: read once


def _norm(path: str) -> str:
    return os.path.abspath(cat.local_path(path))


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_retired_files_go_at_the_maintenance_tick_when_nothing_commits(env):
    store, tables = env
    for n in range(14):  # metadata files fall out of the log: retired for the grace
        _publish(store, tables, n * 10, n * 10 + 10)
    waiting = tables.retired.pending()
    assert waiting and all(_live(f) for f in waiting)
    tables.retired.clock.now += GRACE + 1  # no commit after this
    remove_orphans(tables, "clicks", store=store)
    assert tables.retired.pending() == [] and not any(_live(f) for f in waiting)


def test_the_files_held_for_the_grace_are_bounded_and_the_oldest_left_to_orphan_clean_up():
    deleted: list[str] = []
    retired = grace.Retired(GRACE, deleted.extend, clock=lambda: 0.0, limit=5)
    for n in range(4):
        retired.retire([f"f{n}a", f"f{n}b", f"f{n}c"], now=float(n))
        assert len(retired.pending()) <= 5
    assert retired.pending() == ["f3a", "f3b", "f3c"] and deleted == []  # forgotten, never deleted early
    retired.retire(now=3 + GRACE)
    assert deleted == ["f3a", "f3b", "f3c"] and retired.pending() == []


def test_a_negative_reader_grace_is_refused_naming_the_setting():
    with pytest.raises(PermanentError, match="readerGrace must be 0 .* not -5"):
        settings.load(env={"RECONCILER_READER_GRACE": "-5"})
    with pytest.raises(ValueError, match="readerGrace"):
        grace.Retired(-1.0, lambda files: None)
