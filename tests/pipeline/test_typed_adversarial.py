"""Issue 42's discovery join under adversarial input (a review of 80b479c..76962af).

Each test failed on the code under review: a concrete input whose batch failed on every
retry (the supervisor never got past it), or whose row depended on how the table's
columns are ordered or how the batch is cut into tasks. Column names are unique whatever
their case (docs/spec.md, Discovery): a key that differs from a column only in case is a
dead letter naming both spellings."""

from __future__ import annotations

import json

import pyarrow as pa

from reconciler.model import DataSchema, PartitionRange
from reconciler.pipeline import batch, tasks
from reconciler.pipeline.discovered import settle
from reconciler.pipeline.transform import Transformer
from tests.pipeline.test_transform import T0_MS
from tests.pipeline.test_transform import records as json_records
from tests.pipeline.test_typed_tables import T0, ValuesReader, avro_body, records, spec

_TS = {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}}


def _avro(tmp_path, name: str, fields: list[dict]) -> tuple[DataSchema, dict]:
    schema = {"type": "record", "name": "O", "fields": [{"name": "id", "type": "long"}, _TS, *fields]}
    (tmp_path / name).write_text(json.dumps(schema))
    ds = DataSchema("orders", "ts", format="avro", schema_discovery=True, format_options={"schemaFile": name})
    return ds, schema


def test_an_avro_long_beyond_2_53_under_the_joined_double_is_a_dead_letter_not_a_failed_batch(tmp_path):
    # One batch, two tasks: partition 0 was written by writer v1 (n: long), partition 1 by
    # writer v2 (n: double; Avro's long -> double evolution). The join is double, so
    # run_batch runs the batch again with n double. In the rerun the v1 task casts its long
    # column to double with Arrow's safe cast, which RAISES on 2**53 + 1 (ArrowInvalid:
    # "Integer value 9007199254740993 not in range"): the task fails, the batch fails, and
    # every retry reads the same record. The same happens once the table has n double (a
    # later batch of writer v1). JSON's rule for the same value: a dead letter "field n:
    # 9007199254740993 would lose precision as double".
    v1, s1 = _avro(tmp_path, "v1.avsc", [{"name": "n", "type": "long"}])
    v2, s2 = _avro(tmp_path, "v2.avsc", [{"name": "n", "type": "double"}])
    task_a = Transformer(v1, base_dir=str(tmp_path))
    task_a(records([avro_body(s1, {"id": 1, "ts": T0, "n": 5}), avro_body(s1, {"id": 2, "ts": T0, "n": 2**53 + 1})]))
    task_b = Transformer(v2, base_dir=str(tmp_path))
    task_b(records([avro_body(s2, {"id": 3, "ts": T0, "n": 0.5})]))
    final, again = settle([pa.schema(task_a.discovery.report()), pa.schema(task_b.discovery.report())])
    assert again["n"] == pa.float64()
    rerun = Transformer(v1, base_dir=str(tmp_path), table_types=again)
    out = rerun(records([avro_body(s1, {"id": 1, "ts": T0, "n": 5}),
                         avro_body(s1, {"id": 2, "ts": T0, "n": 2**53 + 1})]))  # ArrowInvalid on the code under review
    assert out.rows.column("n").to_pylist() == [5.0]
    [reason] = out.dead.column("reason").to_pylist()
    assert "field n" in reason


def test_an_avro_int_under_a_float_column_beyond_2_24_does_not_fail_the_batch(tmp_path):
    # The table has m float (writer v1 m: float); writer v2 has m: int (Avro resolves int ->
    # float). avrotypes.widens ranks int below float, so conform casts int32 -> float32,
    # which raises on 16777217: the batch fails on every retry.
    ds, s = _avro(tmp_path, "v.avsc", [{"name": "m", "type": "int"}])
    t = Transformer(ds, base_dir=str(tmp_path), table_types={"m": pa.float32()})
    out = t(records([avro_body(s, {"id": 1, "ts": T0, "m": 2**24 + 1})]))  # ArrowInvalid
    assert out.rows.num_rows + out.dead.num_rows == 1
    assert out.rows.num_rows == 0 or out.rows.column("m").cast(pa.float64()).to_pylist() == [2**24 + 1]


def test_an_empty_avro_record_field_does_not_fail_the_task_on_every_retry(tmp_path):
    # Writer schema with a field whose record has no fields ({"type": "record", "fields": []},
    # valid Avro; Protobuf's google.protobuf.Empty-like messages are the same). Discovery
    # makes it a struct<> column and the task's Parquet writer raises "Cannot write struct
    # type 'meta' with no child field to Parquet": every retry fails the same way.
    ds, s = _avro(tmp_path, "e.avsc", [{"name": "meta", "type": {"type": "record", "name": "M", "fields": []}}])
    ValuesReader.VALUES = [avro_body(s, {"id": i, "ts": T0, "meta": {}}) for i in range(3)]
    plan = batch.task_plan(spec(ds), [PartitionRange("0", 0, 3)], tmp_path / "d", tmp_path / "dl",
                           spec_dir=str(tmp_path))
    plan = tasks.TaskPlan(**{**plan.__dict__, "reader": ValuesReader})
    out = tasks.one_task(plan, plan.groups[0])  # ArrowNotImplementedError on the code under review
    written = sum(r["rows"] for r in out if r["kind"] in (tasks.DATA, tasks.DEAD))
    assert written == 3


