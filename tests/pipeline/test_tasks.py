"""A batch as Arrow tasks through real Spark (local), over the stand-in stream of conftest:
every offset read once by one task, every row in exactly one file of its time chunk, dead
letters in their own files, a failing task leaving nothing, and what the tasks report."""

from __future__ import annotations

import collections
import json
import threading
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reconciler.model import DataSchema, KafkaSource, Metric, PartitionRange, source_to_document
from reconciler.pipeline import segments as seg
from reconciler.pipeline import tasks
from reconciler.pipeline.sources import split_ranges
from reconciler.pipeline.transform import chunk_of

pytestmark = pytest.mark.spark

R = PartitionRange
DS = DataSchema(
    datasource="clicks",
    timestamp_column="ts",
    timestamp_format="millis",
    dimensions=("id", "user", "__partition", "__offset"),
    metrics=(Metric("bytes", "longSum", "bytes"),),
    segment_granularity="minute",
)


def plan(fakes, tmp_path, ranges, task_count, ds=DS, reader=None, name="b1"):
    return tasks.TaskPlan(
        source=source_to_document(KafkaSource("unused:1", "t")),
        data_schema=ds,
        groups=tuple(tuple(g) for g in split_ranges(ranges, task_count)),
        data_dir=str(tmp_path / "t" / "data" / f"batch={name}"),
        dead_dir=str(tmp_path / "t_dl" / "data" / f"batch={name}"),
        store=None,
        max_batch_rows=128,
        reader=reader or fakes.FakeStreamReader,
    )


def run(spark, p):
    return seg.finish(tasks.run(spark, p), p.data_dir, p.dead_dir, "b1")


@pytest.mark.parametrize("task_count", [1, 3, 8])
def test_every_offset_once_in_one_file_of_its_chunk(spark, fakes, tmp_path, task_count):
    ranges = [R("0", 0, 1000), R("1", 500, 1700), R("2", 7, 7)]
    written = run(spark, plan(fakes, tmp_path, ranges, task_count))
    assert written.input_rows == 2200 and written.rows == 2200 and written.dead_files == ()
    assert written.read_counts == {"0": 1000, "1": 1200}  # per partition, summed over its sub-ranges' tasks
    assert written.input_bytes == sum(len(f"{p}-{o}") + len(fakes.record_value(p, o))
                                      for p, o in [("0", o) for o in range(1000)] + [("1", o) for o in range(500, 1700)])
    seen = collections.Counter()
    for f in written.files:
        t = pq.read_table(f.path)
        assert t.num_rows == f.rows and "time_chunk" not in t.column_names and f"time_chunk={f.segment}" in f.path
        assert {chunk_of(x, "minute") for x in t.column("__time").to_pylist()} == {f.segment}
        seen.update(zip(t.column("__partition").to_pylist(), t.column("__offset").to_pylist(), strict=True))
    assert set(seen.values()) == {1}
    assert sorted(seen) == [("0", o) for o in range(1000)] + [("1", o) for o in range(500, 1700)]
    on_disk = sorted(str(p) for p in tmp_path.rglob("*") if p.is_file())
    assert on_disk == sorted(f.path for f in written.files)  # nothing else: no _SUCCESS, no list


def test_dead_letters_go_to_their_own_files(spark, fakes, tmp_path):
    written = run(spark, plan(fakes, tmp_path, [R("0", 0, 1000)], 2, reader=fakes.OddStreamReader))
    assert written.rows == 990 and written.dead_rows == 10 and written.input_rows == 1000
    dead = pa.concat_tables([pq.read_table(f.path) for f in written.dead_files])
    assert sorted(dead.column("offset").to_pylist()) == list(range(0, 1000, 100))
    assert set(dead.column("reason").to_pylist()) == {"invalid JSON: not a JSON object"}
    assert set(dead.column("value").to_pylist()) == {b"{broken"}
    assert all(f.segment is None for f in written.dead_files)


def test_a_failing_task_fails_the_batch_and_leaves_no_file(spark, fakes, tmp_path, monkeypatch):
    monkeypatch.setattr("reconciler.pipeline.sink.ROW_GROUP_ROWS", 64)  # driver only: files are flushed anyway
    p = plan(fakes, tmp_path, [R("0", 0, 5000)], 2, reader=fakes.FailingStreamReader)
    with pytest.raises(Exception, match="the broker went away"):
        tasks.run(spark, p)
    assert not [x for x in tmp_path.rglob("*") if x.is_file()]


