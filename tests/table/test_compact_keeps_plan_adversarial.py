"""Adversarial schedules for the kept plan (commit 7a79945): a compaction that lost its
commit to appends stages the same overwrite on the new table. Each test makes the
compaction lose to one kind of writer (through the ``compact-commit`` fault point) and
checks that no row is lost or doubled, that every live file is readable and belongs to
the partition its spec says, and that the run ends (committed, or planned again)."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThan

from reconciler import faults
from reconciler.model import PartitionRange
from reconciler.store.store import SegmentFile
from reconciler.table import catalog as cat
from reconciler.table.ancestry import only_appends_since
from reconciler.table.compact import compact, time_field_id, time_interval
from reconciler.table.rolling import compact_open
from reconciler.table.verify import missing_files
from reconciler.table.writeids import new_write_id
from tests.table import test_write_races as races
from tests.table.test_write_races import FAR, SCHEMA, T0

env = races.env

WIDE = pa.schema([*SCHEMA, ("country", pa.string())])


def _publish(store, tables, lo, hi, *, hour=0, granularity="hour", schema=SCHEMA):
    """A batch as the runtime writes it, with its own granularity and schema (a batch may
    evolve the table's partitioning or add a column)."""
    batch = new_write_id()
    store.begin_write(batch, "batch", tables=["clicks"], supervisor_id="clicks")
    table = tables.current("clicks")
    at = T0 + timedelta(hours=hour)
    d = tables.data_dir(table, batch) / f"time_chunk={at:%Y%m%dT%H%MZ}"
    d.mkdir(parents=True)
    path = d / "part-00000.parquet"
    cols = {"__time": pa.array([at + timedelta(minutes=o % 50) for o in range(lo, hi)], pa.timestamp("us", tz="UTC")),
            "id": [f"k{o}" for o in range(lo, hi)], "__partition": ["0"] * (hi - lo),
            "__offset": pa.array(range(lo, hi), pa.int64())}
    if "country" in schema.names:
        cols["country"] = ["fr"] * (hi - lo)
    pq.write_table(pa.table(cols, schema=schema), path)
    summary = {cat.SUPERVISOR: "clicks", cat.BATCH: batch, cat.EPOCH: "1", cat.RANGES: json.dumps([["0", lo, hi]])}
    commit = tables.stage_append("clicks", [str(path)], summary, schema=schema, granularity=granularity,
                                 write_id=batch)
    store.publish(supervisor_id="clicks", epoch=1, batch_id=batch, datasource="clicks",
                  ranges=[PartitionRange("0", lo, hi)], files=[SegmentFile("x", "", "", str(path), hi - lo, 1)],
                  records=hi - lo, unparseable=0, table_commits=[commit])
    tables.committed([commit])


def _losing(then, lose=1):
    seen = {"n": 0}

    def hook(point, subject):
        if point == "compact-commit":
            seen["n"] += 1
            if seen["n"] <= lose:
                then(seen["n"])
        return None

    return hook, seen


def _run(hook, fn):
    faults.install(hook)
    try:
        return fn()
    finally:
        faults.install(None)


def _check(tables, expected_ids: int):
    """No row lost or doubled; every file readable; each file's partition value holds its
    rows (a file filed under the wrong spec or value is out of reach of a filtered scan)."""
    fresh = cat.Tables(tables._engine, tables.warehouse)
    table = fresh.load("clicks")
    assert missing_files(table) == [], "a referenced file is missing"
    ids = Counter(table.scan().to_arrow().column("id").to_pylist())
    doubled = {k: v for k, v in ids.items() if v != 1}
    assert not doubled, f"rows doubled: {sorted(doubled)[:5]}"
    assert len(ids) == expected_ids, f"rows lost: {expected_ids - len(ids)}"
    metadata = table.metadata
    time_id = time_field_id(metadata.schema())
    for task in table.scan().plan_files():
        f = task.file
        start, end = time_interval(metadata.specs()[f.spec_id], f.partition, time_id)
        if start is None:
            continue
        rows = pq.read_table(f.file_path.removeprefix("file://"), columns=["__time"]).column("__time").to_pylist()
        assert all(start <= r < end for r in rows), f"{f.file_path}: rows outside its partition {start}/{end}"
    # a time-filtered scan of each hour finds all of its rows
    total = 0
    for hour in range(0, 48):
        lo = T0 + timedelta(hours=hour)
        flt = And(GreaterThanOrEqual("__time", lo.isoformat()), LessThan("__time", (lo + timedelta(hours=1)).isoformat()))
        total += table.scan(row_filter=flt).to_arrow().num_rows
    assert total == sum(ids.values()), f"time-filtered scans see {total} rows of {sum(ids.values())}"
    return table


def test_lost_to_a_granularity_change_and_back_merges_no_file_of_another_spec(env, rewrites):
    """Between the plan and the commit two batches change the partitioning (hour -> day ->
    hour): both are appends, the chain is kept; the spec check must still stop the kept
    plan (or the merged files land under the right spec)."""
    store, tables = env
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)

    def flip(_n):
        _publish(store, tables, 30, 40, granularity="day")
        _publish(store, tables, 40, 50, granularity="hour")

    hook, seen = _losing(flip)
    result = _run(hook, lambda: compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR,
                                        target_file_size=1 << 30))
    assert result.attempts <= 3, result.message
    table = _check(tables, 50)
    assert only_appends_since(table.metadata, table.metadata.current_snapshot_id)


def test_lost_to_a_granularity_change_plans_again(env, rewrites):
    store, tables = env
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)
    hook, _ = _losing(lambda _n: _publish(store, tables, 30, 40, granularity="day"))
    result = _run(hook, lambda: compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR,
                                        target_file_size=1 << 30))
    assert not result.committed, "merged hour files committed under the day spec"
    assert result.message == "nothing to compact", result.message
    _check(tables, 40)