JDS = DataSchema("orders", "ts", timestamp_format="millis", format="json", schema_discovery=True)


def test_keys_differing_only_in_case_keep_their_own_table_types():
    # The table has both columns Q (long) and q (string): the first batch met
    # {"Q": 1, "q": "x"} and settled two columns (JSON keys, Iceberg names are case
    # sensitive). Discovered keys the table's types by lower-case name, so one of the two
    # shadows the other: with the table's columns in the order (Q, q) the record's Q lands
    # as the STRING "7" in a file whose column Q the table reads as long; in the order
    # (q, Q) the same record is a dead letter "field q is string, the table reads long".
    # The same record's fate depends on the order of the table's columns.
    rec = {"ts": T0_MS, "Q": 7, "q": "x"}
    for table in ({"Q": pa.int64(), "q": pa.string()}, {"q": pa.string(), "Q": pa.int64()}):
        out = Transformer(JDS, table_types=table)(json_records([rec]))
        assert out.dead.num_rows == 0, (table, out.dead.column("reason").to_pylist())
        assert out.rows.schema.field("Q").type == pa.int64(), (table, out.rows.schema)
        assert out.rows.column("Q").to_pylist() == [7] and out.rows.column("q").to_pylist() == ["x"]


def _batch(parts: list[list[dict]]) -> tuple[dict, list[str]]:
    """One batch cut into ``parts`` (one task each), run as ``run_batch`` runs it: again with
    the joined types when ``settle`` asks. (The settled types, the dead letters' reasons.)"""

    def task(recs, table=None):
        t = Transformer(JDS, table_types=table)
        out = t(json_records(recs))
        return pa.schema(t.discovery.report()), out.dead.column("reason").to_pylist()

    runs = [task(p) for p in parts]
    final, again = settle([r for r, _ in runs])
    if again:
        runs = [task(p, again) for p in parts]
        final, _ = settle([r for r, _ in runs])
    return final, sorted(why for _, whys in runs for why in whys)


def test_keys_differing_only_in_case_take_one_type_whatever_the_cut_into_tasks():
    # The same three records, one task or two. Before: the cut's rerun keyed the joined
    # types by lower-case name, so Q was decided string in the rerun and long without it.
    # Now the spelling that sorts first (Q) is the column whichever task met which, and q a
    # dead letter naming both spellings, in every cut.
    a = {"ts": T0_MS, "Q": 1, "q": "x", "z": 1}
    b = {"ts": T0_MS, "z": 2.5}
    whole = _batch([[a, b]])
    assert _batch([[a], [b]]) == _batch([[b], [a]]) == whole
    types, dead = whole
    assert types == {"Q": pa.int64(), "z": pa.float64()}
    assert dead == ["field q: the table has a column Q; a column name that differs from another only in case is "
                    "refused (Trino, Glue and Hive read both as one)"]


def test_the_spelling_that_sorts_first_is_the_column_whichever_task_meets_it_first():
    lower, upper = {"ts": T0_MS, "q": "x"}, {"ts": T0_MS, "Q": 7}
    for parts in ([[lower, upper]], [[upper, lower]], [[lower], [upper]], [[upper], [lower]]):
        types, dead = _batch(parts)
        assert types == {"Q": pa.int64()}, parts
        assert [d.split(";")[0] for d in dead] == ["field q: the table has a column Q"], parts


def test_a_key_differing_from_the_tables_column_only_in_case_is_a_dead_letter_not_a_second_column():
    out = Transformer(JDS, table_types={"Qty": pa.int64()})(json_records([{"ts": T0_MS, "qty": 3},
                                                                           {"ts": T0_MS, "Qty": 4}]))
    assert out.rows.column_names.count("qty") == 0 and out.rows.column("Qty").to_pylist() == [4]
    [why] = out.dead.column("reason").to_pylist()
    assert why.startswith("field qty: the table has a column Qty;")


def test_a_key_named_as_a_virtual_column_in_another_case_is_no_column_as_in_its_own_case():
    # Before: "__partition" was left out while "__Partition" became a column of its own,
    # which Trino, Glue and Hive read as the virtual column.
    out = Transformer(JDS)(json_records([{"ts": T0_MS, "__partition": "p", "__Partition": "P", "k": 1}]))
    assert [c for c in out.rows.column_names if c.lower() == "__partition"] == []
    assert out.rows.column("k").to_pylist() == [1] and out.dead.num_rows == 0
