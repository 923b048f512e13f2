"""``maintain`` on the lake's catalog (issue 44): expiry and orphan clean-up of tables in
moto's Glue, the warehouse in moto's S3, the real store (SQLite and PostgreSQL) and the real
publish (``runtime.publish_external``). Only the Spark job that would write a batch's files
is left out: the files are real Parquet objects in the bucket.

The rule under test: no file is deleted while a process may still commit it, nor while the
table's current metadata or a version a reader may hold references it."""

from __future__ import annotations

import io
from datetime import timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.glue import GlueCatalog

from reconciler import faults
from reconciler.model import PartitionRange, SupervisorSpec
from reconciler.runtime.supervisor import RuntimeContext
from reconciler.store.store import Store
from reconciler.table import storage, summary
from reconciler.table.catalogs import fence
from reconciler.table.catalogs.external import ExternalTables
from reconciler.table.expire import expire_snapshots
from reconciler.table.orphans import remove_orphans
from reconciler.table.summary import BATCH, EPOCH, RANGES, RECORDS, SUPERVISOR
from reconciler.table.writeids import new_write_id
from tests.catalogs.glueworld import DS, SCHEMA, File, Written

DEAD = pa.schema([("raw", pa.string())])


def _context(glue, store, *, kept: int = 1000, grace: float = 0.0,
             granularity: str | None = None) -> tuple[RuntimeContext, ExternalTables]:
    ctx = RuntimeContext(store=store, segments_dir=f"s3://{glue['bucket']}/wh", spark=lambda: None,
                         catalog=glue["setting"], snapshots_kept=kept, reader_grace=grace)
    tables = ctx.tables()
    assert isinstance(tables, ExternalTables)
    tables.ensure("clicks", SCHEMA, granularity, rollup=False)
    tables.ensure("clicks_deadletter", DEAD, None)
    return ctx, tables


@pytest.fixture
def store(db_url):
    store = Store(db_url)
    store.migrate()
    store.create_supervisor(SupervisorSpec.from_document({
        "id": "clicks", "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": "clicks"},
        "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"}}}), None, actor="test")
    store.init_checkpoints("clicks", {"0": 0})
    yield store
    store.close()


def _step(ctx, store, tables, *, before_publish=None) -> Written:
    """One batch of 5 records as the runtime publishes it: fence read, checkpoints, files, commit."""
    rec = store.get("clicks")
    head = ctx.publisher().prepare(rec, "clicks")
    start = store.checkpoints("clicks")["0"]
    ranges = [PartitionRange("0", start, start + 5)]
    batch_id = new_write_id()
    store.begin_write(batch_id, "batch", tables=["clicks", "clicks_deadletter"], supervisor_id="clicks")
    path = f"{tables.data_dir(tables.load('clicks'), batch_id)}/p.parquet"
    _put(path, pa.table({"__time": pa.array(list(range(start, start + 5)), pa.timestamp("us", tz="UTC")),
                         "id": [f"clicks-{o}" for o in range(start, start + 5)]}, schema=SCHEMA))
    written = Written(batch_id, [File(path, 5)])
    props = {SUPERVISOR: "clicks", BATCH: batch_id, EPOCH: str(rec.epoch), RECORDS: "5",
             RANGES: f'[["0", {start}, {start + 5}]]'}
    if before_publish:
        before_publish()
    ctx.publisher().publish(rec, DS(), written, props, [], SCHEMA, DEAD, ranges, 5, head=head)
    return written


def _put(path: str, table: pa.Table) -> None:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    storage.at(path).write_bytes(path, buf.getvalue())


def _glue_table(glue, name: str = "clicks"):
    return GlueCatalog("reader", **glue["properties"]).load_table((glue["database"], name))


def _ids(glue) -> list[str]:
    return sorted(_glue_table(glue).scan().to_arrow().column("id").to_pylist())


def _tiling(table) -> list[tuple[int, int]]:
    """The offsets of supervisor clicks the table accounts for: expired (folded) and live
    ranges, merged; exactly once is one range from 0, with nothing counted twice."""
    pieces = [(s, e) for _, s, e in summary.expired_ranges(table.properties).get("clicks", [])]
    for snap in table.metadata.snapshots:
        props = dict(snap.summary.additional_properties) if snap.summary else {}
        if props.get(SUPERVISOR) == "clicks":
            pieces += [(s, e) for _, s, e in summary.summary_ranges(props)]
    pieces.sort()
    merged: list[tuple[int, int]] = []
    for s, e in pieces:
        assert not merged or s >= merged[-1][1], f"offsets {s}-{e} counted twice: {pieces}"
        if merged and s == merged[-1][1]:
            merged[-1] = (merged[-1][0], e)
        else:
            merged.append((s, e))
    return merged


