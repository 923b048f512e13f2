"""Issue 42's schemaDiscovery (JSON), cases a review proved: under a decided type (the
table's, or an earlier batch's) a record's row or dead letter depends on the record alone;
one record never fails a batch on every retry; a value never lands changed. docs/spec.md's
JSON rules (Discovery) say which part a cut can still change: which batch decides a type."""

from __future__ import annotations

import pyarrow as pa

from reconciler.model import DataSchema
from reconciler.pipeline.transform import Transformer
from tests.pipeline.test_transform import T0_MS, records

DS = DataSchema("orders", "ts", timestamp_format="millis", format="json", schema_discovery=True)


def _outcome(batches, table_types=None):
    """(rows' discovered values by name, dead-letter reasons) of one task over ``batches``."""
    t = Transformer(DS, table_types=table_types)
    rows, dead = [], []
    for b in batches:
        out = t(records(b))
        rows += [{k: v for k, v in r.items() if k not in ("__time", "time_chunk")} for r in out.rows.to_pylist()]
        dead += out.dead.column("offset").to_pylist()
    return rows, dead


def test_an_integer_beyond_a_long_is_a_dead_letter_not_a_failed_batch():
    # One record with an integer beyond 64 bits under a discovered key raised OverflowError
    # out of the transform: the task fails, the batch fails, and every retry reads the same
    # record: the supervisor never moves past it.
    values = [{"ts": T0_MS, "n": 1}, {"ts": T0_MS, "n": 2**64}]
    t = Transformer(DS)
    out = t(records(values))  # OverflowError: Python int too large to convert to C long
    assert out.rows.num_rows + out.dead.num_rows == 2
    assert out.rows.column("n").to_pylist() == [1]
    assert out.dead.column("reason").to_pylist() == [f"field n: {2**64} is beyond a long"]
    # the same under a long column the table has, and a later batch reads on
    out = Transformer(DS, table_types={"n": pa.int64()})(records([{"ts": T0_MS, "n": -(2**63) - 1}]))
    assert out.dead.column("reason").to_pylist() == [f"field n: {-(2**63) - 1} is beyond a long"]


def test_an_integer_beyond_a_long_under_a_string_table_column_is_a_row_or_dead_letter():
    out = Transformer(DS, table_types={"n": pa.string()})(records([{"ts": T0_MS, "n": -(2**63) - 1}]))
    assert out.rows.num_rows + out.dead.num_rows == 1
    assert out.rows.column("n").to_pylist() == [str(-(2**63) - 1)]  # its text, as the rule says


def test_under_a_long_table_column_an_integer_is_a_row_whatever_its_neighbours():
    # The table has q long ("once the table has the column its type decides"). {"q": 1}
    # alone is a row; next to {"q": 2.5} in one batch the batch's column is inferred double
    # first, and conform dead-letters EVERY record of the batch holding q, the integer too.
    alone, _ = _outcome([[{"ts": T0_MS, "q": 1}]], {"q": pa.int64()})
    assert alone == [{"q": 1}]
    rows, dead = _outcome([[{"ts": T0_MS, "q": 1}, {"ts": T0_MS, "q": 2.5}]], {"q": pa.int64()})
    assert rows == [{"q": 1}] and dead == [101]
    assert _outcome([[{"ts": T0_MS, "q": 2.5}, {"ts": T0_MS, "q": 1}]], {"q": pa.int64()}) == ([{"q": 1}], [100])


def test_under_a_string_table_column_a_number_or_object_is_a_row_whatever_its_neighbours():
    # The table has a string: {"a": 5} and {"a": {"b": 1}} are rows in a batch of their
    # own (5 -> "5", the object its compact JSON) but dead letters ("is a long, the field
    # is string") when a string value precedes them in the same batch.
    table = {"a": pa.string()}
    s, n, o = {"ts": T0_MS, "a": "x"}, {"ts": T0_MS, "a": 5}, {"ts": T0_MS, "a": {"b": 1}}
    cut = _outcome([[s], [n], [o]], table)
    assert cut == ([{"a": "x"}, {"a": "5"}, {"a": '{"b":1}'}], [])
    assert _outcome([[s, n, o]], table) == cut


def test_a_task_cut_differently_differs_only_in_which_batch_decides_the_type():
    # The review asked that a cut change nothing. The documented rule (docs/spec.md, JSON
    # rules, Discovery) keeps one thing cut-dependent: with no table column yet, the first
    # batch that meets a key decides its type. One batch [1, 2.5] -> a double column, both
    # rows; cut after the first -> a long column and 2.5 a dead letter naming both types.
    # Everything after that decision is per value: the same record, the same fate.
    a, b = {"ts": T0_MS, "q": 1}, {"ts": T0_MS, "q": 2.5}
    assert _outcome([[a, b]]) == ([{"q": 1.0}, {"q": 2.5}], [])
    t = Transformer(DS)
    assert t(records([a])).rows.column("q").to_pylist() == [1]
    out = t(records([b]))
    assert out.rows.num_rows == 0
    assert out.dead.column("reason").to_pylist() == ["incompatible schema: field q is double, the table reads long"]
    # once the table has the column, every cut gives the same rows and dead letters
    for table in ({"q": pa.int64()}, {"q": pa.float64()}):
        whole = _outcome([[a, b]], table)
        rows, dead = _outcome([[a], [b]], table)  # each batch's offsets start at 100
        assert rows == whole[0] and len(dead) == len(whole[1]) == (table["q"] == pa.int64())


