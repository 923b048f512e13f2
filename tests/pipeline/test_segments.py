"""Writing a batch's data files: where they go, what is left there, discard and recovery listing."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reconciler.model import DataSchema, Metric
from reconciler.pipeline import segments as seg
from reconciler.pipeline.sources import ARROW_SCHEMA
from reconciler.pipeline.transform import transform

HOUR_MS = 3600_000
T0_MS = 1_763_640_000_000  # 2025-11-20T12:00:00Z

DS = DataSchema(
    datasource="clicks",
    timestamp_column="ts",
    dimensions=("id", "user", "__offset"),
    metrics=(Metric("count", "count"), Metric("bytes", "longSum", "bytes")),
    segment_granularity="hour",
)


def frames(spark, n=300, bad=(), hours=3):
    values = [b"{broken" if i in bad else json.dumps(
        {"id": f"r{i}", "ts": T0_MS + (i * hours * HOUR_MS) // n, "user": f"u{i % 3}", "bytes": i}).encode()
        for i in range(n)]
    table = pa.table({
        "partition": pa.array(["0"] * n),
        "offset": pa.array(range(n), pa.int64()),
        "key": pa.array([f"r{i}".encode() for i in range(n)], pa.binary()),
        "value": pa.array(values, pa.binary()),
        "stream_time": pa.array([T0_MS * 1000] * n, pa.timestamp("us", tz="UTC")),
    }, schema=ARROW_SCHEMA)
    # Two Spark partitions, so a chunk can get one file per task.
    return transform(spark.createDataFrame(table).repartition(2), DS)


@pytest.mark.spark
def test_files_lie_in_one_chunk_each_and_nothing_else_is_left(spark, tmp_path):
    good, dead = frames(spark, bad={5, 17})
    data, dead_dir = tmp_path / "t" / "data" / "batch=b1", tmp_path / "t_dl" / "data" / "batch=b1"
    written = seg.write_batch(spark, good, dead, data, dead_dir, "b1")
    assert written.rows == 298 and written.dead_rows == 2
    assert {f.segment for f in written.files} == {"20251120T1200Z", "20251120T1300Z", "20251120T1400Z"}
    on_disk = sorted(str(p) for p in tmp_path.rglob("*") if p.is_file())
    assert on_disk == sorted(f.path for f in (*written.files, *written.dead_files))  # no _SUCCESS, no .crc
    for f in written.files:
        t = pq.read_table(f.path)
        assert t.num_rows == f.rows and "time_chunk" not in t.column_names
        assert t.schema.field("__time").type == pa.timestamp("us", tz="UTC")
        hours = {x.replace(minute=0, second=0, microsecond=0) for x in t.column("__time").to_pylist()}
        assert len(hours) == 1 and f"time_chunk={f.segment}" in f.path
    ids = sorted(i for f in written.files for i in pq.read_table(f.path).column("id").to_pylist())
    assert ids == sorted(f"r{i}" for i in range(300) if i not in (5, 17))
    reasons = [r for f in written.dead_files for r in pq.read_table(f.path).column("reason").to_pylist()]
    assert reasons == ["invalid JSON: not a JSON object"] * 2


@pytest.mark.spark
def test_no_dead_letters_no_dead_files(spark, tmp_path):
    good, dead = frames(spark, n=50)
    written = seg.write_batch(spark, good, dead, tmp_path / "d", tmp_path / "dl", "b2", dead_count=lambda: 0)
    assert written.dead_files == () and not (tmp_path / "dl").exists() and written.rows == 50


@pytest.mark.spark
def test_dead_letter_frame_is_built_only_when_there_are_dead_letters(spark, tmp_path):
    built = []

    def build(frame):
        def dead():
            built.append(1)
            return frame
        return dead

    good, dead = frames(spark, n=50)
    written = seg.write_batch(spark, good, build(dead), tmp_path / "d", tmp_path / "dl", "b4", dead_count=lambda: 0)
    assert built == [] and written.dead_files == () and written.rows == 50
    good, dead = frames(spark, n=50, bad={3})
    written = seg.write_batch(spark, good, build(dead), tmp_path / "d2", tmp_path / "dl2", "b5", dead_count=lambda: 1)
    assert built == [1] and written.rows == 49 and written.dead_rows == 1


def test_discard_and_batch_dirs(tmp_path):
    table = tmp_path / "clicks"
    for b in ("b1", "b2"):
        d = table / "data" / f"batch={b}" / "time_chunk=20251120T1200Z"
        d.mkdir(parents=True)
        (d / "part-0.parquet").write_bytes(b"x")
    (table / "data" / ".batch=b0.deleting").mkdir()  # a deletion a crash interrupted
    found = seg.batch_dirs(table)
    assert sorted(found) == ["b1", "b2"] and not (table / "data" / ".batch=b0.deleting").exists()
    seg.discard(found["b1"], tmp_path / "absent")
    assert sorted(seg.batch_dirs(table)) == ["b2"]
    assert seg.batch_dirs(tmp_path / "nothing") == {}


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "x" * 300])
def test_bad_batch_ids(bad):
    with pytest.raises(ValueError):
        seg.check_batch_id(bad)


def test_written_batch_totals():
    w = seg.WrittenBatch("b", (seg.DataFile("/a", "c", 3, 30), seg.DataFile("/b", "c", 4, 40)),
                         (seg.DataFile("/d", None, 1, 10),))
    assert (w.rows, w.dead_rows, w.bytes) == (7, 1, 80)
    assert Path(w.files[0].path).name == "a"


@pytest.mark.spark
def test_a_batch_written_from_a_new_thread_finds_the_sink(spark, tmp_path):
    # Runtimes write from pool threads, each with its own JVM thread: the sink must be found there too.
    import threading

    good, dead = frames(spark, n=20)
    out: list = []
    t = threading.Thread(target=lambda: out.append(seg.write_batch(spark, good, dead, tmp_path / "d", tmp_path / "dl", "b3")))
    t.start()
    t.join()
    assert [w.rows for w in out] == [20]


def test_fsync_all_makes_every_file_durable_before_the_directories(tmp_path, monkeypatch):
    """Hundreds of files are fsynced a few at a time; every directory entry only after
    every file it may name (a directory fsynced first could name a file not yet on disk)."""
    import os
    import threading

    dirs = [tmp_path / f"time_chunk={h:02d}" for h in range(40)]
    files = []
    for d in dirs:
        d.mkdir()
        for k in range(3):
            (d / f"part-{k}.parquet").write_bytes(b"x" * 10)
            files.append(d / f"part-{k}.parquet")
    synced: list[str] = []
    lock = threading.Lock()
    real = os.fsync

    def recording(fd):
        real(fd)
        with lock:
            synced.append(os.readlink(f"/proc/self/fd/{fd}"))

    monkeypatch.setattr(os, "fsync", recording)
    seg.fsync_all(files, [*dirs, tmp_path / "absent"])
    assert sorted(synced[:len(files)]) == sorted(str(f) for f in files)
    assert sorted(synced[len(files):]) == sorted(str(d) for d in dirs)


def test_fsync_all_reports_a_failed_fsync(tmp_path):
    with pytest.raises(FileNotFoundError):
        seg.fsync_all([tmp_path / "gone.parquet"], [tmp_path])


# Times around every boundary the sink's chunk names must agree with Spark's on: the
# years it names (1000 to 9999) and just outside them (Spark names those), before 1970
# (floors go down, not towards zero), quarter hours, leap days and month ends.
_EDGE_MS = [
    -30_610_224_000_000, -30_610_224_000_001,  # 1000-01-01T00:00Z and a millisecond before
    253_402_300_799_999, 253_402_300_800_000,  # the last millisecond of 9999, 10000 (a dead letter)
    -62_135_596_800_000, -1, 0, -900_001, -900_000, -899_999,  # year 1, around the epoch (millis)
    1_709_251_199_999, 1_709_251_200_000,  # 2024-02-29T23:59:59.999Z, 2024-03-01
    1_704_067_199_999, 1_704_067_200_000,  # new year 2024
    T0_MS, T0_MS + 14 * 60_000 + 59_999, T0_MS + 15 * 60_000,
]


def chunk_frames(spark, times_ms, data_schema, sink_chunks):
    import random

    from reconciler.pipeline.transform import good_rows, parse

    rnd = random.Random(7)
    times = [*times_ms, *(rnd.randrange(-30_610_224_000_000, 253_402_300_800_000) for _ in range(300))]
    n = len(times)
    table = pa.table({
        "partition": pa.array(["0"] * n),
        "offset": pa.array(range(n), pa.int64()),
        "key": pa.array([f"r{i}".encode() for i in range(n)], pa.binary()),
        "value": pa.array([json.dumps({"id": f"r{i}", "ts": t, "user": "u", "bytes": 1}).encode()
                           for i, t in enumerate(times)], pa.binary()),
        "stream_time": pa.array([T0_MS * 1000] * n, pa.timestamp("us", tz="UTC")),
    }, schema=ARROW_SCHEMA)
    records = spark.createDataFrame(table).repartition(2)
    return good_rows(parse(records, data_schema), data_schema, sink_chunks=sink_chunks)


def chunk_dirs(written):
    """{chunk: sorted ids} of a written batch."""
    out: dict = {}
    for f in written.files:
        out.setdefault(f.segment, []).extend(pq.read_table(f.path).column("id").to_pylist())
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.spark
@pytest.mark.parametrize("granularity", ["minute", "fifteen_minute", "hour", "day", "month"])
@pytest.mark.parametrize("rollup", [False, True])
def test_the_sink_names_every_chunk_as_spark_does(spark, tmp_path, granularity, rollup):
    from dataclasses import replace

    ds = replace(DS, segment_granularity=granularity, rollup=rollup, timestamp_format="millis",
                 query_granularity="fifteen_minute" if rollup else "none")
    by_spark = seg.write_batch(spark, chunk_frames(spark, _EDGE_MS, ds, sink_chunks=False), None,
                               tmp_path / "spark", tmp_path / "dl1", "s", fsync=False)
    sink_named = chunk_frames(spark, _EDGE_MS, ds, sink_chunks=True)
    named_by_spark = {r.id for r in sink_named.where("time_chunk IS NOT NULL").select("id").collect()}
    assert named_by_spark == {"r1", "r4"}  # before 1000 and year 1: Spark names them
    by_sink = seg.write_batch(spark, sink_named, None, tmp_path / "sink", tmp_path / "dl2", "k",
                              segment_granularity=granularity, fsync=False)
    assert chunk_dirs(by_sink) == chunk_dirs(by_spark)
    assert sum(f.rows for f in by_sink.files) == sum(f.rows for f in by_spark.files) > 300
    assert "__HIVE_DEFAULT_PARTITION__" not in chunk_dirs(by_sink)


@pytest.mark.spark
def test_workers_that_ignore_the_chunk_options_fail_the_batch_with_the_fix(spark, tmp_path, monkeypatch):
    """Workers of an older release ignore the sink's chunk options and would file every
    row under the null partition: the batch fails, saying why, instead of publishing that."""
    from reconciler.errors import SparkMisconfigured
    from reconciler.pipeline import sink

    real = sink.options
    monkeypatch.setattr(sink, "options", lambda path, column=None, **_: real(path, column))
    frame = chunk_frames(spark, [T0_MS], DS, sink_chunks=True)
    with pytest.raises(SparkMisconfigured, match="older stream-reconciler than this daemon"):
        seg.write_batch(spark, frame, None, tmp_path / "d", tmp_path / "dl", "old", segment_granularity="hour")
