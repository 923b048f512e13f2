"""Rollup result names (review of 3f16e07, issue 41.10). Compaction's ``rollup_rows`` groups
by every column of the TABLE that is not a metric (every column any spec of the datasource
ever wrote), so a column named as pyarrow names a result (``bytes_sum`` beside a ``longSum``
metric ``bytes``) may come from another spec or an earlier version of the spec, where
validate cannot see it. It once failed every compaction with ``KeyError: 'Field
"bytes_sum" exists 2 times in schema'``; rollup now aggregates under internal names
(``pipeline.rollup.aggregate``, the tasks' and compaction's), and validate accepts such a
dimension."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from reconciler.model import DataSchema, Metric
from reconciler.pipeline.transform import Transformer
from reconciler.spec.loader import load_directory
from reconciler.table.compact import Rollup, rollup_rows
from tests.pipeline.test_transform import T0_MS, records
from tests.spec.test_crossfile import (
    spec,
    specs,  # noqa: F401 - the fixture
)

T0 = dt.datetime(2025, 11, 20, 12, tzinfo=dt.UTC)


def _table_rows() -> pa.Table:
    """Rows as compaction reads them from the table written by both specs (the union of
    their columns; a file without a column reads it as null)."""
    ts = pa.array([T0] * 3, pa.timestamp("us", tz="UTC"))
    return pa.table({
        "__time": ts,
        "user": ["u", "u", "u"],
        "bytes_sum": pa.array([None, None, None], pa.string()),  # the other spec's dimension
        "c": pa.array([1, 2, 3], pa.int64()),
        "bytes": pa.array([5, 6, None], pa.int64()),
        "time_chunk": ["20251120T1200Z"] * 3,
    })


def test_what_validate_accepts_for_one_datasource_compaction_can_roll_up(specs):  # noqa: F811
    (specs / "a.yaml").write_text(spec("a", "d", dims="[user, bytes_sum]", metrics="[{name: c, type: count}]",
                                       rollup=True))
    (specs / "b.yaml").write_text(spec("b", "d", dims="[user]", rollup=True,
                                       metrics="[{name: c, type: count}, {name: bytes, type: longSum, field: bytes}]"))
    accepted = load_directory("specs").by_id()
    assert set(accepted) == {"a", "b"}
    # a alone would read b's metric "bytes" as a grouping key (rows 5 and 6 never merge):
    # the compactor goes by the metrics of every spec of the datasource, main first.
    assert rollup_rows(_table_rows(), Rollup.of(accepted["a"].data_schema)).num_rows == 3
    for order in ("ab", "ba"):
        out = rollup_rows(_table_rows(), Rollup.of_all(accepted[one].data_schema for one in order))
        assert out.select(["c", "bytes"]).to_pylist() == [{"c": 6, "bytes": 11}]


def test_compaction_rolls_up_a_table_that_kept_a_dropped_dimension():
    # The spec had dimensions [user, bytes_sum]; it now has [user] and a longSum "bytes".
    new = DataSchema(datasource="d", timestamp_column="ts", dimensions=("user",), rollup=True,
                     metrics=(Metric("c", "count"), Metric("bytes", "longSum", "bytes")))
    out = rollup_rows(_table_rows(), Rollup.of(new))
    assert out.to_pylist() == [{"__time": T0, "user": "u", "bytes_sum": None, "c": 6, "bytes": 11,
                                "time_chunk": "20251120T1200Z"}]


def test_one_spec_with_a_dimension_bytes_sum_beside_a_sum_of_bytes_ingests_and_compacts(specs):  # noqa: F811
    (specs / "a.yaml").write_text(spec("a", "d", dims="[bytes_sum, top_max]", rollup=True,
                                       metrics="[{name: bytes, type: longSum, field: n}, "
                                               "{name: top, type: longMax, field: n}]"))
    ds = load_directory("specs").by_id()["a"].data_schema
    docs = [{"ts": T0_MS, "bytes_sum": "s", "top_max": "m", "n": n} for n in (3, 4, 5)]
    parts = []
    for cut in ([docs[0]], docs[1:]):  # two tasks: two rows of one group in the table
        t = Transformer(ds)
        parts += [t(records(cut)).rows, t.finish().rows]
    table = pa.concat_tables(parts)
    assert table.num_rows == 2
    out = rollup_rows(table, Rollup.of(ds)).to_pylist()
    assert [(r["bytes_sum"], r["top_max"], r["bytes"], r["top"]) for r in out] == [("s", "m", 12, 5)]
