"""A compaction that lost its commit keeps its plan while every file it planned on is live.

A backfill publishing back to back into the hour being compacted used to move the plan at
every attempt (each new file joined the group: rewritten again, lost again) until the run
gave up ("the table kept moving"). Every file the plan read is still live after an append,
so the same overwrite staged on the table as it is now is right: it commits at the next
attempt and leaves the new files for the next run. The snapshots' summaries say so when
``main`` only appended since; when an expiry broke that chain, the manifests do. Another
compaction that took the files makes it plan again."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

from reconciler import faults
from reconciler.table import catalog as cat
from reconciler.table.ancestry import all_live, only_appends_since
from reconciler.table.compact import compact
from reconciler.table.expire import expire_snapshots
from tests.table import test_write_races as races
from tests.table.test_write_races import FAR, T0, _stage_batch

env = races.env


def _md_io(tables):
    table = tables.current("clicks")
    return table.metadata, table.io  # the fixture: a store with supervisor clicks and its table, partitioned by hour


def _ids(tables: cat.Tables) -> Counter:
    return Counter(tables.current("clicks").scan().to_arrow().column("id").to_pylist())


def _publish(store, tables, lo, hi, hour=0):
    _, publish = _stage_batch(store, tables, lo, hi, hour)
    publish()


def _losing(store, tables, lose: int, hour: int = 0, then=None):
    """A hook: the compaction's first ``lose`` commits each lose to a batch of 10 records
    published into ``hour`` just before them (``then(n)`` instead, when given)."""
    seen = {"n": 0, "next": 30}  # the checkpoint after the three batches each test starts with

    def hook(point, subject):
        if point != "compact-commit":
            return None
        seen["n"] += 1
        if seen["n"] <= lose:
            if then is not None:
                then(seen["n"])
            else:
                _publish(store, tables, seen["next"], seen["next"] + 10, hour)
                seen["next"] += 10
        return None

    return hook, seen


def test_a_compaction_losing_to_appends_into_its_partition_keeps_its_plan(env, rewrites):
    store, tables = env
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)
    hook, seen = _losing(store, tables, lose=4)
    faults.install(hook)
    try:
        result = compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR, target_file_size=1 << 30,
                         attempts=5)
    finally:
        faults.install(None)
    assert result.committed, result.message
    assert result.attempts == 5 and seen["n"] == 5
    assert len(rewrites) == 1, f"the plan moved with each append: {len(rewrites)} rewrites"
    assert [len(r) for r in rewrites] == [3]
    assert result.files_before == 3 and result.files_after == 1
    ids = _ids(tables)
    assert set(ids.values()) == {1} and len(ids) == 30 + 4 * 10, "a row lost or doubled"
    live = [t.file.file_path for t in tables.current("clicks").scan().plan_files()]
    assert len(live) == 1 + 4, "the merged file and the four batches that came during the run"


def test_a_compaction_losing_to_another_compaction_plans_again(env, rewrites):
    store, tables = env
    for i, hour in enumerate((0, 0, 1, 1)):
        _publish(store, tables, i * 10, i * 10 + 10, hour)

    def other(_n):  # a compaction for which only the first hour is closed takes that partition
        done = compact(cat.Tables(store.engine, tables.warehouse), "clicks", store=store, lateness=timedelta(0),
                       now=T0 + timedelta(hours=1, minutes=30), target_file_size=1 << 30)
        assert done.committed and len(done.partitions) == 1, done.message

    hook, _seen = _losing(store, tables, lose=1, then=other)
    faults.install(hook)
    try:
        result = compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR, target_file_size=1 << 30)
    finally:
        faults.install(None)
    assert result.committed and result.attempts == 2, result.message
    assert len(result.partitions) == 1, "planned again: only the hour the other compaction left"
    ids = _ids(tables)
    assert set(ids.values()) == {1} and len(ids) == 40, "a row lost or doubled"


def test_a_chain_broken_by_expiry_keeps_the_plan_while_its_files_are_live(env, rewrites):
    store, tables = env
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)

    def two_batches_then_expiry(_n):
        # The snapshots between the one planned on and the current one are expired: the
        # chain cannot be followed (pyiceberg's expiry also blanks a survivor's parent id);
        # the manifests say every file planned on is still live.
        for lo in (30, 40):
            _publish(store, tables, lo, lo + 10)
        no_grace = cat.Tables(store.engine, tables.warehouse, reader_grace=0)  # else the log's snapshots stay
        done = expire_snapshots(no_grace, "clicks", store=store, older_than=timedelta(0),
                                now=datetime.now(UTC) + timedelta(seconds=1), retain_last=1)
        assert done.committed, done.message

    hook, _seen = _losing(store, tables, lose=1, then=two_batches_then_expiry)
    faults.install(hook)
    try:
        result = compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR, target_file_size=1 << 30)
    finally:
        faults.install(None)
    assert result.committed and result.attempts == 2, result.message
    assert [len(r) for r in rewrites] == [3], "the chain broken by expiry, the plan's files live: kept"
    assert len(result.partitions) == 1 and result.files_before == 3
    ids = _ids(tables)
    assert set(ids.values()) == {1} and len(ids) == 50


def test_only_appends_since(env):
    store, tables = env
    assert only_appends_since(tables.current("clicks").metadata, None)  # no snapshot yet, none since
    _publish(store, tables, 0, 10)
    _publish(store, tables, 10, 20)
    first = tables.current("clicks").metadata.current_snapshot_id
    _publish(store, tables, 20, 30)
    table = tables.current("clicks")
    assert only_appends_since(table.metadata, first)
    assert only_appends_since(table.metadata, table.metadata.current_snapshot_id)
    assert not only_appends_since(table.metadata, 12345), "not an ancestor"
    assert compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR, target_file_size=1 << 30).committed
    assert not only_appends_since(tables.current("clicks").metadata, first), "an overwrite between"


def test_all_live(env):
    store, tables = env
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)
    files = [t.file.file_path for t in tables.current("clicks").scan().plan_files()]
    assert all_live(*_md_io(tables), files)
    assert all_live(*_md_io(tables), files[:1])
    assert not all_live(*_md_io(tables), [*files, files[0] + ".gone"])
    assert compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR, target_file_size=1 << 30).committed
    assert not all_live(*_md_io(tables), files), "merged away"
