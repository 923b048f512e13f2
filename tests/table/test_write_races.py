"""Races of the write path found by review (issue 28's fences), each pinned at the exact
moment it needs: the real ``Store`` and ``Tables`` on SQLite and PostgreSQL, data files
written with pyarrow, and the real publish, compaction and orphan clean-up.

The moment is made by running the other writer inside the clean-up's own call into the
store (its status query): the database and the files are the real ones, only the timing
is chosen."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reconciler import faults
from reconciler.model import PartitionRange, SupervisorSpec
from reconciler.store.store import SegmentFile, Store
from reconciler.table import catalog as cat
from reconciler.table.compact import compact
from reconciler.table.orphans import remove_orphans
from reconciler.table.verify import missing_files
from reconciler.table.writeids import new_write_id

T0 = datetime(2026, 11, 20, 10, tzinfo=UTC)
SCHEMA = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("id", pa.string()),
                    ("__partition", pa.string()), ("__offset", pa.int64())])
FAR = datetime(2100, 1, 1, tzinfo=UTC)


@pytest.fixture
def env(db_url, tmp_path):
    store = Store(db_url)
    store.migrate()
    store.create_supervisor(SupervisorSpec.from_document({
        "id": "clicks", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": "t"},
        "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"},
                       "dimensions": ["id", "__partition", "__offset"]}}), None, actor="test")
    store.init_checkpoints("clicks", {"0": 0})
    tables = cat.Tables(store.engine, tmp_path / "segments")
    tables.ensure("clicks", SCHEMA, "hour")
    yield store, tables
    store.close()


def _stage_batch(store: Store, tables: cat.Tables, start: int, end: int, hour: int = 0):
    """A batch as the runtime writes it: recorded first, its file, its staged snapshot
    (its rows in the hour ``hour`` after T0)."""
    batch = new_write_id()
    store.begin_write(batch, "batch", tables=["clicks"], supervisor_id="clicks")
    table = tables.current("clicks")
    at = T0 + timedelta(hours=hour)
    d = tables.data_dir(table, batch) / f"time_chunk={at:%Y%m%dT%H%MZ}"
    d.mkdir(parents=True)
    path = d / "part-00000.parquet"
    pq.write_table(pa.table({"__time": pa.array([at + timedelta(minutes=o % 50) for o in range(start, end)],
                                                pa.timestamp("us", tz="UTC")),
                             "id": [f"k{o}" for o in range(start, end)], "__partition": ["0"] * (end - start),
                             "__offset": pa.array(range(start, end), pa.int64())}, schema=SCHEMA), path)
    summary = {cat.SUPERVISOR: "clicks", cat.BATCH: batch, cat.EPOCH: "1",
               cat.RANGES: json.dumps([["0", start, end]])}
    commit = tables.stage_append("clicks", [str(path)], summary, schema=SCHEMA, granularity="hour",
                                 write_id=batch)

    def publish():
        store.publish(supervisor_id="clicks", epoch=1, batch_id=batch, datasource="clicks",
                      ranges=[PartitionRange("0", start, end)],
                      files=[SegmentFile("x", "", "", str(path), end - start, 1)],
                      records=end - start, unparseable=0, table_commits=[commit])
        tables.committed([commit])

    return batch, publish


def _readable(tables: cat.Tables) -> tuple[list[str], int]:
    """The referenced files that are missing (the metadata file itself when the table no
    longer loads), and the rows a scan reads (-1: it cannot)."""
    try:
        table = tables.load("clicks")
    except FileNotFoundError as exc:
        return [str(exc)[:300]], -1
    gone = missing_files(table)
    rows = table.scan().to_arrow().num_rows if not gone else -1
    return gone, rows


def test_orphans_never_delete_a_batch_that_commits_after_the_table_was_read(env, monkeypatch):
    """Orphan clean-up lists the files, reads the table's metadata, then asks the database
    about the writes of the unreferenced files. A batch that commits between the read of the
    metadata and that question is unreferenced in what was read, and ``committed`` in what
    the database answers: its files (data, metadata JSON, manifests) must not be deleted."""
    store, tables = env
    _, first = _stage_batch(store, tables, 0, 10)
    first()
    _, publish = _stage_batch(store, tables, 10, 25)
    asked = store.write_statuses

    def commit_first(ids):  # the publish lands after the table was read, before the question
        publish()
        return asked(ids)

    monkeypatch.setattr(store, "write_statuses", commit_first)
    remove_orphans(tables, "clicks", store=store, older_than=timedelta(0))
    monkeypatch.undo()
    gone, rows = _readable(cat.Tables(store.engine, tables.warehouse))
    assert gone == [] and rows == 25, f"committed files deleted by orphan clean-up: {gone}"
    assert store.checkpoints("clicks") == {"0": 25}


def test_orphans_never_delete_a_compaction_that_commits_after_the_table_was_read(env, monkeypatch):
    """The same moment for a compaction: a committed compaction leaves no row in ``writes``
    and no batch, so the clean-up takes it for a write nobody recorded, fences it (which
    succeeds: the row is gone) and deletes the table's current metadata and the compacted
    files."""
    store, tables = env
    for lo, hi in ((0, 10), (10, 20), (20, 30)):
        _, publish = _stage_batch(store, tables, lo, hi)
        publish()
    at_commit, go, done = threading.Event(), threading.Event(), threading.Event()

    def hook(point, subject):
        if point == "compact-commit" and threading.current_thread().name == "compaction":
            at_commit.set()
            go.wait(30)
        return None

    outcome = {}

    def run_compaction():
        try:
            outcome["result"] = compact(cat.Tables(store.engine, tables.warehouse), "clicks", store=store,
                                        lateness=timedelta(0), now=FAR, target_file_size=1 << 30)
        finally:
            done.set()

    faults.install(hook)
    try:
        t = threading.Thread(target=run_compaction, name="compaction")
        t.start()
        assert at_commit.wait(60), "the compaction never reached its commit"
        asked = store.write_statuses

        def commit_first(ids):  # the compaction commits after the table was read
            go.set()
            assert done.wait(60)
            return asked(ids)

        monkeypatch.setattr(store, "write_statuses", commit_first)
        remove_orphans(tables, "clicks", store=store, older_than=timedelta(0))
        monkeypatch.undo()
        t.join(30)
    finally:
        faults.install(None)
        go.set()
    assert outcome["result"].committed, outcome["result"].message
    gone, rows = _readable(cat.Tables(store.engine, tables.warehouse))
    assert gone == [] and rows == 30, f"committed files deleted by orphan clean-up: {gone}"


def test_a_compaction_whose_commit_outcome_is_unknown_keeps_what_it_committed(env):
    """A compaction's commit lands but its connection drops (outcome unknown); before it
    asks the fence, an orphan clean-up finds a file of the same write that the commit does
    not reference (the output for a partition another compaction took meanwhile) and,
    seeing no row for the write (the commit deleted it), records it as discarded. The
    compaction's own fence must not then read "discarded" and delete what it committed
    (the table's current metadata and the compacted files)."""
    import sqlalchemy as sa

    store, tables = env
    for i, hour in enumerate((0, 0, 1, 1)):  # two closed hours (partitions), two files each
        _, publish = _stage_batch(store, tables, i * 10, i * 10 + 10, hour)
        publish()
    commits = {"seen": 0}
    at_first, go = threading.Event(), threading.Event()
    armed = {"drop": False}
    cleaner = Store(store.url)

    def hook(point, subject):
        if threading.current_thread().name != "compaction":
            return None
        if point == "compact-commit":
            commits["seen"] += 1
            if commits["seen"] == 1:  # the first attempt waits while another compaction commits
                at_first.set()
                go.wait(30)
            else:
                armed["drop"] = True  # the second attempt's COMMIT lands, then the connection drops
        elif point == "commit-after" and armed["drop"]:
            armed["drop"] = False
            remove_orphans(cat.Tables(cleaner.engine, tables.warehouse), "clicks", store=cleaner,
                           older_than=timedelta(0))
            raise sa.exc.OperationalError("connection dropped after COMMIT", {}, ConnectionError("test"))
        return None

    outcome = {}

    def run_compaction():
        try:
            outcome["result"] = compact(cat.Tables(store.engine, tables.warehouse), "clicks", store=store,
                                        lateness=timedelta(0), now=FAR, target_file_size=1 << 30).message
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = repr(exc)

    faults.install(hook)
    try:
        t = threading.Thread(target=run_compaction, name="compaction")
        t.start()
        assert at_first.wait(60), "the compaction never reached its commit"
        # Another compaction, for which only the first hour is closed, takes that partition.
        other = compact(cat.Tables(store.engine, tables.warehouse), "clicks", store=store,
                        lateness=timedelta(0), now=T0 + timedelta(hours=1, minutes=30), target_file_size=1 << 30)
        assert other.committed and len(other.partitions) == 1, other.message
        go.set()
        t.join(60)
    finally:
        faults.install(None)
        go.set()
        cleaner.close()
    assert commits["seen"] == 2, f"the compaction did not retry: {outcome}"
    gone, rows = _readable(cat.Tables(store.engine, tables.warehouse))
    assert gone == [] and rows == 40, f"committed files deleted: {gone} ({outcome})"


def test_a_power_cut_right_after_a_table_is_created_leaves_it_loadable(db_url, tmp_path, monkeypatch):
    """pyiceberg's own commits (creating a table, then its partition spec) write a metadata
    file and commit the catalog row pointing at it; ``ensure`` fsyncs the files only
    afterwards. A power cut in between (here: before that fsync) leaves the committed row
    pointing at a file that was never on stable storage: the table no longer loads, and
    every batch of the datasource fails from then on."""
    from tests.explorer.disk import Ledger, install, uninstall

    store = Store(db_url)
    store.migrate()
    warehouse = tmp_path / "segments"
    warehouse.mkdir()
    ledger = Ledger(warehouse)
    install(ledger)
    try:
        def power_cut(self, table):
            raise RuntimeError("power cut")

        monkeypatch.setattr(cat.Tables, "_make_durable", power_cut, raising=False)
        tables = cat.Tables(store.engine, warehouse)
        try:
            tables.ensure("clicks", SCHEMA, "hour")
        except RuntimeError:
            pass
        ledger.power_cut()
    finally:
        uninstall(ledger)
        monkeypatch.undo()
    try:
        after = cat.Tables(store.engine, warehouse)
        table = after.load("clicks")
        assert table is None or missing_files(table) == []
        after.ensure("clicks", SCHEMA, "hour")  # what the next batch does
    finally:
        store.close()


def test_orphans_never_delete_the_metadata_of_a_table_being_created(db_url, tmp_path, monkeypatch):
    """``ensure`` creates a table, then commits its partition spec with pyiceberg's own
    commit: the new metadata file (a name pyiceberg chose: no write id, so judged by age)
    is written, then the catalog row moves. An orphan clean-up with ``--orphans-older-than
    0s`` (issue 28's loop beside a daemon) that runs in between deletes it, and the row
    then points at a file that is gone: fencing, not timing, must protect it."""
    from pyiceberg.serializers import ToOutputFile

    store = Store(db_url)
    store.migrate()
    warehouse = tmp_path / "segments"
    cleaner = Store(db_url)
    write = ToOutputFile.table_metadata
    ran = []

    def write_then_clean(metadata, output_file, overwrite=False):
        write(metadata, output_file, overwrite)
        if output_file.location.rsplit("/", 1)[-1].startswith("00001-") and not ran:
            ran.append(remove_orphans(cat.Tables(cleaner.engine, warehouse), "clicks", store=cleaner,
                                      older_than=timedelta(0)))

    monkeypatch.setattr(ToOutputFile, "table_metadata", staticmethod(write_then_clean))
    try:
        cat.Tables(store.engine, warehouse).ensure("clicks", SCHEMA, "hour")
    except FileNotFoundError:
        pass
    finally:
        monkeypatch.undo()
    try:
        table = cat.Tables(store.engine, warehouse).load("clicks")
        assert missing_files(table) == [] and table.spec().fields, ran
    finally:
        cleaner.close()
        store.close()


def test_a_power_cut_after_db_upgrade_keeps_the_promoted_files_it_imported(db_url, tmp_path):
    """``db upgrade`` first finishes the promote of old-layout staged batches the database
    says committed (a rename from ``_staging/<batch>/`` to ``<D>/time_chunk=.../``), then
    imports the files in one table commit. The renames must be durable before that commit
    moves the pointer: after a power cut the table references the promoted file, and the
    table is marked imported, so no later run brings it back."""
    import sqlalchemy as sa

    from reconciler.store.tables import batches
    from reconciler.table.upgrade import import_segments
    from tests.explorer.disk import Ledger, install, uninstall

    store = Store(db_url)
    store.migrate()
    root = tmp_path / "segments"
    staged = root / "_staging" / "old1"
    staged.mkdir(parents=True)
    final = root / "clicks" / "time_chunk=20261120T1000Z" / "old1-0.parquet"
    pq.write_table(pa.table({"__time": pa.array([T0] * 5, pa.timestamp("us", tz="UTC")),
                             "id": [f"k{o}" for o in range(5)], "__partition": ["0"] * 5,
                             "__offset": pa.array(range(5), pa.int64())}, schema=SCHEMA), staged / "part.parquet")
    (staged / "_manifest.json").write_text(json.dumps({
        "datasource": "clicks", "batch_id": "old1",
        "files": [{"staging_path": str(staged / "part.parquet"), "final_path": str(final)}], "dead_files": []}))
    with store.engine.begin() as c:
        c.execute(sa.insert(batches).values(
            batch_id="old1", supervisor_id="clicks", datasource="clicks", epoch=1, status="committed",
            ranges=json.dumps([["0", 0, 5]]), rows=5, records=5, unparseable=0, committed_at=datetime.now(UTC)))
    ledger = Ledger(root)  # what the old version left is on stable storage
    install(ledger)
    try:
        result = import_segments(cat.Tables(store.engine, root), store, root, "clicks", granularity="hour")
        ledger.power_cut()
    finally:
        uninstall(ledger)
    try:
        assert result.promoted_staged_batches == 1 and result.files == 1, result
        table = cat.Tables(store.engine, root).load("clicks")
        assert missing_files(table) == [], "the import references a promoted file lost in the power cut"
        assert table.scan().to_arrow().num_rows == 5
    finally:
        store.close()