def test_expiry_commits_to_glue_keeps_the_fence_tags_and_the_ranges(glue, store):
    ctx, tables = _context(glue, store)
    for _ in range(6):
        _step(ctx, store, tables)
    head = _glue_table(glue).metadata.refs[fence.tag_name("clicks")].snapshot_id
    result = expire_snapshots(tables, "clicks", store=store, older_than=timedelta(0), retain_last=1)
    assert result.committed, result.message
    assert result.expired_snapshots == 5
    table = _glue_table(glue)
    assert table.metadata.snapshot_by_id(head) is not None  # the fence tag's snapshot stays
    assert table.current_snapshot().summary.additional_properties[summary.OPERATION] == "expire"
    assert _tiling(table) == [(0, 30)]
    assert _ids(glue) == sorted(f"clicks-{o}" for o in range(30))
    assert store.writes_in_flight() == [] and [w for w in store.discarded_writes() if w.kind == "expire"] == []
    # the fence chain still works: the next batch commits on the tag as the expiry left it
    _step(ctx, store, tables)
    assert store.checkpoints("clicks") == {"0": 35}
    assert _tiling(_glue_table(glue)) == [(0, 35)]


def test_a_publish_staged_before_an_expiry_does_not_undo_it(glue, store):
    """Glue applies a commit's updates to the table as it is when the commit arrives: a
    publish that expires its own old snapshots, staged before a ``maintain`` expiry and
    committed after it, set ``reconciler.expired-ranges`` from its older base (the expiry's
    folded ranges lost) or removed snapshots that were gone already. The expiry's commit now
    moves ``main``, so the publish's requirement on it refuses and the publish stages again."""
    ctx, tables = _context(glue, store, kept=3)
    for _ in range(8):  # 8 snapshots: the next publish expires beyond 3 (more than SLACK 5 go)
        _step(ctx, store, tables)
    expired = []

    def hook(name, subject):
        if name == "external-commit" and subject == "clicks" and not expired:
            # the publish has staged on the table as it was; maintain expires under it
            expired.append(expire_snapshots(tables, "clicks", store=store, older_than=timedelta(0),
                                            retain_last=2))

    faults.install(hook)
    try:
        _step(ctx, store, tables)
    finally:
        faults.install(None)
    assert expired and expired[0].committed, expired
    table = _glue_table(glue)
    assert _tiling(table) == [(0, 45)]
    assert _ids(glue) == sorted(f"clicks-{o}" for o in range(45))
    assert store.checkpoints("clicks") == {"0": 45}


def test_orphans_on_s3_deletes_only_what_nothing_may_commit(glue, store):
    ctx, tables = _context(glue, store)
    for _ in range(3):
        _step(ctx, store, tables)
    location = tables.location("clicks")
    files = storage.at(location)
    # a batch whose publish lost (fenced: discarded), and a batch still being written
    lost, live = new_write_id(), new_write_id()
    for wid in (lost, live):
        store.begin_write(wid, "batch", tables=["clicks"], supervisor_id="clicks")
        _put(f"{tables.data_dir(tables.load('clicks'), wid)}/p.parquet", pa.table({"id": ["x"]}))
    assert store.fence_write(lost)
    # the metadata file a Glue commit writes before it moves the pointer: no write id, newer
    table = tables.load("clicks")
    version = int(table.metadata_location.rsplit("/", 1)[-1].split("-", 1)[0])
    in_flight = files.join(location, "metadata", f"{version + 1:05d}-{new_write_id()}.metadata.json")
    files.write_bytes(in_flight, b"{}")
    referenced_before = {p for p in files.list(location) if "/data/" in p and lost not in p and live not in p}

    result = remove_orphans(tables, "clicks", store=store, older_than=timedelta(0))

    left = set(files.list(location))
    assert [p for p in result.deleted_files if lost in p] and not [p for p in left if lost in p]
    assert [p for p in left if live in p], "a batch still being written lost its files"
    assert in_flight in left, "the metadata file of a commit in flight was deleted"
    assert referenced_before <= left
    assert _ids(glue) == sorted(f"clicks-{o}" for o in range(15))
    assert result.kept_in_flight >= 2


def test_a_compaction_between_its_two_commits_keeps_its_files(glue, store):
    """An external maintenance write is finished in the database before the catalog's
    commit. It stays recorded (``committing``) until the catalog answered: orphan clean-up
    run in between took the deleted row for "committed, superseded" and deleted the files
    the catalog's commit was about to reference."""
    from reconciler.table.compact import compact

    ctx, tables = _context(glue, store, granularity="hour")
    for _ in range(4):
        _step(ctx, store, tables)
    cleaned = []
    # The compaction's catalog commit runs ``ExternalCommit.commit``: orphan clean-up is run
    # at that moment by wrapping the commit of the store's external path.
    real = store._commit_external

    def between(write_id, kind, commits):
        wrapped = []
        for tc in commits:
            def commit(tc=tc):
                cleaned.append(remove_orphans(tables, "clicks", store=store, older_than=timedelta(0)))
                tc.commit()
            wrapped.append(type(tc)(tc.table, tc.expected, tc.staged, tc.write_id, commit))
        return real(write_id, kind, wrapped)

    store._commit_external = between
    result = compact(tables, "clicks", store=store, lateness=timedelta(0))
    assert result.committed, result.message
    assert cleaned and not [p for p in cleaned[0].deleted_files if "/compacted/" in p], cleaned[0].deleted_files
    assert _ids(glue) == sorted(f"clicks-{o}" for o in range(20))  # every file the table lists is there
    assert store.writes_in_flight() == []
