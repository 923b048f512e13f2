"""Adversarial schedules and inputs for a batch's Arrow tasks (``reconciler.pipeline.tasks``)
run outside Spark: what one task reads, writes and reports."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

from reconciler.model import DataSchema, KafkaSource, PartitionRange, source_to_document
from reconciler.pipeline import segments as seg
from reconciler.pipeline import tasks
from reconciler.streams.base import RECORD_SCHEMA

BASE_MS = 1_763_640_000_000  # 2025-11-20T12:00:00Z
DS = DataSchema(datasource="clicks", timestamp_column="ts", timestamp_format="millis",
                dimensions=("id", "__offset"), segment_granularity="hour")


class BogusStreamTimeReader:
    """Records whose stream time (a Kafka CreateTime the producer set) is in nanoseconds by
    mistake: 1.76e18 "milliseconds", beyond a 64-bit count of microseconds."""

    def __init__(self, source=None):
        self.source = source

    def read(self, rng: PartitionRange, max_batch_rows: int = 65536):
        offsets = list(range(rng.start, rng.end))
        stamps = [BASE_MS + o if o % 2 else (BASE_MS + o) * 1_000_000 for o in offsets]
        yield pa.RecordBatch.from_arrays(
            [pa.array([rng.partition] * len(offsets), pa.string()),
             pa.array(offsets, pa.int64()),
             pa.array([str(o).encode() for o in offsets], pa.binary()),
             pa.array([json.dumps({"id": str(o), "ts": BASE_MS + o}).encode() for o in offsets], pa.binary()),
             pa.array(stamps, pa.timestamp("ms", tz="UTC"))],
            schema=RECORD_SCHEMA)


def _plan(tmp_path, groups, reader, ds=DS):
    return tasks.TaskPlan(source=source_to_document(KafkaSource("unused:1", "t")), data_schema=ds,
                          groups=groups, data_dir=str(tmp_path / "t" / "data" / "batch=b1"),
                          dead_dir=str(tmp_path / "t_dl" / "data" / "batch=b1"), store=None,
                          max_batch_rows=128, reader=reader)


def _run(plan) -> seg.WrittenBatch:
    """The tasks of ``plan`` one after the other, as Spark would run them, then ``finish``."""
    rows = []
    for group in plan.groups:
        rows += tasks.one_task(plan, group)
    files = tuple(tasks.FileDescription(r["kind"], r["path"], r["chunk"], r["rows"], r["bytes"])
                  for r in rows if r["kind"] != tasks.READ)
    results = tasks.TaskResults(files, sum(r["rows"] for r in rows if r["kind"] == tasks.READ),
                                sum(r["bytes"] for r in rows if r["kind"] == tasks.READ))
    return seg.finish(results, plan.data_dir, plan.dead_dir, "b1", fsync=False)


def test_a_stream_time_beyond_microseconds_does_not_fail_the_task(tmp_path):
    # The datasource does not even read the stream time; the reader's batch is cast from
    # milliseconds to microseconds (sources.conform), which overflowed and failed the task:
    # every retry of the batch read the same record and failed again (a poison record).
    written = _run(_plan(tmp_path, ((PartitionRange("0", 0, 10),),), BogusStreamTimeReader))
    assert written.input_rows == 10 and written.rows + written.dead_rows == 10
    got = pa.concat_tables([pq.read_table(f.path) for f in written.files])
    assert sorted(got.column("__offset").to_pylist()) == list(range(10))


def test_a_stream_time_beyond_microseconds_is_null(tmp_path):
    from dataclasses import replace

    ds = replace(DS, timestamp_column="__stream_time")
    written = _run(_plan(tmp_path, ((PartitionRange("0", 0, 10),),), BogusStreamTimeReader, ds=ds))
    assert written.rows == 5 and written.dead_rows == 5
    dead = pa.concat_tables([pq.read_table(f.path) for f in written.dead_files])
    assert sorted(dead.column("offset").to_pylist()) == [0, 2, 4, 6, 8]
    assert set(dead.column("reason").to_pylist()) == {"missing timestamp column '__stream_time'"}


def test_a_stream_time_out_of_range_is_named_as_spark_wrote_it():
    # The dead letter's reason names the stream time as Spark's cast to string wrote it
    # (transform._spark_time_text): "2025-11-20 12:34:56.789", no fraction when whole.
    # Arrow's %S already carries the fraction (".789000"): it came twice.
    from reconciler.pipeline.transform import Transformer
    from tests.pipeline.test_transform import records

    ms = [253_402_300_800_000, 253_402_300_800_789, -62_135_596_800_500]  # 10000-01-01, and 0000-12-31
    out = Transformer(DataSchema(datasource="d", timestamp_column="__stream_time"))(
        records([{"a": 1}] * 3, stream_ms=ms))
    assert out.dead.column("reason").to_pylist() == [
        "timestamp out of range (years 1 to 9999): 10000-01-01 00:00:00",
        "timestamp out of range (years 1 to 9999): 10000-01-01 00:00:00.789",
        "timestamp out of range (years 1 to 9999): 0000-12-31 23:59:59.5",
    ]
