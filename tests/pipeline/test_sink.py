"""The Parquet sink: one file per (task, partition value), row groups bounded, and only
the files the job committed are kept (a failed or retried attempt's files are not)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reconciler.pipeline import segments as seg
from reconciler.pipeline import sink


def batch(ids, chunks):
    return pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.string()), "time_chunk": pa.array(chunks, pa.string())})


def test_a_task_writes_one_file_per_chunk_without_the_chunk_column(tmp_path, monkeypatch):
    monkeypatch.setattr(sink, "ROW_GROUP_ROWS", 4)
    writer = sink.ParquetSink({"path": str(tmp_path), "partitionColumn": "time_chunk"}).writer(None, False)
    message = writer.write(iter([batch(["a", "b", "c"], ["h1", "h2", "h1"]), batch(["d", "e"], ["h1", "h1"]),
                                 batch([], [])]))
    assert [p.split("/")[0] for p in message.files] == ["time_chunk=h1", "time_chunk=h2"]
    h1 = pq.ParquetFile(tmp_path / message.files[0])
    assert h1.read().to_pydict() == {"id": ["a", "c", "d", "e"]}
    assert h1.metadata.num_row_groups == 1  # buffered to the row-group size, not one per batch
    writer.commit([message, None])
    assert sink.committed_files(tmp_path) == sorted(message.files)


def test_a_failing_task_leaves_nothing_and_abort_removes_committed_tasks_files(tmp_path):
    writer = sink.ParquetSink({"path": str(tmp_path), "partitionColumn": "time_chunk"}).writer(None, False)

    def failing():
        yield batch(["a"], ["h1"])
        raise RuntimeError("task failed")

    with pytest.raises(RuntimeError):
        writer.write(failing())
    done = writer.write(iter([batch(["b"], ["h2"])]))
    assert [p.name for p in tmp_path.rglob("*.parquet")] == [done.files[0].split("/")[1]]
    writer.abort([done, None])
    assert not list(tmp_path.rglob("*.parquet")) and sink.committed_files(tmp_path) is None


def test_only_committed_files_are_collected_the_rest_deleted(tmp_path):
    writer = sink.ParquetSink({"path": str(tmp_path)}).writer(None, False)
    kept = writer.write(iter([batch(["a", "b"], ["h1", "h1"])]))
    retried = writer.write(iter([batch(["a", "b"], ["h1", "h1"])]))  # an attempt Spark did not keep
    writer.commit([kept])
    files = seg._collect(tmp_path, chunked=False)
    assert [f.path for f in files] == [str(tmp_path / kept.files[0])] and files[0].rows == 2
    assert not (tmp_path / retried.files[0]).exists() and not (tmp_path / sink.COMMITTED).exists()


def test_a_task_spread_over_many_chunks_holds_bounded_memory_and_keeps_every_row(tmp_path, monkeypatch):
    """Hundreds of time chunks, each under the row-group size: rows are written once the
    task holds more than the pending-bytes bound, not all kept until the task ends."""
    files = sink._Files(tmp_path, "part-0", "time_chunk", pending_bytes=4096)
    peak = 0
    ids = []
    for i in range(200):
        chunk = f"h{i % 50}"
        rows = [f"k{i:03d}-{j}" for j in range(20)]
        ids += rows
        b = batch(rows, [chunk] * 20).drop_columns(["time_chunk"])
        files.add(chunk, b)
        peak = max(peak, files.held)
        assert files.held <= 4096
    names = files.close()
    assert len(names) == 50 and peak > 0
    got = [r for n in names for r in pq.read_table(tmp_path / n).column("id").to_pylist()]
    assert sorted(got) == sorted(ids)  # none lost, none twice


def test_only_columns_whose_values_repeat_get_a_dictionary(tmp_path):
    n = 10_000
    rows = pa.RecordBatch.from_pydict({
        "id": pa.array([f"k{i:06d}" for i in range(n)]),
        "offset": pa.array(range(n), pa.int64()),
        "user": pa.array([f"u{i % 17}" for i in range(n)]),
        "bytes": pa.array([i % 9 for i in range(n)], pa.int64()),
        "empty": pa.nulls(n, pa.string()),
    })
    message = sink.ParquetSink({"path": str(tmp_path)}).writer(None, False).write(iter([rows]))
    f = pq.ParquetFile(tmp_path / message.files[0])
    group = f.metadata.row_group(0)
    dictionary = {group.column(i).path_in_schema: group.column(i).has_dictionary_page for i in range(group.num_columns)}
    assert dictionary == {"id": False, "offset": False, "user": True, "bytes": True, "empty": True}
    assert f.read().equals(pa.Table.from_batches([rows]))  # the encoding changes nothing read back


def test_a_sample_too_small_or_a_column_too_odd_to_count_keeps_the_default():
    assert sink._dictionary_columns(pa.table({"id": ["a", "b"]})) is True
    n = sink.DICTIONARY_MIN_ROWS
    table = pa.table({
        "id": pa.array([str(i) for i in range(n)]),
        "tags": pa.array([[i] for i in range(n)], pa.list_(pa.int64())),  # count_distinct cannot
    })
    assert sink._dictionary_columns(table) == ["tags"]


def test_a_task_decides_its_dictionaries_once_from_a_flush_large_enough(tmp_path, monkeypatch):
    calls = []
    real = sink._dictionary_columns
    monkeypatch.setattr(sink, "_dictionary_columns", lambda table: calls.append(table.num_rows) or real(table))
    files = sink._Files(tmp_path, "part-0", "time_chunk")
    files.add("h0", batch([f"k{i}" for i in range(3)], ["h0"] * 3).drop_columns(["time_chunk"]))
    files._flush("h0")  # too few rows to tell: pyarrow's default, and the next flush decides
    for h in range(1, 40):
        files.add(f"h{h}", batch([f"k{h}-{i}" for i in range(100)], [f"h{h}"] * 100).drop_columns(["time_chunk"]))
    names = files.close()
    assert calls == [3, 100] and len(names) == 40
    meta = pq.ParquetFile(tmp_path / names[-1]).metadata.row_group(0).column(0)
    assert not meta.has_dictionary_page  # distinct ids: the decision of the first large flush


def timed(ids, micros, chunks=None):
    cols = {"id": pa.array(ids, pa.string()), "__time": pa.array(micros, pa.timestamp("us", tz="UTC"))}
    cols["time_chunk"] = pa.array(chunks if chunks is not None else [None] * len(ids), pa.string())
    return pa.RecordBatch.from_pydict(cols)


def test_rows_without_a_chunk_go_to_the_chunk_of_their_time(tmp_path):
    hour = 3_600_000_000
    opts = sink.options(tmp_path, "time_chunk", chunk_granularity="hour", time_column="__time")
    writer = sink.ParquetSink(opts).writer(None, False)
    message = writer.write(iter([
        timed(["a", "b"], [0, hour - 1]),  # one chunk: the whole batch, unfiltered
        timed(["c", "d", "e", "f"], [-1, hour, None, 5], [None, None, None, "+10000101T0000Z"]),
    ]))
    got = {name.split("/")[0]: pq.read_table(tmp_path / name).to_pydict()["id"] for name in message.files}
    assert got == {
        "time_chunk=19700101T0000Z": ["a", "b"],
        "time_chunk=19691231T2300Z": ["c"],  # floored down before 1970, not towards zero
        "time_chunk=19700101T0100Z": ["d"],
        "time_chunk=__HIVE_DEFAULT_PARTITION__": ["e"],  # no time: where Spark's null chunk went
        "time_chunk=+10000101T0000Z": ["f"],  # a chunk Spark named is kept as it is
    }
    assert all("time_chunk" not in pq.read_table(tmp_path / n).column_names for n in message.files)


def test_chunk_options_need_both_columns_and_a_known_granularity(tmp_path):
    with pytest.raises(ValueError, match="time column"):
        sink.options(tmp_path, "time_chunk", chunk_granularity="hour")
    with pytest.raises(ValueError, match="unknown segment granularity"):
        sink.ParquetSink(sink.options(tmp_path, "time_chunk", chunk_granularity="week",
                                      time_column="__time")).writer(None, False)
