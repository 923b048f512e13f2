"""Staging, promote, discard and manifests: only committed files are under <segments>/D."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from reconciler.pipeline import segments as seg
from reconciler.pipeline.sources import ARROW_SCHEMA
from reconciler.pipeline.transform import transform
from reconciler.spec.model import DataSchema, Metric

HOUR_MS = 3600_000
T0_MS = 1_763_640_000_000  # 2025-11-20T12:00:00Z

DS = DataSchema(
    datasource="clicks",
    timestamp_column="ts",
    dimensions=("id", "user", "__offset"),
    metrics=(Metric("count", "count"), Metric("bytes", "longSum", "bytes")),
    segment_granularity="hour",
)


def frames(spark, n=300, bad=(), hours=3, first_offset=0):
    values = []
    for i in range(n):
        o = first_offset + i
        if i in bad:
            values.append(b"{broken")
        else:
            values.append(
                json.dumps(
                    {
                        "id": f"r{o}",
                        "ts": T0_MS + (i * hours * HOUR_MS) // n,
                        "user": f"u{i % 3}",
                        "bytes": i,
                    }
                ).encode()
            )
    table = pa.table(
        {
            "partition": pa.array(["0"] * n),
            "offset": pa.array(range(first_offset, first_offset + n), pa.int64()),
            "key": pa.array([f"r{first_offset + i}".encode() for i in range(n)], pa.binary()),
            "value": pa.array(values, pa.binary()),
            "stream_time": pa.array([T0_MS * 1000] * n, pa.timestamp("us", tz="UTC")),
        },
        schema=ARROW_SCHEMA,
    )
    # Two Spark partitions, so a chunk can get one file per task.
    return transform(spark.createDataFrame(table).repartition(2), DS)


def all_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.spark
def test_write_then_promote(spark, tmp_path):
    root = tmp_path / "segments"
    good, dead = frames(spark, bad={5, 17})
    staged = seg.write_batch(spark, good, dead, root, "clicks", "b0001")

    # Before promote: nothing under <segments>/clicks, everything under _staging/b0001.
    assert not (root / "clicks").exists()
    assert not (root / "_deadletter").exists()
    assert all(f.startswith("_staging/b0001/") for f in all_files(root))
    assert (root / "_staging/b0001/_manifest.json").is_file()
    assert staged.rows == 298 and staged.dead_rows == 2
    assert staged.segments == ("20251120T1200Z", "20251120T1300Z", "20251120T1400Z")
    assert sum(f.rows for f in staged.files) == 298
    for f in staged.files:
        assert Path(f.staging_path).is_file()
        assert f.rows == pq.read_metadata(f.staging_path).num_rows
        assert f.bytes == os.path.getsize(f.staging_path)
        assert f.final_path.startswith(str(root / "clicks" / f"time_chunk={f.segment}") + "/b0001-")
        assert f.interval_start == f"2025-11-20T{f.segment[9:11]}:00:00Z"
        assert f.interval_end == f"2025-11-20T{int(f.segment[9:11]) + 1}:00:00Z"
    assert len({f.final_path for f in staged.files}) == len(staged.files)

    seg.promote(staged)
    files = all_files(root)
    assert not (root / "_staging" / "b0001").exists()
    data = [f for f in files if f.startswith("clicks/")]
    deadletters = [f for f in files if f.startswith("_deadletter/")]
    assert len(data) == len(staged.files) and len(deadletters) == len(staged.dead_files) >= 1
    assert all(
        f.startswith("clicks/time_chunk=") and f.endswith(".parquet") and "/b0001-" in f
        for f in data
    )
    assert set(files) == set(data) | set(deadletters)
    assert all(f.startswith("_deadletter/clicks/b0001-") for f in deadletters)

    # Every reader sees exactly the committed rows, time_chunk a string.
    df = spark.read.parquet(str(root / "clicks"))
    assert dict(df.dtypes)["time_chunk"] == "string"
    assert dict(df.dtypes)["__time"] == "timestamp"
    assert df.count() == 298
    assert sorted(r.id for r in df.select("id").collect()) == sorted(
        f"r{i}" for i in range(300) if i not in (5, 17)
    )
    table = pads.dataset(str(root / "clicks"), format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 298
    assert table.schema.field("time_chunk").type == pa.string()
    assert table.schema.field("__time").type == pa.timestamp("us", tz="UTC")
    dead_table = pq.read_table(str(root / "_deadletter" / "clicks"))
    assert sorted(dead_table.column("offset").to_pylist()) == [5, 17]
    assert set(dead_table.column("reason").to_pylist()) == {"invalid JSON: not a JSON object"}

    # promote is idempotent
    seg.promote(staged)
    assert all_files(root) == files


@pytest.mark.spark
def test_staged_batch_is_invisible_next_to_committed(spark, tmp_path):
    root = tmp_path / "segments"
    g1, d1 = frames(spark, n=100)
    seg.promote(seg.write_batch(spark, g1, d1, root, "clicks", "b1"))
    g2, d2 = frames(spark, n=50, first_offset=100)
    staged = seg.write_batch(spark, g2, d2, root, "clicks", "b2")
    assert spark.read.parquet(str(root / "clicks")).count() == 100
    assert pads.dataset(str(root / "clicks"), partitioning="hive").count_rows() == 100
    seg.promote(staged)
    assert spark.read.parquet(str(root / "clicks")).count() == 150


@pytest.mark.spark
def test_partial_promote_then_recovery_from_manifest(spark, tmp_path):
    root = tmp_path / "segments"
    good, dead = frames(spark, bad={1})
    staged = seg.write_batch(spark, good, dead, root, "clicks", "b7")
    # A crash after moving one file: the manifest still describes the batch.
    first = staged.files[0]
    Path(first.final_path).parent.mkdir(parents=True)
    os.replace(first.staging_path, first.final_path)
    loaded = seg.load_manifest(root, "b7")
    assert loaded == staged
    assert seg.staging_batch_ids(root) == ["b7"]
    seg.promote(loaded)
    assert seg.staging_batch_ids(root) == []
    assert seg.load_manifest(root, "b7") is None
    assert spark.read.parquet(str(root / "clicks")).count() == staged.rows
    assert len(seg.committed_files(root, "clicks")) == len(staged.files)


@pytest.mark.spark
def test_discard_and_rewrite(spark, tmp_path):
    root = tmp_path / "segments"
    good, dead = frames(spark, n=40)
    seg.write_batch(spark, good, dead, root, "clicks", "b1")
    seg.write_batch(spark, good, dead, root, "clicks", "b2")
    assert seg.staging_batch_ids(root) == ["b1", "b2"]
    seg.discard(root, "b1")
    seg.discard(root, "b1")  # idempotent
    assert seg.staging_batch_ids(root) == ["b2"]
    assert not (root / "clicks").exists()
    # Writing the same batch id again replaces its staging content.
    again = seg.write_batch(spark, good, dead, root, "clicks", "b2")
    assert again.rows == 40
    assert len(list((root / "_staging" / "b2").rglob("*.parquet"))) == len(again.files)


@pytest.mark.spark
def test_empty_batch(spark, tmp_path):
    root = tmp_path / "segments"
    good, dead = frames(spark, n=20)
    staged = seg.write_batch(
        spark, good.limit(0), dead.limit(0), root, "clicks", "empty", dead_count=lambda: 0
    )
    assert staged.files == () and staged.dead_files == () and staged.rows == 0
    seg.promote(staged)
    assert not (root / "clicks").exists()
    assert seg.staging_batch_ids(root) == []


def _fake_staged(tmp_path: Path) -> seg.StagedBatch:
    root = tmp_path / "segments"
    stage = root / "_staging" / "b9" / "time_chunk=20251120T1200Z"
    stage.mkdir(parents=True)
    pq.write_table(pa.table({"x": [1, 2]}), stage / "part-0.parquet")
    f = seg.StagedFile(
        staging_path=str(stage / "part-0.parquet"),
        final_path=str(root / "clicks" / "time_chunk=20251120T1200Z" / "b9-00000.parquet"),
        segment="20251120T1200Z",
        interval_start="2025-11-20T12:00:00Z",
        interval_end="2025-11-20T13:00:00Z",
        rows=2,
        bytes=(stage / "part-0.parquet").stat().st_size,
    )
    staged = seg.StagedBatch("b9", "clicks", (f,), 2, 0, (), str(root))
    seg.write_manifest(staged)
    return staged


def test_promote_refuses_lost_files(tmp_path):
    staged = _fake_staged(tmp_path)
    os.unlink(staged.files[0].staging_path)
    with pytest.raises(FileNotFoundError):
        seg.promote(staged)
    # the manifest is kept for a later attempt
    assert seg.load_manifest(staged.segments_dir, "b9") == staged


def test_manifest_round_trip_and_leftovers(tmp_path):
    staged = _fake_staged(tmp_path)
    doc = json.loads((Path(staged.staging_dir) / "_manifest.json").read_text())
    assert doc["batch_id"] == "b9" and doc["files"][0]["rows"] == 2
    assert seg.StagedBatch.from_document(doc) == staged
    root = Path(staged.segments_dir)
    (root / "_staging" / ".old.deleting" / "x").mkdir(parents=True)
    assert seg.staging_batch_ids(root) == ["b9"]
    assert not (root / "_staging" / ".old.deleting").exists()


@pytest.mark.parametrize("bad", ["", "_x", ".x", "a/b", "a b", "../x"])
def test_bad_batch_ids(bad, tmp_path):
    with pytest.raises(ValueError):
        seg.staging_dir(tmp_path, bad)
