"""Table maintenance: compaction (during ingestion, with rollup), snapshot expiry, orphan
files, and the import of the old segment layout. Real pyiceberg SQL catalogs on SQLite and
PostgreSQL; the ingestion test runs the daemon with real Spark and a real Tansu broker."""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa
from pyiceberg.exceptions import CommitFailedException

from reconciler.store.store import Store
from reconciler.store.tables import batches as batches_table
from reconciler.table import compact as mc
from reconciler.table import expire as me
from reconciler.table import orphans as mo
from reconciler.table import upgrade as mu
from reconciler.table.catalog import (
    BATCH,
    EPOCH,
    RANGES,
    SUPERVISOR,
    Tables,
    local_path,
    summary_ranges,
)

SCHEMA = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("id", pa.string()), ("user", pa.string()),
                    ("count", pa.int64()), ("bytes", pa.int64()), ("low", pa.int64())])
T0 = datetime(2026, 1, 1, 10, tzinfo=UTC)
LONG_AGO = T0 + timedelta(days=2)  # "now" for which every partition of the data is closed


@pytest.fixture
def env(db_url, tmp_path):
    store = Store(db_url)
    store.migrate()
    tables = Tables(store.engine, tmp_path / "segments")
    yield store, tables
    store.close()


def _rows(keys, minute_of, user_of) -> pa.Table:
    return pa.table({
        "__time": pa.array([T0 + timedelta(minutes=minute_of(k)) for k in keys], pa.timestamp("us", tz="UTC")),
        "id": [f"k{k:05d}" for k in keys],
        "user": [user_of(k) for k in keys],
        "count": [1] * len(keys),
        "bytes": [k for k in keys],
        "low": [k for k in keys],
    }, schema=SCHEMA)


def _append_batch(tables: Tables, name: str, batch: str, rows: pa.Table, ranges, supervisor="clicks") -> list[str]:
    """What a publish does, with pyiceberg's own commit: files under data/batch=<B>/, one per
    hour, added in one snapshot carrying the offset ranges. Retries a lost compare-and-swap."""
    table = tables.ensure(name, SCHEMA, "hour")
    paths = []
    hours = pa.compute.floor_temporal(rows["__time"], unit="hour")
    for i, hour in enumerate(sorted(set(hours.to_pylist()))):
        part = rows.filter(pa.compute.equal(hours, pa.scalar(hour, hours.type)))
        d = tables.data_dir(table, batch) / f"time_chunk={hour:%Y%m%dT%H%MZ}"
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(part, d / f"part-{i:05d}.parquet")
        paths.append(str(d / f"part-{i:05d}.parquet"))
    summary = {SUPERVISOR: supervisor, BATCH: batch, EPOCH: "1", RANGES: json.dumps([list(r) for r in ranges])}
    for _ in range(200):
        try:
            tables.load(name).add_files(paths, snapshot_properties=summary)
            return paths
        except CommitFailedException:
            time.sleep(0.01)
    raise AssertionError("append kept losing")


def _files(tables: Tables, name: str) -> list:
    return [t.file for t in tables.load(name).scan().plan_files()]


def _scan(tables: Tables, name: str) -> pa.Table:
    return tables.load(name).scan().to_arrow()


def _mark_committed(store: Store, batch_ids, datasource="clicks", status="committed", ranges=None, sup="clicks"):
    with store.engine.begin() as c:
        for b in batch_ids:
            c.execute(sa.insert(batches_table).values(
                batch_id=b, supervisor_id=sup, datasource=datasource, epoch=1, status=status,
                ranges=json.dumps((ranges or {}).get(b, [])), rows=0, records=0, unparseable=0,
                committed_at=datetime.now(UTC)))


# --------------------------------------------------------------------------- compaction


