"""Compaction's rollup over the TABLE's columns (every column any spec of the datasource
ever wrote): a column named as a pyarrow result (``bytes_sum`` beside a sum of ``bytes``)
is no clash, and the metrics are every spec's, so a metric only another supervisor writes
is combined, not a grouping key. Real pyiceberg SQL catalogs (SQLite, PostgreSQL)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.parquet as pq

from reconciler.model import DataSchema, Metric
from reconciler.store.store import Store
from reconciler.table import compact as mc
from reconciler.table.catalog import BATCH, EPOCH, RANGES, SUPERVISOR, Tables

T0 = datetime(2026, 1, 1, 10, tzinfo=UTC)
SCHEMA = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("user", pa.string()), ("bytes_sum", pa.string()),
                    ("c", pa.int64()), ("bytes", pa.int64()), ("hits", pa.int64())])
# Supervisor a: dimensions [user, bytes_sum], count c, longMax hits; supervisor b:
# dimensions [user], count c, longSum bytes. One rollup datasource, each file valid.
A = DataSchema(datasource="d", timestamp_column="ts", dimensions=("user", "bytes_sum"), rollup=True,
               metrics=(Metric("c", "count"), Metric("hits", "longMax", "hits")))
B = DataSchema(datasource="d", timestamp_column="ts", dimensions=("user",), rollup=True,
               metrics=(Metric("c", "count"), Metric("bytes", "longSum", "bytes")))


def _rows(bytes_sum, c, nbytes, hits) -> pa.Table:
    n = len(c)
    return pa.table({"__time": pa.array([T0] * n, pa.timestamp("us", tz="UTC")), "user": ["u"] * n,
                     "bytes_sum": pa.array(bytes_sum, pa.string()), "c": pa.array(c, pa.int64()),
                     "bytes": pa.array(nbytes, pa.int64()), "hits": pa.array(hits, pa.int64())}, schema=SCHEMA)


def test_of_all_takes_every_specs_metrics():
    both = mc.Rollup.of_all([A, B])
    assert both == mc.Rollup(("user", "bytes_sum"), (("c", "count"), ("hits", "longMax"), ("bytes", "longSum")))
    assert mc.Rollup.of_all([B, A]).metrics == (("c", "count"), ("bytes", "longSum"), ("hits", "longMax"))
    plain = DataSchema(datasource="d", timestamp_column="ts", dimensions=("user",), rollup=False)
    assert mc.Rollup.of_all([plain]) is None and mc.Rollup.of_all([]) is None
    # a name two specs give: the first one's type (the callers put the main supervisor first)
    other = DataSchema(datasource="d", timestamp_column="ts", dimensions=(), rollup=True,
                       metrics=(Metric("bytes", "longMax", "bytes"),))
    assert dict(mc.Rollup.of_all([B, other]).metrics)["bytes"] == "longSum"


def test_a_metric_of_another_spec_is_combined_not_a_key():
    # a's rows (hits differ) and b's rows (bytes differ): by b's spec alone "hits" would be
    # a grouping key and a's two rows would never merge.
    rows = _rows([None, None, None, None], [1, 1, 1, 1], [None, None, 5, 6], [3, 7, None, None])
    assert mc.rollup_rows(rows, mc.Rollup.of(B)).num_rows == 3
    out = mc.rollup_rows(rows, mc.Rollup.of_all([B, A])).to_pylist()
    assert out == [{"__time": T0, "user": "u", "bytes_sum": None, "c": 4, "bytes": 11, "hits": 7}]


def test_a_table_with_a_bytes_sum_column_and_a_bytes_sum_compacts(db_url, tmp_path):
    store = Store(db_url)
    store.migrate()
    tables = Tables(store.engine, tmp_path / "segments")
    try:
        table = tables.ensure("d", SCHEMA, "hour", rollup=True)
        batches = [_rows(["x", None], [1, 1], [None, 4], [2, None]),  # a's row, then b's
                   _rows([None, "x"], [1, 1], [6, None], [None, 9])]
        for i, rows in enumerate(batches):
            d = tables.data_dir(table, f"b{i}") / "time_chunk=20260101T1000Z"
            d.mkdir(parents=True)
            pq.write_table(rows, d / "part-00000.parquet")
            summary = {SUPERVISOR: "a", BATCH: f"b{i}", EPOCH: "1", RANGES: json.dumps([["0", i, i + 1]])}
            tables.load("d").add_files([str(d / "part-00000.parquet")], snapshot_properties=summary)
        rollup = mc.Rollup.of_all([B, A])
        result = mc.compact(tables, "d", store=store, rollup=rollup, now=T0 + timedelta(days=2))
        assert result.committed and result.rollup, result.message
        got = sorted(tables.load("d").scan().to_arrow().to_pylist(), key=lambda r: r["bytes_sum"] or "")
        assert got == [{"__time": T0, "user": "u", "bytes_sum": None, "c": 2, "bytes": 10, "hits": None},
                       {"__time": T0, "user": "u", "bytes_sum": "x", "c": 2, "bytes": None, "hits": 9}]
    finally:
        store.close()
