"""A task's Parquet files: one per partition value, row groups bounded, memory bounded,
dictionaries only where values repeat; what the task reports is what it wrote."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reconciler.pipeline import sink


def batch(ids, chunks):
    return pa.RecordBatch.from_pydict({"id": pa.array(ids, pa.string()), "time_chunk": pa.array(chunks, pa.string())})


def test_a_task_writes_one_file_per_chunk_without_the_chunk_column(tmp_path, monkeypatch):
    monkeypatch.setattr(sink, "ROW_GROUP_ROWS", 4)
    files = sink.Files(tmp_path, "part-0", "time_chunk")
    for b in (batch(["a", "b", "c"], ["h1", "h2", "h1"]), batch(["d", "e"], ["h1", "h1"]), batch([], [])):
        files.add_table(pa.Table.from_batches([b]))
    written = files.close()
    assert [(f.name.split("/")[0], f.value, f.rows) for f in written] == [
        ("time_chunk=h1", "h1", 4), ("time_chunk=h2", "h2", 1)]
    h1 = pq.ParquetFile(tmp_path / written[0].name)
    assert h1.read().to_pydict() == {"id": ["a", "c", "d", "e"]}
    assert h1.metadata.num_row_groups == 1  # buffered to the row-group size, not one per batch
    assert [f.bytes for f in written] == [(tmp_path / f.name).stat().st_size for f in written]


def test_rows_of_interleaved_chunks_and_nulls_reach_their_files_in_their_order(tmp_path):
    """Chunks interleaved in a table (partitions read one after another, late records) and a
    null chunk: every row in its chunk's file once, in the order it came, the chunk
    column dropped; a chunked table is routed with one sort, not a pass per chunk."""
    ids = [f"r{i:03d}" for i in range(300)]
    chunks = [None if i % 97 == 0 else f"h{(i * 7) % 13:02d}" for i in range(300)]
    files = sink.Files(tmp_path, "part-0", "time_chunk")
    files.add_table(pa.Table.from_batches([batch(ids[:150], chunks[:150])]))
    files.add_table(pa.Table.from_batches([batch(ids[150:], chunks[150:])]))
    written = files.close()
    expected: dict = {}
    for i, c in zip(ids, chunks, strict=True):
        expected.setdefault(c, []).append(i)
    assert {f.value: f.rows for f in written} == {c: len(v) for c, v in expected.items()}
    for f in written:
        table = pq.read_table(tmp_path / f.name)
        assert table.column_names == ["id"]
        assert table.column("id").to_pylist() == expected[f.value], f.value
    null_file = next(f for f in written if f.value is None)
    assert null_file.name.startswith(f"time_chunk={sink.NO_VALUE}/")


def test_pending_rows_of_a_quiet_chunk_do_not_pin_whole_tables(tmp_path):
    """From the review: each table crosses into a chunk that then gets no more rows (an hour
    boundary, a late record). Its few pending rows must hold their own buffers, not a slice
    of a copy of the whole table: the memory Arrow holds stays near the pending-bytes bound
    (a slice per run of one reordered copy kept ~70 MB for a 1 MB bound)."""
    import gc

    limit = 1 << 20
    n = 50_000
    payload = pa.array(["x" * 40 + str(k) for k in range(n)])  # ~2.3 MB per table
    files = sink.Files(tmp_path, "part-0", "time_chunk", pending_bytes=limit)
    base = pa.total_allocated_bytes()
    for t in range(12):  # the slices of the old bug held ~2.3 MB each: 12 are far past the bound
        files.add_table(pa.table({"id": payload, "time_chunk": pa.array(["main"] * (n - 1) + [f"late{t:02d}"])}))
        gc.collect()
    held_by_arrow = pa.total_allocated_bytes() - base
    assert files.held <= limit
    assert held_by_arrow < 8 * limit, (files.held, held_by_arrow)
    written = files.close()
    assert sum(f.rows for f in written) == 12 * n


@pytest.mark.parametrize(("chunks", "expected"), [
    (["h1", None, "h1", None], {"h1": ["a", "c"], None: ["b", "d"]}),
    (["h1", None, "h2", "h1"], {"h1": ["a", "d"], "h2": ["c"], None: ["b"]}),
], ids=["one-value", "several-values"])
def test_a_dictionary_typed_chunk_column_routes_nulls_to_the_null_file(tmp_path, chunks, expected):
    """From the review: ``dictionary_encode`` passes a dictionary column through, with its
    nulls as null codes: they went to the one value's file, or failed the task."""
    files = sink.Files(tmp_path, "part-0", "time_chunk")
    files.add_table(pa.table({"id": ["a", "b", "c", "d"], "time_chunk": pa.array(chunks).dictionary_encode()}))
    written = files.close()
    assert {f.value: pq.read_table(tmp_path / f.name).column("id").to_pylist() for f in written} == expected