def test_lost_to_a_batch_adding_a_column(env, rewrites):
    """A typed table gains a column between the plan and the kept commit: the merged file
    (written with the plan's schema) goes into a table of the new schema."""
    store, tables = env
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)
    hook, _ = _losing(lambda _n: _publish(store, tables, 30, 40, schema=WIDE))
    result = _run(hook, lambda: compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR,
                                        target_file_size=1 << 30))
    assert result.committed and result.attempts == 2, result.message
    assert len(rewrites) == 1, "kept plan expected"
    table = _check(tables, 40)
    rows = table.scan().to_arrow()
    countries = Counter(zip(rows.column("id").to_pylist(), rows.column("country").to_pylist(), strict=True))
    assert sum(1 for (i, c) in countries if c == "fr") == 10
    assert sum(1 for (i, c) in countries if c is None) == 30
    # and the next compaction merges the kept output with the wide file
    again = compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR, target_file_size=1 << 30)
    assert again.committed, again.message
    _check(tables, 40)


def test_lost_to_publishes_whose_expiry_removes_the_planned_snapshot(env, rewrites, tmp_path):
    """``snapshotsKept`` small: the publishes during the lost commit expire the snapshot the
    plan was made on (pyiceberg nulls the parent id of its child): the chain cannot be
    followed, the run plans again, and commits."""
    store, _ = env
    tables = cat.Tables(store.engine, tmp_path / "segments", snapshots_kept=1, reader_grace=0)
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)

    def many(_n):
        for lo in range(30, 110, 10):
            _publish(store, tables, lo, lo + 10)

    hook, _ = _losing(many)
    result = _run(hook, lambda: compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR,
                                        target_file_size=1 << 30))
    assert result.committed, result.message
    _check(tables, 110)


def test_rolling_compaction_lost_to_appends_into_the_open_hour(env, rewrites):
    store, tables = env
    now = T0 + timedelta(minutes=55)
    for lo in range(0, 80, 10):
        _publish(store, tables, lo, lo + 10)
    seen = {"next": 80}

    def more(_n):
        for _ in range(2):
            _publish(store, tables, seen["next"], seen["next"] + 10)
            seen["next"] += 10

    hook, _ = _losing(more, lose=3)
    result = _run(hook, lambda: compact_open(tables, "clicks", store=store, lateness=timedelta(0), now=now,
                                             target_file_size=1 << 30))
    assert result.committed and result.attempts == 4, result.message
    assert len(rewrites) == 1
    _check(tables, seen["next"])


def test_lost_to_another_compaction_of_the_same_partition(env, rewrites):
    """Both plan the same files; the other commits first (an overwrite): the kept plan must
    not be staged (its inputs are gone: the merge again would double every row)."""
    store, tables = env
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)

    def other(_n):
        _publish(store, tables, 30, 40)
        done = compact(cat.Tables(store.engine, tables.warehouse), "clicks", store=store, lateness=timedelta(0),
                       now=FAR, target_file_size=1 << 30)
        assert done.committed
        _publish(store, tables, 40, 50)

    hook, _ = _losing(other)
    result = _run(hook, lambda: compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR,
                                        target_file_size=1 << 30))
    assert result.attempts == 2, result.message
    _check(tables, 50)


def test_kept_through_a_standalone_expiry_between(env, rewrites):
    """An expiry (no new snapshot with the SQL catalog) and a batch: the files read are
    still live; kept or planned again, nothing lost."""
    from reconciler.table.expire import expire_snapshots

    store, tables = env
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)

    def batch_then_expiry(_n):
        _publish(store, tables, 30, 40)
        no_grace = cat.Tables(store.engine, tables.warehouse, reader_grace=0)
        done = expire_snapshots(no_grace, "clicks", store=store, older_than=timedelta(0),
                                now=datetime.now(UTC) + timedelta(seconds=1), retain_last=1)
        assert done.committed, done.message

    hook, _ = _losing(batch_then_expiry)
    result = _run(hook, lambda: compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR,
                                        target_file_size=1 << 30))
    assert result.committed and result.attempts == 2, result.message
    _check(tables, 40)


def test_one_batch_then_an_expiry_of_the_planned_snapshot(env, rewrites):
    """pyiceberg's RemoveSnapshotsUpdate nulls the parent id of a kept child of an expired
    snapshot, so the chain cannot be followed; the files planned on are all still live
    (``ancestry.all_live``), so the plan is kept all the same: one rewrite, nothing lost."""
    from reconciler.table.expire import expire_snapshots

    store, tables = env
    for lo in (0, 10, 20):
        _publish(store, tables, lo, lo + 10)
    parents = {}

    def batch_then_expiry(_n):
        planned = tables.current("clicks").metadata.current_snapshot_id
        _publish(store, tables, 30, 40)
        no_grace = cat.Tables(store.engine, tables.warehouse, reader_grace=0)
        done = expire_snapshots(no_grace, "clicks", store=store, older_than=timedelta(0),
                                now=datetime.now(UTC) + timedelta(seconds=1), retain_last=1)
        assert done.committed, done.message
        cur = tables.current("clicks").metadata
        parents["parent"] = cur.current_snapshot().parent_snapshot_id
        parents["planned"] = planned

    hook, _ = _losing(batch_then_expiry)
    result = _run(hook, lambda: compact(tables, "clicks", store=store, lateness=timedelta(0), now=FAR,
                                        target_file_size=1 << 30))
    assert result.committed and result.attempts == 2, result.message
    assert parents["parent"] is None, "pyiceberg kept the expired parent's id"
    assert [len(r) for r in rewrites] == [3], "the chain's parent id was nulled, but every planned file is live"
    _check(tables, 40)
