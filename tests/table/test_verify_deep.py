"""``verify --deep`` where a (partition, offset) names more than one record: two sources
in one datasource (two supervisors, or one supervisor across a ``freshStart``). No record
is in the table twice, so deep must pass; a record that is, must still fail it.

A real pyiceberg catalog in the metadata database (SQLite and PostgreSQL), data files
written with pyarrow, the real publish transaction and the real ``reconciler verify``."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reconciler.model import PartitionRange, SupervisorSpec
from reconciler.store.store import SegmentFile, Store
from reconciler.table import catalog as cat
from reconciler.table.writeids import new_write_id
from tests.e2e import helpers as h

T0 = datetime(2026, 11, 20, 10, tzinfo=UTC)
SCHEMA = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("id", pa.string()),
                    ("__partition", pa.string()), ("__offset", pa.int64())])


@pytest.fixture
def setup(db_url, tmp_path):
    s = h.make_settings(tmp_path, db=db_url)
    store = Store(db_url)
    store.migrate()
    for sid in ("clicks", "views"):  # two topics into one datasource
        store.create_supervisor(SupervisorSpec.from_document({
            "id": sid, "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": sid},
            "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"},
                           "dimensions": ["id", "__partition", "__offset"]}}), None, actor="test")
        store.init_checkpoints(sid, {"0": 0})
    tables = cat.Tables(store.engine, s.segments_dir)
    yield s, store, tables
    store.close()


def _publish(store: Store, tables: cat.Tables, sid: str, start: int, end: int, keys=None) -> None:
    batch = new_write_id()
    store.begin_write(batch, "batch", tables=["clicks"], supervisor_id=sid)
    table = tables.ensure("clicks", SCHEMA, "hour")
    d = tables.data_dir(table, batch) / "time_chunk=20261120T1000Z"
    d.mkdir(parents=True)
    path = d / "part-0.parquet"
    offsets = keys if keys is not None else list(range(start, end))
    pq.write_table(pa.table({"__time": pa.array([T0] * len(offsets), pa.timestamp("us", tz="UTC")),
                             "id": [f"{sid}-{o}" for o in offsets], "__partition": ["0"] * len(offsets),
                             "__offset": pa.array(offsets, pa.int64())}, schema=SCHEMA), path)
    summary = {cat.SUPERVISOR: sid, cat.BATCH: batch, cat.EPOCH: "1", cat.RANGES: json.dumps([["0", start, end]]),
               cat.READ: json.dumps({"0": end - start})}
    commit = tables.stage_append("clicks", [str(path)], summary, schema=SCHEMA, granularity="hour", write_id=batch)
    store.publish(supervisor_id=sid, epoch=1, batch_id=batch, datasource="clicks",
                  ranges=[PartitionRange("0", start, end)], files=[SegmentFile("x", "", "", str(path), len(offsets), 1)],
                  records=end - start, unparseable=0, table_commits=[commit])
    tables.committed([commit])


def test_two_sources_in_one_datasource_pass_deep_verify(setup):
    """Offsets 0..20 of partition 0 of two topics: 40 records, each once."""
    s, store, tables = setup
    _publish(store, tables, "clicks", 0, 10)
    _publish(store, tables, "views", 0, 10)
    _publish(store, tables, "clicks", 10, 20)
    _publish(store, tables, "views", 10, 20)
    assert tables.load("clicks").scan().to_arrow().num_rows == 40
    code, out = h.run_cli(s, "verify", "clicks", "--deep", "-o", "json")
    report = json.loads(out)
    assert code == 0 and report["ok"], report["deep"]


def test_a_record_twice_still_fails_deep_verify_beside_another_source(setup):
    """The same layout, but one batch of ``views`` holds offset 3 twice (and not 4)."""
    s, store, tables = setup
    _publish(store, tables, "clicks", 0, 10)
    _publish(store, tables, "views", 0, 10, keys=[0, 1, 2, 3, 3, 5, 6, 7, 8, 9])
    code, out = h.run_cli(s, "verify", "clicks", "--deep", "-o", "json")
    report = json.loads(out)
    assert code == 1 and not report["ok"]
    assert report["deep"]["duplicateOffsets"] == 1 and report["deep"]["missing"] == [{"partition": "0", "records": 1}]
