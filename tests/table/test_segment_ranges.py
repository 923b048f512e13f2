"""``reconciler segments`` shows what each file holds: a batch commits one set of offset
ranges for all its files, and each file's own ``__partition``/``__offset`` statistics narrow
them to its part (issue 46: a file of partitions 0-1 was listed with all four ranges)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from reconciler.store.store import Store
from reconciler.table import catalog as cat
from reconciler.table.files import data_files
from reconciler.table.writeids import new_write_id

T0 = datetime(2026, 11, 20, 9, 30, tzinfo=UTC)
WITH_OFFSETS = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("__partition", pa.string()),
                          ("__offset", pa.int64()), ("user", pa.string())])
WITHOUT = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("user", pa.string())])
BATCH_RANGES = [["0", 0, 10], ["1", 5, 15], ["9", 0, 4], ["10", 0, 4]]


@pytest.fixture
def tables(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'reconciler.db'}")
    store.migrate()
    yield cat.Tables(store.engine, tmp_path / "segments")
    store.close()


def _commit(tables, schema, files: dict[str, list[tuple[str, int]]]) -> None:
    """One batch: a file per name holding (partition, offset) rows, all under BATCH_RANGES."""
    table = tables.ensure("clicks", schema, "hour")
    paths = []
    for name, rows in files.items():
        d = tables.data_dir(table, "b1") / "time_chunk=20261120T0900Z"
        d.mkdir(parents=True, exist_ok=True)
        data = {"__time": pa.array([T0 + timedelta(seconds=i) for i in range(len(rows))], pa.timestamp("us", tz="UTC")),
                "__partition": [p for p, _ in rows], "__offset": [o for _, o in rows], "user": ["u"] * len(rows)}
        pq.write_table(pa.table({n: data[n] for n in schema.names}, schema=schema), d / name)
        paths.append(str(d / name))
    commit = tables.stage_append("clicks", paths, {cat.BATCH: "b1", cat.SUPERVISOR: "clicks",
                                                   cat.RANGES: json.dumps(BATCH_RANGES)},
                                 schema=schema, granularity="hour", write_id=new_write_id())
    with tables._engine.begin() as c:
        assert c.execute(cat.sa.text(
            "UPDATE iceberg_tables SET metadata_location = :new WHERE table_name = 'clicks' "
            "AND metadata_location = :old"), {"new": commit.new, "old": commit.expected}).rowcount == 1
    tables.committed([commit])


def test_each_file_lists_only_its_own_partitions_and_offsets(tables):
    _commit(tables, WITH_OFFSETS, {
        "a.parquet": [("0", o) for o in range(0, 10)] + [("1", o) for o in range(5, 9)],  # partitions 0-1
        "b.parquet": [("1", o) for o in range(9, 15)],
        "c.parquet": [("9", o) for o in range(4)] + [("10", o) for o in range(4)]})  # "10" < "9" as strings
    files = {f.path.rsplit("/", 1)[1]: f for f in data_files(tables.load("clicks"))}
    assert files["a.parquet"].ranges == (("0", 0, 10), ("1", 5, 10))  # within the file's offset bounds 0..9
    assert files["b.parquet"].ranges == (("1", 9, 15),)
    assert files["c.parquet"].ranges == (("9", 0, 4), ("10", 0, 4))
    assert all(f.exact and f.batch_ranges == tuple(tuple(r) for r in BATCH_RANGES) for f in files.values())
    doc = files["b.parquet"].to_dict("clicks")
    assert doc["ranges"] == [{"partition": "1", "start": 9, "end": 15}] and doc["rangesFrom"] == "file statistics"
    assert len(doc["batchRanges"]) == 4


def test_without_offset_columns_the_batch_ranges_are_shown_and_said_so(tables):
    _commit(tables, WITHOUT, {"a.parquet": [("0", 1)], "b.parquet": [("1", 6)]})
    files = data_files(tables.load("clicks"))
    assert all(not f.exact and f.ranges == f.batch_ranges and len(f.ranges) == 4 for f in files)
    assert files[0].to_dict("clicks")["rangesFrom"] == "batch"
    from reconciler.observe.render import segments_text

    row = files[0].to_dict("clicks") | {"ranges": json.dumps([list(r) for r in files[0].ranges]), "batch_id": "b1"}
    assert "(the batch's)" in segments_text([row])
