"""What the external-catalog tests share: a store with supervisors on moto's Glue and S3, a
batch's real Parquet files written where the runtime writes them and recorded in flight, its
snapshot summary, and what the table holds read back through pyiceberg's own GlueCatalog.
Only the Spark job that would have written the files is left out."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.glue import GlueCatalog

from reconciler.model import SupervisorSpec
from reconciler.store.store import Store
from reconciler.table import storage
from reconciler.table.summary import BATCH, EPOCH, RANGES, RECORDS, SUPERVISOR
from reconciler.table.writeids import new_write_id

SCHEMA = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("id", pa.string())])
DEAD = pa.schema([("raw", pa.string())])


@dataclass
class File:
    path: str
    rows: int
    segment: str = ""
    bytes: int = 0


@dataclass
class Written:
    batch_id: str
    files: list
    dead_files: list = field(default_factory=list)
    dead_rows: int = 0


@dataclass
class DS:
    datasource: str = "clicks"
    segment_granularity: str | None = None
    rollup: bool = False


def store_with(db_url: str, *sids: str) -> Store:
    """A migrated store with Kafka supervisors ``sids`` writing datasource clicks, each at
    checkpoint 0 of partition 0."""
    store = Store(db_url)
    store.migrate()
    for sid in sids:
        store.create_supervisor(SupervisorSpec.from_document({
            "id": sid, "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": sid},
            "dataSchema": {"datasource": "clicks", "timestamp": {"column": "ts"}}}), None, actor="test")
        store.init_checkpoints(sid, {"0": 0})
    return store


def ensure_tables(tables) -> None:
    tables.ensure("clicks", SCHEMA, None, rollup=False)
    tables.ensure("clicks_deadletter", DEAD, None)


def write_batch(tables, store, sid: str, start: int, end: int, *, key: str | None = None,
                dead: bool = False) -> Written:
    """Offsets ``[start, end)`` of partition 0 as one Parquet file of ids ``<key>-<offset>``
    (one dead letter too with ``dead``), recorded in flight as the runtime records a batch."""
    key = key or sid
    batch_id = new_write_id()
    store.begin_write(batch_id, "batch", tables=["clicks", "clicks_deadletter"], supervisor_id=sid)
    path = f"{tables.data_dir(tables.load('clicks'), batch_id)}/p.parquet"
    buf = io.BytesIO()
    pq.write_table(pa.table({"__time": pa.array(list(range(start, end)), pa.timestamp("us", tz="UTC")),
                             "id": [f"{key}-{o}" for o in range(start, end)]}, schema=SCHEMA), buf)
    storage.at(path).write_bytes(path, buf.getvalue())
    written = Written(batch_id, [File(path, end - start)])
    if dead:
        dpath = f"{tables.data_dir(tables.load('clicks_deadletter'), batch_id)}/d.parquet"
        buf = io.BytesIO()
        pq.write_table(pa.table({"raw": [f"bad-{key}-{start}"]}, schema=DEAD), buf)
        storage.at(dpath).write_bytes(dpath, buf.getvalue())
        written.dead_files, written.dead_rows = [File(dpath, 1)], 1
    return written


def summary(rec, written, ranges) -> dict[str, str]:
    return {SUPERVISOR: rec.id, BATCH: written.batch_id, EPOCH: str(rec.epoch),
            RECORDS: str(sum(r.size for r in ranges)),
            RANGES: json.dumps([[r.partition, r.start, r.end] for r in ranges])}


def ids(glue, table: str = "clicks") -> list[str]:
    """The table's ids (a dead-letter table's raw values), sorted, read through GlueCatalog."""
    catalog = GlueCatalog("reader", **glue["properties"])
    data = catalog.load_table((glue["database"], table)).scan().to_arrow()
    return sorted(data.column("id" if "id" in data.column_names else "raw").to_pylist())


def referenced_files(glue, table: str = "clicks") -> list[str]:
    catalog = GlueCatalog("reader", **glue["properties"])
    return [t.file.file_path for t in catalog.load_table((glue["database"], table)).scan().plan_files()]
