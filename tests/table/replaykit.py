"""A batch as the product publishes it, without brokers or Spark: raw values through the
real ``Transformer``, Parquet files through the real ``sink.Files``, both tables staged
and published with the checkpoints in the real transaction. For the replay tests
(``test_replay.py``) and the explorer's replay actor."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa

from reconciler.model import SEGMENT, PartitionRange, SupervisorSpec
from reconciler.pipeline import sink
from reconciler.pipeline.transform import Transformer
from reconciler.store.store import Store
from reconciler.table import catalog as cat
from reconciler.table.writeids import new_write_id

T0 = datetime(2026, 11, 20, 10, tzinfo=UTC)


def spec_document(sid: str = "clicks", fmt: str = "millis", datasource: str = "clicks", column: str = "ts") -> dict:
    return {"id": sid, "source": {"type": "kafka", "bootstrapServers": "127.0.0.1:9092", "topic": sid},
            "dataSchema": {"datasource": datasource, "timestamp": {"column": column, "format": fmt},
                           "dimensions": ["id", "__partition", "__offset"]}}


def create(store: Store, sid: str = "clicks", fmt: str = "millis") -> None:
    store.create_supervisor(SupervisorSpec.from_document(spec_document(sid, fmt)), None, actor="test")
    store.init_checkpoints(sid, {"0": 0})


def set_format(store: Store, sid: str, fmt: str, column: str = "ts") -> None:
    """The spec fixed (as apply records a changed file)."""
    store.update_spec(SupervisorSpec.from_document(spec_document(sid, fmt, column=column)), None, actor="test")


def values(start: int, end: int, bad_every: int = 2) -> list[bytes]:
    """Every ``bad_every``-th record has an ISO ``ts`` (dead under ``millis``), one in ten
    an unparseable one (dead under every format); the others epoch millis."""
    out = []
    for o in range(start, end):
        if o % 10 == 9:
            ts = '"not a time"'
        elif o % bad_every == 0:
            ts = '"2026-11-20T10:00:00Z"'
        else:
            ts = str(int(T0.timestamp() * 1000) + o)
        out.append(f'{{"id":"r{o}","ts":{ts}}}'.encode())
    return out


def publish(store: Store, tables: cat.Tables, sid: str, start: int, end: int, raw: list[bytes] | None = None) -> str:
    """Ingest offsets [start, end) of partition 0 as one batch; returns its batch id."""
    rec = store.get(sid)
    ds = rec.spec.data_schema
    raw = raw if raw is not None else values(start, end)
    batch = new_write_id()
    dead_name = cat.deadletter_table(ds.datasource)
    store.begin_write(batch, "batch", tables=[ds.datasource, dead_name], supervisor_id=sid)
    t = Transformer(ds)
    records = pa.RecordBatch.from_arrays(
        [pa.array(["0"] * len(raw)), pa.array(range(start, end), pa.int64()),
         pa.array([f"k{o}".encode() for o in range(start, end)], pa.binary()), pa.array(raw, pa.binary()),
         pa.array([T0] * len(raw), pa.timestamp("us", tz="UTC"))],
        names=["partition", "offset", "key", "value", "stream_time"])
    out = t(records)
    rows_schema = t.rows_schema
    table = tables.ensure(ds.datasource, rows_schema, ds.segment_granularity, rollup=ds.rollup)
    dead_table = tables.ensure(dead_name, out.dead.schema, None)
    data_dir, dead_dir = str(tables.data_dir(table, batch)), str(tables.data_dir(dead_table, batch))
    rows = sink.Files(data_dir, "part-0", SEGMENT)
    rows.add_table(out.rows)
    data_paths = [f"{data_dir}/{w.name}" for w in rows.close()]
    dead = sink.Files(dead_dir, "part-0", None)
    dead.add_table(out.dead)
    dead_paths = [f"{dead_dir}/{w.name}" for w in dead.close()]
    summary = {cat.SUPERVISOR: sid, cat.BATCH: batch, cat.EPOCH: str(rec.epoch), cat.DATASOURCE: ds.datasource,
               cat.RANGES: json.dumps([["0", start, end]]), cat.READ: json.dumps({"0": end - start}),
               cat.RECORDS: str(end - start), cat.UNPARSEABLE: str(out.dead.num_rows)}
    for attempt in range(10):
        commits = [tables.stage_append(ds.datasource, data_paths, summary, schema=rows_schema,
                                       granularity=ds.segment_granularity, write_id=batch, attempt=attempt)]
        if dead_paths:
            commits.append(tables.stage_append(dead_name, dead_paths, summary, schema=out.dead.schema,
                                               write_id=batch, attempt=attempt))
        try:
            store.publish(supervisor_id=sid, epoch=rec.epoch, batch_id=batch, datasource=ds.datasource,
                          ranges=[PartitionRange("0", start, end)], files=[], records=end - start,
                          unparseable=out.dead.num_rows, table_commits=commits)
        except Exception as exc:  # noqa: BLE001 - a replay moved a table: stage again, as the runtime does
            tables.discard_staged(commits)
            if type(exc).__name__ != "TableConflict" or attempt == 9:
                raise
            continue
        tables.committed(commits)
        return batch
    raise AssertionError("unreachable")


def table_offsets(tables: cat.Tables, name: str) -> list[int]:
    t = tables.load(name)
    if t is None:
        return []
    col = "__offset" if name == "clicks" else "offset"
    return sorted(t.scan(selected_fields=(col,)).to_arrow().column(col).to_pylist())
