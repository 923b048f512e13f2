"""A batch's files are described as pyiceberg's own ``add_files`` would describe them,
and a staged append of them commits snapshots that readers see with their statistics."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.expressions import GreaterThanOrEqual
from pyiceberg.io.pyarrow import parquet_file_to_data_file

from reconciler.store.store import Store
from reconciler.table import catalog as cat
from reconciler.table.datafiles import describe
from reconciler.table.writeids import new_write_id

SCHEMA = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("user", pa.string()),
                    ("bytes", pa.int64()), ("score", pa.float64())])
T0 = datetime(2026, 11, 20, 9, 30, tzinfo=UTC)
FIELDS = ("content", "file_path", "file_format", "record_count", "file_size_in_bytes", "column_sizes",
          "value_counts", "null_value_counts", "nan_value_counts", "lower_bounds", "upper_bounds",
          "split_offsets", "sort_order_id", "equality_ids", "key_metadata")


@pytest.fixture
def tables(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'reconciler.db'}")
    store.migrate()
    yield cat.Tables(store.engine, tmp_path / "segments")
    store.close()


def _write(tables, table, batch: str, hours: int, rows: int = 5, schema: pa.Schema = SCHEMA) -> list[str]:
    paths = []
    for h in range(hours):
        start = T0 + timedelta(hours=h)
        d = tables.data_dir(table, batch) / f"time_chunk={start:%Y%m%dT%H00Z}"
        d.mkdir(parents=True)
        data = {"__time": pa.array([start + timedelta(seconds=i) for i in range(rows)], pa.timestamp("us", tz="UTC")),
                "user": [None if i == 0 else f"u{i}" for i in range(rows)],
                "bytes": list(range(h, h + rows)), "score": [float("nan")] + [i / 3 for i in range(1, rows)]}
        pq.write_table(pa.table({n: data[n] for n in schema.names}, schema=schema), d / "part-00000-0.parquet")
        paths.append(str(d / "part-00000-0.parquet"))
    return paths


def test_entries_are_what_add_files_would_write(tables):
    table = tables.ensure("clicks", SCHEMA, "hour")
    paths = _write(tables, table, "b1", hours=3)
    ours = describe(table.metadata, paths)
    theirs = [parquet_file_to_data_file(table.io, table.metadata, p) for p in paths]
    assert len(ours) == 3
    for a, b in zip(ours, theirs, strict=True):  # DataFile's == compares the path only
        assert {f: getattr(a, f) for f in FIELDS} == {f: getattr(b, f) for f in FIELDS}
        assert list(a.partition) == list(b.partition)
    assert [e.record_count for e in ours] == [5, 5, 5]
    assert len({e.partition[0] for e in ours}) == 3  # one hour partition per file


def test_files_that_do_not_fit_the_schema_are_refused(tables):
    table = tables.ensure("clicks", SCHEMA, "hour")
    good = _write(tables, table, "b1", hours=1)
    wider = pa.schema([*SCHEMA, ("extra", pa.string())])
    d = tables.data_dir(table, "b1") / "odd"
    d.mkdir(parents=True)
    pq.write_table(pa.table({"__time": pa.array([T0], pa.timestamp("us", tz="UTC")), "user": ["u"], "bytes": [1],
                             "score": [1.0], "extra": ["x"]}, schema=wider), d / "part.parquet")
    with pytest.raises(ValueError, match="extra"):
        describe(table.metadata, [*good, str(d / "part.parquet")])
    with pytest.raises(ValueError, match="twice"):
        describe(table.metadata, good + good)


def test_a_staged_append_commits_the_batch_with_its_statistics(tables):
    table = tables.ensure("clicks", SCHEMA, "hour")
    paths = _write(tables, table, "b1", hours=4)
    (commit,) = [tables.stage_append("clicks", paths, {cat.BATCH: "b1"}, schema=SCHEMA, granularity="hour",
                                     write_id=new_write_id())]
    # the pointer move, as the publish does it inside its own transaction
    with tables._engine.begin() as c:
        moved = c.execute(cat.sa.text(
            "UPDATE iceberg_tables SET metadata_location = :new, previous_metadata_location = :old "
            "WHERE catalog_name = :c AND table_namespace = :n AND table_name = 'clicks' "
            "AND metadata_location = :old"), {"new": commit.new, "old": commit.expected, "c": cat.CATALOG,
                                               "n": cat.NAMESPACE}).rowcount
    assert moved == 1
    tables.committed([commit])
    loaded = tables.load("clicks")
    assert loaded.current_snapshot().summary.additional_properties[cat.BATCH] == "b1"
    assert loaded.scan().to_arrow().num_rows == 20
    # the files' bounds and partitions prune: the last two hours only
    later = loaded.scan(row_filter=GreaterThanOrEqual("__time", (T0 + timedelta(hours=2)).isoformat()))
    assert sorted(t.file.file_path for t in later.plan_files()) == sorted(paths[2:])


@pytest.mark.parametrize("transform, value", [("hour", 70_389_527), ("day", 2_932_896), ("month", 96_359), ("year", 8_029)])
def test_the_last_partition_of_9999_ends_at_the_last_instant(transform, value):
    """A row in 9999's last hour, day, month or year is published like any other: its
    partition's end (10000-01-01) has no datetime, so it ends at the last one there is."""
    from pyiceberg.transforms import DayTransform, HourTransform, MonthTransform, YearTransform

    from reconciler.table.files import LAST_INSTANT, partition_interval

    kind = {"hour": HourTransform, "day": DayTransform, "month": MonthTransform, "year": YearTransform}[transform]
    start, end = partition_interval(kind(), value)
    assert start.year == 9999 and end == LAST_INSTANT
    earlier, before = partition_interval(kind(), value - 1)
    assert before == start and earlier < start