def test_a_table_without_a_partition_column_goes_to_one_file(tmp_path):
    files = sink.Files(tmp_path, "part-0", None)
    files.add_table(pa.table({"id": ["a", "b"]}))
    files.add_table(pa.table({"id": ["c"]}))
    (written,) = files.close()
    assert written.name == "part-0.parquet" and written.value is None and written.rows == 3
    assert pq.read_table(tmp_path / written.name).column("id").to_pylist() == ["a", "b", "c"]


def test_an_aborted_task_leaves_nothing(tmp_path):
    files = sink.Files(tmp_path, "part-0", "time_chunk")
    files.add_table(pa.Table.from_batches([batch(["a"], ["h1"])]))
    files._flush("h1")
    assert list(tmp_path.rglob("*.parquet"))
    files.abort()
    assert not list(tmp_path.rglob("*.parquet"))


def test_a_task_spread_over_many_chunks_holds_bounded_memory_and_keeps_every_row(tmp_path, monkeypatch):
    """Hundreds of time chunks, each under the row-group size: rows are written once the
    task holds more than the pending-bytes bound, not all kept until the task ends."""
    files = sink.Files(tmp_path, "part-0", "time_chunk", pending_bytes=4096)
    peak = 0
    ids = []
    for i in range(200):
        chunk = f"h{i % 50}"
        rows = [f"k{i:03d}-{j}" for j in range(20)]
        ids += rows
        files.add_table(pa.Table.from_batches([batch(rows, [chunk] * 20)]))
        peak = max(peak, files.held)
        assert files.held <= 4096
    written = files.close()
    assert len(written) == 50 and peak > 0 and sum(f.rows for f in written) == len(ids)
    got = [r for f in written for r in pq.read_table(tmp_path / f.name).column("id").to_pylist()]
    assert sorted(got) == sorted(ids)  # none lost, none twice


def test_only_columns_whose_values_repeat_get_a_dictionary(tmp_path):
    n = 10_000
    rows = pa.table({
        "id": pa.array([f"k{i:06d}" for i in range(n)]),
        "offset": pa.array(range(n), pa.int64()),
        "user": pa.array([f"u{i % 17}" for i in range(n)]),
        "bytes": pa.array([i % 9 for i in range(n)], pa.int64()),
        "empty": pa.nulls(n, pa.string()),
    })
    files = sink.Files(tmp_path, "part-0", None)
    files.add_table(rows)
    (written,) = files.close()
    f = pq.ParquetFile(tmp_path / written.name)
    group = f.metadata.row_group(0)
    dictionary = {group.column(i).path_in_schema: group.column(i).has_dictionary_page for i in range(group.num_columns)}
    assert dictionary == {"id": False, "offset": False, "user": True, "bytes": True, "empty": True}
    assert f.read().equals(rows)  # the encoding changes nothing read back


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
    files = sink.Files(tmp_path, "part-0", "time_chunk")
    files.add("h0", batch([f"k{i}" for i in range(3)], ["h0"] * 3).drop_columns(["time_chunk"]))
    files._flush("h0")  # too few rows to tell: pyarrow's default, and the next flush decides
    for h in range(1, 40):
        files.add(f"h{h}", batch([f"k{h}-{i}" for i in range(100)], [f"h{h}"] * 100).drop_columns(["time_chunk"]))
    written = files.close()
    assert calls == [3, 100] and len(written) == 40
    meta = pq.ParquetFile(tmp_path / written[-1].name).metadata.row_group(0).column(0)
    assert not meta.has_dictionary_page  # distinct ids: the decision of the first large flush


@pytest.mark.parametrize("value", ["..", "a/b"])
def test_an_unsafe_partition_value_is_refused(tmp_path, value):
    files = sink.Files(tmp_path, "part-0", "time_chunk")
    with pytest.raises(ValueError, match="unsafe partition value"):
        files.add_table(pa.Table.from_batches([batch(["a"], [value])]))
        files.close()