def test_compaction_concurrent_with_appends_keeps_every_key_once(env):
    """Batches keep committing (4 hours of data each) while compactions run in a loop: every
    compaction either commits on the current table or is planned again; every key stays
    exactly once, the file count drops, and the compaction snapshots carry no offsets."""
    store, tables = env
    n_batches, per_batch = 16, 40
    done = threading.Event()
    results = []

    def compact_loop():
        while not done.is_set():
            results.append(mc.compact(tables, store=store, datasource="clicks", now=LONG_AGO, attempts=50))

    _append_batch(tables, "clicks", "b000", _rows(range(per_batch), lambda k: k % 240, lambda k: "u"), [("0", 0, per_batch)])
    worker = threading.Thread(target=compact_loop)
    worker.start()
    try:
        for b in range(1, n_batches):
            keys = range(b * per_batch, (b + 1) * per_batch)
            _append_batch(tables, "clicks", f"b{b:03d}", _rows(keys, lambda k: k % 240, lambda k: "u"),
                          [("0", b * per_batch, (b + 1) * per_batch)])
    finally:
        done.set()
        worker.join()
    final = mc.compact(tables, store=store, datasource="clicks", now=LONG_AGO)

    ids = collections.Counter(_scan(tables, "clicks").column("id").to_pylist())
    assert set(ids.values()) == {1} and len(ids) == n_batches * per_batch
    assert any(r.committed for r in results), [r.message for r in results]
    assert all(r.committed or not r.partitions for r in results + [final]), [r.message for r in results]
    files = _files(tables, "clicks")
    assert len(files) == 4  # one per closed hour, from 4 per batch
    table = tables.load("clicks")
    ops = [s.summary.additional_properties for s in table.snapshots()]
    compactions = [p for p in ops if p.get(mc.OPERATION) == "compact"]
    assert compactions and all(RANGES not in p and SUPERVISOR not in p for p in compactions)
    spans = sorted(r for p in ops for r in summary_ranges(p))
    assert spans == [("0", b * per_batch, (b + 1) * per_batch) for b in range(n_batches)]


def test_open_partitions_are_left_alone_and_small_files_only(env):
    store, tables = env
    for b in range(3):
        _append_batch(tables, "clicks", f"b{b}", _rows(range(b * 10, b * 10 + 10), lambda k: 0, lambda k: "u"),
                      [("0", b * 10, b * 10 + 10)])
    still_open = mc.compact(tables, store=store, datasource="clicks", now=T0 + timedelta(minutes=90), lateness=timedelta(hours=1))
    assert not still_open.partitions and still_open.open_partitions == 1 and len(_files(tables, "clicks")) == 3
    dry = mc.compact(tables, store=store, datasource="clicks", now=LONG_AGO, dry_run=True)
    assert [p.files_before for p in dry.partitions] == [3] and len(_files(tables, "clicks")) == 3
    done = mc.compact(tables, store=store, datasource="clicks", now=LONG_AGO)
    assert done.committed and done.files_after == 1
    again = mc.compact(tables, store=store, datasource="clicks", now=LONG_AGO)  # one file: nothing to do, no empty commit
    assert not again.partitions and not again.committed
    assert len(tables.load("clicks").snapshots()) == 4