def test_rollup_is_aggregated_in_each_task(spark, fakes, tmp_path):
    ds = replace(DS, dimensions=("user",), rollup=True, query_granularity="hour", segment_granularity="hour",
                 metrics=(Metric("n", "count"), Metric("bytes", "longSum", "bytes")))
    written = run(spark, plan(fakes, tmp_path, [R("0", 0, 3000)], 1, ds=ds))
    rows = pa.concat_tables([pq.read_table(f.path) for f in written.files]).to_pylist()
    assert written.input_rows == 3000
    by_key = collections.Counter()
    for r in rows:
        by_key[(r["__time"], r["user"])] += 1
    assert set(by_key.values()) == {1}  # one task: one row per key
    assert sum(r["n"] for r in rows) == 3000
    assert sum(r["bytes"] for r in rows) == sum(o % 1000 for o in range(3000))


def test_a_batch_from_a_new_thread(spark, fakes, tmp_path):
    # Runtimes run batches from pool threads, each with its own JVM thread.
    out: list = []
    t = threading.Thread(target=lambda: out.append(run(spark, plan(fakes, tmp_path, [R("0", 0, 50)], 1))))
    t.start()
    t.join()
    assert [w.rows for w in out] == [50]


def test_a_task_reads_with_the_collector_paused_and_jemalloc(spark, fakes, tmp_path):
    """In the Spark worker itself, where the task's records are made; and back on after it."""
    import gc

    written = run(spark, plan(fakes, tmp_path, [R("0", 0, 500), R("1", 0, 300)], 2,
                              reader=fakes.CollectorCheckingReader))
    assert written.rows == 800 and written.read_counts == {"0": 500, "1": 300}
    on = spark.sparkContext.parallelize(range(2), 2).map(lambda _: gc.isenabled()).collect()
    assert on == [True, True]  # the workers' collector after the tasks


def test_no_ranges_no_job(spark, fakes, tmp_path):
    assert tasks.run(spark, plan(fakes, tmp_path, [R("0", 5, 5)], 3)) == tasks.TaskResults((), 0, 0)


def test_the_plan_carries_no_secret(fakes, tmp_path):
    source = KafkaSource("b:1", "t", {"sasl.password": "${env:KAFKA_PW}"})
    p = replace(plan(fakes, tmp_path, [R("0", 0, 1)], 1), source=source_to_document(source))
    assert "${env:KAFKA_PW}" in json.dumps(p.source)  # the reference; the task resolves it


@pytest.mark.parametrize("task_count", [1, 3])
def test_the_rdd_job_and_the_arrow_job_report_the_same(spark, fakes, tmp_path, task_count):
    """A classic session runs a batch as an RDD of task indices; Spark Connect, which has no
    RDDs, as ``mapInArrow``. The same plan gives the same rows, dead letters and counts."""
    ranges = [R("0", 0, 700), R("1", 100, 600)]
    by_path = {}
    for name, collect in (("rdd", lambda p: tasks._collect_rdd(spark.sparkContext, p, len(p.groups))),
                          ("frame", lambda p: tasks._collect_frame(spark, p, len(p.groups)))):
        p = plan(fakes, tmp_path / name, ranges, task_count, reader=fakes.OddStreamReader, name=name)
        rows = collect(p)
        by_path[name] = sorted((r.kind, r.chunk, int(r.rows), int(r.bytes)) for r in rows)
        assert all(r.path for r in rows if r.kind in (tasks.DATA, tasks.DEAD))
    assert by_path["rdd"] == by_path["frame"]
    assert sum(n for kind, _, n, _ in by_path["rdd"] if kind == tasks.READ) == 1200
    assert sum(n for kind, _, n, _ in by_path["rdd"] if kind == tasks.DEAD) == 12  # every 100th offset


def test_a_classic_session_runs_the_rdd_job_and_connect_the_arrow_one(spark):
    assert tasks._context(spark) is spark.sparkContext

    class ConnectSession:  # what pyspark.sql.connect's session is, as far as the choice goes
        @property
        def sparkContext(self):
            raise AssertionError("never asked: Spark Connect has no SparkContext")

    ConnectSession.__module__ = "pyspark.sql.connect.session"
    assert tasks._context(ConnectSession()) is None

    class NoContext:
        @property
        def sparkContext(self):
            raise RuntimeError("[JVM_ATTRIBUTE_NOT_SUPPORTED]")

    assert tasks._context(NoContext()) is None
