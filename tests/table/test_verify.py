"""verify: exactly once from the table's snapshots; the publish as a table commit.

The range logic is checked on plain snapshot lists; the table-level tests use a real
pyiceberg catalog in the metadata database (SQLite and PostgreSQL), data files written
with pyarrow, and the real publish transaction."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reconciler.model import PartitionRange, SupervisorSpec
from reconciler.store.store import SegmentFile, Store, TableConflict
from reconciler.table import catalog as cat
from reconciler.table.files import BatchSnapshot, batch_snapshots, data_files
from reconciler.table.verify import check_ranges, explanations
from reconciler.table.writeids import new_write_id
from tests.e2e import helpers as h

T0 = datetime(2026, 11, 20, 10, tzinfo=UTC)
SCHEMA = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("id", pa.string()),
                    ("__partition", pa.string()), ("__offset", pa.int64())])


def snap(sid: str, batch: str, *ranges: tuple[str, int, int]) -> BatchSnapshot:
    return BatchSnapshot(1, T0, sid, batch, 1, tuple(ranges))


# --------------------------------------------------------------------------- range logic


def test_contiguous_ranges_are_exactly_once():
    report = check_ranges("clicks", [snap("clicks", "b1", ("0", 0, 10), ("1", 0, 5)),
                                     snap("clicks", "b2", ("0", 10, 20))], [])
    assert report.ok and report.findings == []
    assert [(c.partition, c.start, c.end, c.batches) for c in report.coverage] == [("0", 0, 20, 2), ("1", 0, 5, 1)]


def test_an_overlap_fails_even_when_a_rewind_explains_it():
    history = {"clicks": [{"action": "reset", "at": "2026-11-20T11:00:00",
                           "details": {"partitions": [{"partition": "0", "checkpoint": 20, "new": 15, "backfill": 0}]}}]}
    report = check_ranges("clicks", [snap("clicks", "b1", ("0", 0, 20)), snap("clicks", "b2", ("0", 15, 30))],
                          explanations(history))
    [f] = report.findings
    assert (f.kind, f.start, f.end, f.fails) == ("overlap", 15, 20, True)
    assert "rewind" in f.explanation and not report.ok


def test_gaps_are_explained_by_retention_loss_reset_or_cancel_else_fail():
    snaps = [snap("clicks", "b1", ("0", 0, 10)), snap("clicks", "b2", ("0", 40, 50)),
             snap("clicks", "b3", ("0", 60, 70)), snap("clicks", "b4", ("0", 80, 90))]
    history = {
        "clicks": [
            {"action": "retention-loss", "at": "t1", "details": {"lostRanges": {"0": [10, 25]}}},
            {"action": "reset", "at": "t2",
             "details": {"partitions": [{"partition": "0", "checkpoint": 25, "new": 40, "backfill": 0}]}},
        ],
        "clicks-backfill-1": [{"action": "cancel-backfill", "at": "t3", "details": {"unreadRanges": {"0": [50, 60]}}}],
    }
    report = check_ranges("clicks", snaps, explanations(history))
    gaps = [(f.start, f.end, f.fails) for f in report.findings]
    assert gaps == [(10, 40, False), (50, 60, False), (70, 80, True)]
    assert "retention" in report.findings[0].explanation and "without a backfill" in report.findings[0].explanation
    assert "cancelled" in report.findings[1].explanation
    assert not report.ok


def test_a_backfill_covers_the_range_its_main_skipped():
    snaps = [snap("clicks", "b1", ("0", 0, 10)), snap("clicks", "b2", ("0", 30, 40)),
             snap("clicks-backfill-1", "b3", ("0", 10, 30))]
    report = check_ranges("clicks", snaps, [])
    assert report.ok and report.findings == []
    assert [(c.lineage, c.start, c.end, c.batches) for c in report.coverage] == [("clicks", 0, 40, 3)]


# --------------------------------------------------------------------------- on a real table


def _spec(sid: str) -> SupervisorSpec:
    return SupervisorSpec.from_document({
        "id": sid, "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": sid},
        "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"},
                       "dimensions": ["id", "__partition", "__offset"]}})


def _write(tables: cat.Tables, batch: str, partition: str, start: int, end: int) -> str:
    table = tables.ensure("clicks", SCHEMA, "hour")
    d = tables.data_dir(table, batch) / "time_chunk=20261120T1000Z"
    d.mkdir(parents=True, exist_ok=True)
    path = d / "part-0.parquet"
    pq.write_table(pa.table({"__time": pa.array([T0] * (end - start), pa.timestamp("us", tz="UTC")),
                             "id": [f"k{o}" for o in range(start, end)], "__partition": [partition] * (end - start),
                             "__offset": list(range(start, end))}, schema=SCHEMA), path)
    return str(path)


def _publish(store: Store, tables: cat.Tables, sid: str, batch: str, partition: str, start: int, end: int) -> None:
    path = _write(tables, batch, partition, start, end)
    summary = {cat.SUPERVISOR: sid, cat.BATCH: batch, cat.EPOCH: "1",
               cat.RANGES: json.dumps([[partition, start, end]])}
    commit = tables.stage_append("clicks", [path], summary, schema=SCHEMA, granularity="hour",
                                 write_id=new_write_id())
    store.publish(supervisor_id=sid, epoch=1, batch_id=batch, datasource="clicks",
                  ranges=[PartitionRange(partition, start, end)], files=[SegmentFile("x", "", "", path, end - start, 1)],
                  records=end - start, unparseable=0, table_commits=[commit])


@pytest.fixture
def setup(db_url, tmp_path):
    s = h.make_settings(tmp_path, db=db_url)
    store = Store(db_url)
    store.migrate()
    for sid in ("clicks", "other"):
        store.create_supervisor(_spec(sid), None, actor="test")
        store.init_checkpoints(sid, {"0": 0})
    tables = cat.Tables(store.engine, s.segments_dir)
    yield s, store, tables
    store.close()


def test_publish_commits_the_snapshot_and_verify_proves_it(setup):
    s, store, tables = setup
    _publish(store, tables, "clicks", "b1", "0", 0, 10)
    _publish(store, tables, "clicks", "b2", "0", 10, 25)
    table = tables.load("clicks")
    assert [(b.batch_id, b.ranges) for b in batch_snapshots(table)] == [("b1", (("0", 0, 10),)),
                                                                        ("b2", (("0", 10, 25),))]
    assert sorted(f.batch_id for f in data_files(table)) == ["b1", "b2"]
    assert table.scan().to_arrow().num_rows == 25
    code, out = h.run_cli(s, "verify", "clicks", "--deep")
    assert code == 0, out
    assert "OK: every offset in exactly one batch" in out and "0 duplicated offset(s)" in out
    report = h.cli_json(s, "verify", "clicks")
    assert report["ok"] and report["coverage"] == [
        {"supervisor": "clicks", "partition": "0", "start": 0, "end": 25, "batches": 2}]


def test_a_planted_overlap_fails_verify(setup):
    s, store, tables = setup
    _publish(store, tables, "clicks", "b1", "0", 0, 10)
    # a second writer that ignored the checkpoints: its snapshot re-adds offsets 5..10
    path = _write(tables, "rogue", "0", 5, 12)
    tables.load("clicks").add_files([path], snapshot_properties={
        cat.SUPERVISOR: "clicks", cat.BATCH: "rogue", cat.EPOCH: "1", cat.RANGES: json.dumps([["0", 5, 12]])})
    code, out = h.run_cli(s, "verify", "clicks", "--deep")
    assert code == 1
    assert "FAIL overlap in clicks partition 0: [5, 10)" in out
    code, out = h.run_cli(s, "verify", "clicks", "--deep", "-o", "json")
    report = json.loads(out)
    assert code == 1 and not report["ok"] and report["deep"]["duplicateOffsets"] == 5


def test_a_commit_staged_on_a_moved_table_conflicts_and_publishes_nothing(setup):
    s, store, tables = setup
    p1 = _write(tables, "a1", "0", 0, 5)
    p2 = _write(tables, "b1", "0", 0, 7)
    c1 = tables.stage_append("clicks", [p1], {cat.RANGES: json.dumps([["0", 0, 5]])}, write_id=new_write_id())
    c2 = tables.stage_append("clicks", [p2], {cat.RANGES: json.dumps([["0", 0, 7]])}, write_id=new_write_id())
    assert c1.expected == c2.expected
    store.publish(supervisor_id="clicks", epoch=1, batch_id="a1", datasource="clicks",
                  ranges=[PartitionRange("0", 0, 5)], files=[], records=5, unparseable=0, table_commits=[c1])
    with pytest.raises(TableConflict):
        store.publish(supervisor_id="other", epoch=1, batch_id="b1", datasource="clicks",
                      ranges=[PartitionRange("0", 0, 7)], files=[], records=7, unparseable=0, table_commits=[c2])
    assert store.checkpoints("other") == {"0": 0}  # nothing of the loser moved
    assert tables.load("clicks").scan().to_arrow().num_rows == 5
    # staged again on the new metadata, it publishes
    c2 = tables.stage_append("clicks", [p2], {cat.RANGES: json.dumps([["0", 0, 7]])}, write_id=new_write_id())
    store.publish(supervisor_id="other", epoch=1, batch_id="b1", datasource="clicks",
                  ranges=[PartitionRange("0", 0, 7)], files=[], records=7, unparseable=0, table_commits=[c2])
    assert tables.load("clicks").scan().to_arrow().num_rows == 12
    assert Path(p1).exists() and Path(p2).exists()


def test_verify_still_covers_the_offsets_of_expired_snapshots(setup):
    from datetime import timedelta

    from reconciler.table.expire import expire_snapshots

    s, store, tables = setup
    tables = cat.Tables(store.engine, s.segments_dir, reader_grace=0)  # a grace keeps the log's versions readable
    for i, (lo, hi) in enumerate([(0, 10), (10, 25), (25, 40)]):
        _publish(store, tables, "clicks", f"b{i}", "0", lo, hi)
    expire_snapshots(tables, "clicks", store=store, older_than=timedelta(0), retain_last=1)
    table = tables.load("clicks")
    assert len(batch_snapshots(table)) == 1  # two of the three snapshots are gone
    report = h.cli_json(s, "verify", "clicks", "--deep")
    assert report["ok"] and report["findings"] == []
    assert report["coverage"] == [{"supervisor": "clicks", "partition": "0", "start": 0, "end": 40, "batches": 2}]
    assert report["deep"]["rows"] == 40 and report["deep"]["duplicateOffsets"] == 0


def test_two_writers_sharing_one_catalog_never_drop_a_committed_snapshot(setup):
    """A daemon's main and backfill runtimes publish to one table from two threads through
    one ``Tables``. Every batch the database committed must be in the table's lineage: a
    Table object shared between the threads once let one writer stage on the other's
    unpublished version and compare-and-swap against it, silently dropping a snapshot."""
    import threading

    s, store, tables = setup
    rounds = 12
    gate = threading.Barrier(2, timeout=60)
    errors: list[BaseException] = []

    def writer(sid: str) -> None:
        try:
            for i in range(rounds):
                batch, start = f"{sid}-{i}", i * 10
                path = _write(tables, batch, "0", start, start + 10)
                summary = {cat.SUPERVISOR: sid, cat.BATCH: batch, cat.EPOCH: "1",
                           cat.RANGES: json.dumps([["0", start, start + 10]])}
                gate.wait()  # both stage at the same moment: the race the daemon runs into
                while True:
                    commit = tables.stage_append("clicks", [path], summary, schema=SCHEMA, granularity="hour",
                                                 write_id=new_write_id())
                    try:
                        store.publish(supervisor_id=sid, epoch=1, batch_id=batch, datasource="clicks",
                                      ranges=[PartitionRange("0", start, start + 10)],
                                      files=[SegmentFile("x", "", "", path, 10, 1)], records=10, unparseable=0,
                                      table_commits=[commit])
                    except TableConflict:
                        continue
                    tables.committed([commit])
                    break
        except BaseException as exc:  # reported below
            errors.append(exc)
            gate.abort()

    threads = [threading.Thread(target=writer, args=(sid,)) for sid in ("clicks", "other")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    table = tables.load("clicks")
    in_table = {b.batch_id for b in batch_snapshots(table)}
    committed = {f"{sid}-{i}" for sid in ("clicks", "other") for i in range(rounds)}
    assert store.committed_batch_ids(committed) == committed
    assert in_table == committed, f"committed but not in the table: {sorted(committed - in_table)}"
    assert table.scan().to_arrow().num_rows == 2 * rounds * 10


def test_a_files_existence_is_judged_as_path_exists_judges_it(tmp_path):
    """``verify`` stats every live file by its name (a string: at 100,000 files a Path cost
    more than the stat), with ``Path.exists``'s answers: absent, below a file or in a
    symlink loop is missing, present is present, in either spelling of a location."""
    from reconciler.table.verify import _exists

    present = tmp_path / "a b%20c.parquet"
    present.write_bytes(b"x")
    (tmp_path / "l1").symlink_to(tmp_path / "l2")
    (tmp_path / "l2").symlink_to(tmp_path / "l1")
    for location in (str(present), f"file://{present}", f"file://{tmp_path}//{present.name}"):
        assert _exists(location) is True and Path(location.removeprefix("file://")).exists()
    for location in (str(tmp_path / "gone"), f"{present}/below", str(tmp_path / "l1")):
        assert _exists(location) is False and not Path(location).exists()