def test_rollup_compaction_one_row_per_time_and_dimensions(env):
    """Four batches repeat the same (minute, user) keys: the compaction leaves one row per
    key, counts and sums added, mins taken, nulls a key like any other."""
    store, tables = env
    users = lambda k: None if k % 7 == 0 else f"u{k % 3}"  # noqa: E731
    expected: dict = collections.defaultdict(lambda: [0, 0, None])
    for b in range(4):
        keys = list(range(b * 50, b * 50 + 50))
        rows = _rows(keys, lambda k: k % 5, users)
        _append_batch(tables, "rolled", f"b{b}", rows, [("0", b * 50, b * 50 + 50)])
        for k in keys:
            e = expected[(k % 5, users(k))]
            e[0] += 1
            e[1] += k
            e[2] = k if e[2] is None else min(e[2], k)
    rollup = mc.Rollup(("id", "user"), (("count", "count"), ("bytes", "longSum"), ("low", "longMin")))
    # "id" differs on every row: a rollup whose spec names it keeps every row
    keep = mc.compact(tables, store=store, datasource="rolled", rollup=rollup, now=LONG_AGO, dry_run=True)
    assert keep.partitions and keep.rollup

    table = tables.load("rolled")
    with table.update_schema() as upd:
        upd.delete_column("id")
    rollup = mc.Rollup(("user",), (("count", "count"), ("bytes", "longSum"), ("low", "longMin")))
    result = mc.compact(tables, store=store, datasource="rolled", rollup=rollup, now=LONG_AGO)
    assert result.committed and result.files_after == 1
    got = _scan(tables, "rolled").to_pylist()
    by_key = {(int((r["__time"] - T0).total_seconds() // 60), r["user"]): [r["count"], r["bytes"], r["low"]]
              for r in got}
    assert len(got) == len(by_key) == len(expected)
    assert by_key == dict(expected)


def test_rollup_rows_combines_each_metric_type():
    rows = pa.table({"__time": pa.array([T0, T0, T0], pa.timestamp("us", tz="UTC")), "d": ["a", "a", "b"],
                     "c": [1, 2, 3], "s": [1.5, 2.5, 1.0], "lo": [5, 3, 9], "hi": [5.0, 3.0, 9.0]})
    out = mc.rollup_rows(rows, mc.Rollup(("d",), (("c", "count"), ("s", "doubleSum"), ("lo", "longMin"),
                                                 ("hi", "doubleMax"))))
    assert out.schema == rows.schema
    assert sorted(out.to_pylist(), key=lambda r: r["d"]) == [
        {"__time": T0, "d": "a", "c": 3, "s": 4.0, "lo": 3, "hi": 5.0},
        {"__time": T0, "d": "b", "c": 3, "s": 1.0, "lo": 9, "hi": 9.0}]


# --------------------------------------------------------------------------- expiry and orphans


def _age(path: Path, seconds: float) -> None:
    t = time.time() - seconds
    os.utime(path, (t, t))


def test_expire_and_orphans_never_remove_a_referenced_file(env):
    store, tables = env
    # Expired down to one snapshot: no reader's grace, which keeps the log's (test_reader_grace.py).
    tables = Tables(store.engine, tables.warehouse, reader_grace=0)
    for b in range(4):
        _append_batch(tables, "clicks", f"b{b}", _rows(range(b * 10, b * 10 + 10), lambda k: 0, lambda k: "u"),
                      [("0", b * 10, b * 10 + 10)])
    _mark_committed(store, [f"b{b}" for b in range(4)])
    mc.compact(tables, store=store, datasource="clicks", now=LONG_AGO)
    table = tables.load("clicks")
    root = local_path(table.location())
    data = root / "data"
    # orphans: an old uncommitted batch, an old stray file, a young file of a batch in flight,
    # and an unreferenced file inside a committed batch's directory
    (data / "batch=lost").mkdir()
    (data / "batch=lost" / "part-0.parquet").write_bytes(b"x" * 10)
    (data / "stray.parquet").write_bytes(b"x")
    (data / "batch=inflight").mkdir()
    (data / "batch=inflight" / "part-0.parquet").write_bytes(b"x")
    (data / "batch=b0" / "extra.parquet").write_bytes(b"x")
    for p in (data / "batch=lost" / "part-0.parquet", data / "batch=lost", data / "stray.parquet",
              data / "batch=b0" / "extra.parquet"):
        _age(p, 3 * 86400)

    # defaults: nothing is old enough to expire
    assert me.expire_snapshots(tables, "clicks", store=store).expired_snapshots == 0
    dry = me.expire_snapshots(tables, "clicks", store=store, older_than=timedelta(0), retain_last=1, dry_run=True)
    assert dry.expired_snapshots == 4 and len(tables.load("clicks").snapshots()) == 5
    expired = me.expire_snapshots(tables, "clicks", store=store, older_than=timedelta(0), retain_last=1)
    assert expired.committed and expired.expired_snapshots == 4
    # the compacted-away batch files went with the snapshots that alone referenced them
    assert {Path(p).name for p in expired.deleted_files if "/data/" in p} == {"part-00000.parquet"}
    table = tables.load("clicks")
    assert len(table.snapshots()) == 1
    assert me.expired_ranges(table) == {"clicks": [("0", 0, 40)]}

    store.begin_write("inflight", "batch", tables=["clicks"])  # a batch still being written or published
    dry = mo.remove_orphans(tables, "clicks", store=store, dry_run=True)
    # judged by the write's fence, not by age: the unknown batch, the committed batch's
    # unreferenced file, and the file of no write that is old enough
    assert sorted(Path(p).relative_to(data).as_posix() for p in dry.deleted_files) == [
        "batch=b0/extra.parquet", "batch=lost/part-0.parquet", "stray.parquet"]
    assert store.write_statuses(["lost"]) == {"lost": "discarded"}  # fenced before it is deleted
    orphans = mo.remove_orphans(tables, "clicks", store=store)
    assert orphans.kept_in_flight == 1
    assert not (data / "batch=lost").exists() and not (data / "stray.parquet").exists()
    assert (data / "batch=inflight" / "part-0.parquet").exists() and not (data / "batch=b0" / "extra.parquet").exists()
    # every file the table (and its metadata log) references is still there, and readable
    for f in _files(tables, "clicks"):
        assert local_path(f.file_path).exists()
    assert local_path(table.metadata_location).exists()
    assert sorted(_scan(tables, "clicks").column("id").to_pylist()) == [f"k{k:05d}" for k in range(40)]
    # a new batch after all this is fine
    _append_batch(tables, "clicks", "b9", _rows(range(40, 50), lambda k: 0, lambda k: "u"), [("0", 40, 50)])
    assert _scan(tables, "clicks").num_rows == 50


def test_fold_ranges_merges_adjacent_and_keeps_overlaps_and_gaps():
    folded = me.fold_ranges({"a": [("0", 0, 10), ("0", 10, 20), ("0", 25, 30), ("1", 0, 5)]},
                           {"a": [("0", 28, 40)], "b": [("0", 0, 3)]})
    assert folded == {"a": [["0", 0, 20], ["0", 25, 30], ["0", 28, 40], ["1", 0, 5]], "b": [["0", 0, 3]]}


# --------------------------------------------------------------------------- import


def _old_layout(segments: Path, datasource: str, batch: str, rows: pa.Table, n: int = 0) -> Path:
    chunk = f"{rows['__time'][0].as_py():%Y%m%dT%H00Z}"
    d = segments / datasource / f"time_chunk={chunk}"
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{batch}-{n:05d}.parquet"
    pq.write_table(rows, path)
    return path


def test_import_of_the_old_layout_loses_nothing_and_runs_once(env, tmp_path):
    store, tables = env
    segments = tables.warehouse
    files = [_old_layout(segments, "clicks", f"old{b}", _rows(range(b * 10, b * 10 + 10), lambda k: 60 * (k // 10),
                                                               lambda k: "u")) for b in range(3)]
    dead = segments / "_deadletter" / "clicks"
    dead.mkdir(parents=True)
    dead_schema = pa.schema([("partition", pa.string()), ("offset", pa.int64()), ("key", pa.binary()),
                             ("value", pa.binary()), ("reason", pa.string())])
    pq.write_table(pa.table({"partition": ["0"], "offset": [7], "key": [b"k"], "value": [b"{"], "reason": ["bad json"]},
                            schema=dead_schema), dead / "old1-00000.parquet")
    # a batch committed just before the upgrade, its promote interrupted: still in _staging
    staged_rows = _rows(range(30, 40), lambda k: 200, lambda k: "u")
    stage = segments / "_staging" / "old3" / "time_chunk=20260101T1300Z"
    stage.mkdir(parents=True)
    pq.write_table(staged_rows, stage / "part-0.parquet")
    final = segments / "clicks" / "time_chunk=20260101T1300Z" / "old3-00000.parquet"
    (segments / "_staging" / "old3" / "_manifest.json").write_text(json.dumps({
        "batch_id": "old3", "datasource": "clicks", "files": [{"staging_path": str(stage / "part-0.parquet"),
                                                               "final_path": str(final)}], "dead_files": []}))
    ranges = {f"old{b}": [["0", b * 10, b * 10 + 10]] for b in range(4)}
    _mark_committed(store, ["old0", "old1", "old2"], status="promoted", ranges=ranges)
    _mark_committed(store, ["old3"], status="committed", ranges=ranges)
    _mark_committed(store, ["bf1"], status="promoted", ranges={"bf1": [["0", 100, 110]]}, sup="clicks-backfill-1")

    assert mu.old_layout_datasources(segments) == ["clicks"]
    dry = mu.import_segments(tables, store, segments, "clicks", dry_run=True)
    assert tables.load("clicks") is None and dry.files == 3
    result = mu.import_segments(tables, store, segments, "clicks", granularity="hour")
    assert result.files == 4 and result.rows == 40 and result.dead_files == 1 and result.promoted_staged_batches == 1
    assert final.exists() and not (segments / "_staging" / "old3").exists()
    assert sorted(_scan(tables, "clicks").column("id").to_pylist()) == [f"k{k:05d}" for k in range(40)]
    assert _scan(tables, "clicks_deadletter").column("offset").to_pylist() == [7]
    assert all(p.exists() for p in [*files, final])  # referenced in place, not moved
    snaps = [s.summary.additional_properties for s in tables.load("clicks").snapshots()]
    imported = {p[SUPERVISOR]: summary_ranges(p) for p in snaps if p.get(mc.OPERATION) == "import"}
    assert imported == {"clicks": [("0", 0, 40)], "clicks-backfill-1": [("0", 100, 110)]}
    assert tables.load("clicks").properties[mu.IMPORTED] == "true"

    again = mu.import_segments(tables, store, segments, "clicks")
    assert again.already_imported
    assert _scan(tables, "clicks").num_rows == 40 and _scan(tables, "clicks_deadletter").num_rows == 1


def test_import_of_several_supervisors_files_keeps_each_row_once(env):
    """One import commit appends each supervisor's files, and the files no batch names, as
    separate appends of one transaction. They share the staging's tag, so each one's manifest
    must get its own name: with one counter per append, the second wrote ``<tag>-m0.avro``
    over the first's, and the table listed that manifest twice (the first supervisor's rows
    lost, the second's doubled)."""
    store, tables = env
    segments = tables.warehouse
    _old_layout(segments, "clicks", "old0", _rows(range(0, 10), lambda k: 1, lambda k: "u"))
    _old_layout(segments, "clicks", "bf1", _rows(range(10, 20), lambda k: 2, lambda k: "u"))
    _old_layout(segments, "clicks", "nobatch", _rows(range(20, 30), lambda k: 3, lambda k: "u"))
    _mark_committed(store, ["old0"], status="promoted", ranges={"old0": [["0", 0, 10]]})
    _mark_committed(store, ["bf1"], status="promoted", ranges={"bf1": [["0", 100, 110]]}, sup="clicks-backfill-1")

    result = mu.import_segments(tables, store, segments, "clicks", granularity="hour")
    assert result.files == 3 and result.rows == 30, result
    assert sorted(_scan(tables, "clicks").column("id").to_pylist()) == [f"k{k:05d}" for k in range(30)]
    table = tables.load("clicks")
    paths = [m.manifest_path for m in table.current_snapshot().manifests(table.io)]
    assert len(paths) == len(set(paths)), paths


# --------------------------------------------------------------------------- with the daemon


@pytest.mark.kafka
@pytest.mark.spark
def test_compaction_during_ingestion_exactly_once_and_rollup(spark, kafka_broker, topic, tmp_path):
    """The daemon ingests two datasources from one topic (plain and rollup) in small
    batches while compactions run in a loop; afterwards every key is in the plain table
    exactly once, every closed hour is one file, and the rollup table has one row per
    (minute, user) with the counts and byte sums of the records."""
    import devservices
    from tests.e2e import helpers as h

    n = 1200
    name = topic(partitions=2)
    records = devservices.make_records(n, step_ms=9000)  # 2025-11-20 12:00 + 3h: 3 closed hours
    devservices.produce_kafka(kafka_broker.bootstrap, name, records)
    s = h.make_settings(tmp_path)
    src = h.kafka_source(kafka_broker.bootstrap, name)
    # ~20 batches each (a small batch takes ~0.1 s): the loop, every 0.3 s, meets the
    # ingestion under way, as 4 batches of 300 no longer let it
    h.write_spec(s.specs, h.spec_doc("plain", src, max_batch_records=60))
    h.write_spec(s.specs, h.spec_doc(
        "rolled", src, max_batch_records=50, dimensions=["user"],
        metrics=[{"name": "count", "type": "count"}, {"name": "bytes", "type": "longSum", "field": "bytes"}],
        granularity={"segment": "hour", "query": "minute", "rollup": True}))

    tables = h.open_tables(s)
    store = Store(s.db_url)
    done = threading.Event()
    results = collections.defaultdict(list)

    def compact_loop():
        rollup = mc.Rollup(("user",), (("count", "count"), ("bytes", "longSum")))
        while not done.is_set():
            for ds, r in (("plain", None), ("rolled", rollup)):
                if tables.load(ds) is not None:
                    results[ds].append(mc.compact(tables, ds, store=store, rollup=r, attempts=50))
            time.sleep(0.3)

    worker = threading.Thread(target=compact_loop)
    worker.start()
    try:
        code, _ = h.run_daemon(s, timeout=240)
    finally:
        done.set()
        worker.join()
    assert code == 0
    assert any(r.committed for r in results["plain"]), [r.message for r in results["plain"]]

    from reconciler.table.compact import Rollup

    mc.compact(tables, store=store, datasource="plain")
    mc.compact(tables, store=store, datasource="rolled", rollup=Rollup(("user",), (("count", "count"), ("bytes", "longSum"))))
    h.assert_exactly_once(h.key_counts(spark, s, "plain"), h.keys(records))
    assert len(_files(tables, "plain")) == 3 and len(_files(tables, "rolled")) == 3
    # the batches' snapshots tile the offsets; compactions carry none
    for ds in ("plain", "rolled"):
        props = [x.summary.additional_properties for x in tables.load(ds).snapshots()]
        assert all(RANGES not in p for p in props if p.get(mc.OPERATION) == "compact")
    expected: dict = collections.defaultdict(lambda: [0, 0])
    for _, value in records:
        doc = json.loads(value)
        minute = doc["ts"] // 60_000
        expected[(minute, doc["user"])][0] += 1
        expected[(minute, doc["user"])][1] += doc["bytes"]
    got = _scan(tables, "rolled").to_pylist()
    by_key = {(int(r["__time"].timestamp()) // 60, r["user"]): [r["count"], r["bytes"]] for r in got}
    assert len(got) == len(by_key) == len(expected)
    assert by_key == dict(expected)
    tables.catalog.engine.dispose()


# --------------------------------------------------------------------------- command line


def test_compact_and_maintain_commands(tmp_path, monkeypatch):
    from tests.e2e import helpers as h

    monkeypatch.setenv("RECONCILER_READER_GRACE", "0")  # --retain-last 1 reaches the metadata log's snapshots
    s = h.make_settings(tmp_path)
    store = Store(s.db_url)
    store.migrate()
    tables = Tables(store.engine, s.segments_dir)
    for b in range(3):
        _append_batch(tables, "clicks", f"b{b}", _rows(range(b * 10, b * 10 + 10), lambda k: 0, lambda k: "u"),
                      [("0", b * 10, b * 10 + 10)])

    code, out = h.run_cli(s, "compact", "clicks", "--dry-run", "-o", "json")
    doc = json.loads(out)
    assert code == 0 and doc["ok"] and doc["dryRun"] and doc["partitions"][0]["filesBefore"] == 3
    code, out = h.run_cli(s, "compact", "clicks")
    assert code == 0 and "3 file(s) -> 1" in out, out
    assert len(_files(tables, "clicks")) == 1
    code, out = h.run_cli(s, "compact", "nope")
    assert code == 1

    code, out = h.run_cli(s, "maintain", "--dry-run", "-o", "json")
    doc = json.loads(out)
    assert code == 0 and {t["table"] for t in doc["tables"]} == {"clicks"}
    assert doc["tables"][0]["expire"]["expiredSnapshots"] == 0  # the daemon's 1 h, 25 snapshots by default
    code, out = h.run_cli(s, "maintain", "clicks", "--older-than", "0s", "--retain-last", "1",
                          "--orphans-older-than", "1h")
    assert code == 0 and "expired 3 snapshot(s)" in out, out
    assert _scan(tables, "clicks").num_rows == 30
    for name in ("compact", "maintain"):
        code, out = h.run_cli(s, name, "--help")
        assert code == 0 and "Example" in out
    store.close()


# --------------------------------------------------------------------------- the daemon's compactor


def test_compactor_runs_when_due_and_compacts_every_datasource(env, tmp_path):
    from reconciler.model import SupervisorSpec
    from reconciler.runtime.compactor import Compactor
    from reconciler.runtime.supervisor import RuntimeContext
    from tests.e2e import helpers as h

    store, tables = env
    spec = SupervisorSpec.from_document(h.spec_doc("clicks", h.kafka_source("127.0.0.1:1", "t")))
    store.create_supervisor(spec, None, actor="test")
    for b in range(3):
        _append_batch(tables, "clicks", f"b{b}", _rows(range(b * 10, b * 10 + 10), lambda k: 0, lambda k: "u"),
                      [("0", b * 10, b * 10 + 10)])
    ctx = RuntimeContext(store=store, segments_dir=tables.warehouse, spark=lambda: None)
    now = [1000.0]
    compactor = Compactor(ctx, every=60.0, lateness=3600.0, first_delay=5.0, clock=lambda: now[0])
    assert not compactor.maybe_run()  # not due yet
    now[0] += 5.0
    assert compactor.maybe_run()
    compactor._thread.join(60)
    assert compactor.last_error is None, compactor.last_error
    assert [r.committed for r in compactor.last_results] == [True]
    assert len(_files(tables, "clicks")) == 1
    assert not compactor.maybe_run()  # next run in 60s
    compactor.stop()
    assert not compactor.maybe_run(now[0] + 3600)  # stopped: never again