def test_a_discovered_integer_is_not_rounded_by_a_fraction_in_its_batch():
    # 2**53 + 1 next to a fraction becomes the double 2**53 in the row: silently another
    # number (the docs: "converts without loss"; across batches it would be a dead letter).
    rows, dead = _outcome([[{"ts": T0_MS, "id": 2**53 + 1}, {"ts": T0_MS, "id": 0.5}]])
    assert dead or rows[0]["id"] == 2**53 + 1, rows
    assert (rows, dead) == ([{"id": 0.5}], [100])
    out = Transformer(DS)(records([{"ts": T0_MS, "id": 2**53 + 1}, {"ts": T0_MS, "id": 0.5},
                                   {"ts": T0_MS, "id": 2**53}]))
    assert out.dead.column("reason").to_pylist() == [f"field id: {2**53 + 1} would lose precision as double"]
    assert out.rows.column("id").to_pylist() == [0.5, float(2**53)]  # exactly a double: a row


def test_two_tasks_that_met_an_avro_field_as_int_and_as_long_do_not_fail_the_batch():
    # Avro evolution int -> long (the docs' own example) across partitions: the task over
    # partition 0 reads writer v1 (n: int), the task over partition 1 writer v2 (n: long),
    # the table has no n yet. Iceberg promotes int -> long, yet discovered_schema raises
    # "field n is int32 in one task of the batch and int64 in another": the batch fails, and
    # every retry plans the same ranges: the supervisor never gets past it.
    from reconciler.pipeline import batch

    declared = pa.schema([("__time", pa.timestamp("us", tz="UTC"))])
    merged = batch.discovered_schema(declared, [pa.schema([("n", pa.int32())]), pa.schema([("n", pa.int64())])])
    assert merged.field("n").type == pa.int64()


def test_a_task_reports_what_it_met_and_the_batch_settles_on_the_join():
    # A task's first record batch decided q long and its later 2.5 was a dead letter; a
    # second task that met "x" first wrote q string: the batch failed on every retry. The
    # task now reports the join of what it met; settle asks the batch to run again with
    # it, and under it the two tasks give the rows one uncut batch gives.
    from reconciler.pipeline.discovered import settle

    a, b, c = {"ts": T0_MS, "q": 1}, {"ts": T0_MS, "q": 2.5}, {"ts": T0_MS, "q": "x", "r": True}
    t = Transformer(DS)
    t(records([a]))
    assert t(records([b])).dead.num_rows == 1
    other = Transformer(DS)
    other(records([c]))
    final, again = settle([pa.schema(t.discovery.report()), pa.schema(other.discovery.report())])
    assert final == {"q": pa.string(), "r": pa.bool_()} and again == final
    whole = _outcome([[a, b, c]])
    assert whole == ([{"q": "1", "r": None}, {"q": "2.5", "r": None}, {"q": "x", "r": True}], [])
    rows = _outcome([[a], [b]], again)[0] + _outcome([[c]], again)[0]
    assert [r["q"] for r in rows] == ["1", "2.5", "x"] and _outcome([[a], [b]], again)[1] == []
    # tasks that agree, or differ only by a promotion Iceberg reads (int files, long table), run once
    assert settle([pa.schema([("n", pa.int32())]), pa.schema([("n", pa.int64())])]) == ({"n": pa.int64()}, {})


def test_two_writer_versions_of_a_new_record_field_keep_every_nested_field():
    # geo met as {city} then as {city, zip} (a writer schema that added a nested field):
    # the first decided {city}, and zip was cast away without a word; the join keeps both.
    from reconciler.pipeline.discovered import Discovered, join, settle

    v1 = pa.struct([("city", pa.string())])
    v2 = pa.struct([("city", pa.string()), ("zip", pa.int32())])
    assert join([v2, v1]) == join([v1, v2]) == v2
    assert join([pa.list_(pa.int32()), pa.list_(pa.int64())]) == pa.list_(pa.int64())
    d = Discovered()
    d.conform({"geo": pa.array([{"city": "a"}], v1)}, ["geo"])
    d.conform({"geo": pa.array([{"city": "b", "zip": 7}], v2)}, ["geo"])
    # the column grew in the task: its earlier files lack zip, which Iceberg reads as null
    assert settle([pa.schema(d.report())]) == ({"geo": v2}, {})
    # another task that met geo as {city} only writes it again under the joined record
    assert settle([pa.schema(d.report()), pa.schema([("geo", v1)])])[1] == {"geo": v2}
    rows, reasons = Discovered({"geo": v2}).conform({"geo": pa.array([{"city": "a"}], v1)}, ["geo"])
    assert rows["geo"].to_pylist() == [{"city": "a", "zip": None}] and reasons == [None]
