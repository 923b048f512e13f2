"""Typed tables (issue 42) through the task: a schema file resolved against the spec's
directory and sent with the plan, a timestamp of its own type read as that instant, a
registry that is down failing the task (no dead letters), and schema discovery."""

from __future__ import annotations

import io
import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark import cloudpickle

from reconciler.model import DataSchema, KafkaSource, Metric, PartitionRange, SupervisorSpec
from reconciler.pipeline import batch, tasks
from reconciler.pipeline.discovered import settle
from reconciler.streams.base import record_schema
from tests.pipeline.test_protobuf import TS as PROTO_TS
from tests.pipeline.test_protobuf import order as proto_order
from tests.pipeline.test_protobuf import pb  # noqa: F401 - the fixture

T0 = 1_700_000_000_000  # ms
SCHEMA = {"type": "record", "name": "O", "fields": [
    {"name": "id", "type": "long"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "country", "type": "string"}]}


def avro_body(schema: dict, rec: dict) -> bytes:
    from fastavro import parse_schema, schemaless_writer

    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(schema), rec)
    return buf.getvalue()


def records(values: list[bytes | None], stream_ms: int = T0) -> pa.RecordBatch:
    n = len(values)
    schema = record_schema("us")
    cols = {"partition": pa.array(["0"] * n), "offset": pa.array(range(n), pa.int64()),
            "key": pa.nulls(n, pa.binary()), "value": pa.array(values, pa.binary()),
            "stream_time": pa.array([stream_ms * 1000] * n, pa.timestamp("us", tz="UTC"))}
    return pa.RecordBatch.from_arrays([cols[f.name].cast(f.type) for f in schema], schema=schema)


class ValuesReader:
    """A stand-in stream serving the values of ``VALUES`` (one partition, offsets 0..n)."""

    VALUES: list[bytes] = []

    def __init__(self, source: object = None):
        self.source = source

    def read(self, rng: PartitionRange, max_batch_rows: int = 65536):
        yield records(self.VALUES[rng.start:rng.end])


cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Spark's workers need not import it




def spec(ds: DataSchema) -> SupervisorSpec:
    return SupervisorSpec("orders", KafkaSource("unused:1", "t"), ds)


def test_the_schema_file_is_read_under_the_spec_dir_and_travels_with_the_plan(tmp_path, monkeypatch):
    """The file is found relative to the spec's directory (not the daemon's cwd) and its
    bytes are in the task plan: the task reads it even where the file is not."""
    specs = tmp_path / "specs"
    (specs / "schemas").mkdir(parents=True)
    (specs / "schemas" / "o.avsc").write_text(json.dumps(SCHEMA))
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    ds = DataSchema("orders", "ts", format="avro", dimensions=("country",),
                    metrics=(Metric("id", "longSum", "id"),),
                    format_options={"schemaFile": "schemas/o.avsc"})
    ValuesReader.VALUES = [avro_body(SCHEMA, {"id": i, "ts": T0 + i, "country": "DE"}) for i in range(3)]
    ranges = [PartitionRange("0", 0, 3)]
    plan = batch.task_plan(spec(ds), ranges, tmp_path / "d", tmp_path / "dl", spec_dir=str(specs))
    assert plan.format_files == {"schemas/o.avsc": json.dumps(SCHEMA).encode()}
    (specs / "schemas" / "o.avsc").unlink()  # an executor elsewhere has no such file
    plan = tasks.TaskPlan(**{**plan.__dict__, "reader": ValuesReader})
    out = tasks.one_task(plan, plan.groups[0])
    data = [r for r in out if r["kind"] == tasks.DATA]
    assert sum(r["rows"] for r in data) == 3 and not [r for r in out if r["kind"] == tasks.DEAD]
    table = pq.read_table(f"{plan.data_dir}/{data[0]['path']}")
    assert sorted(table.column("id").to_pylist()) == [0, 1, 2]


def test_a_missing_schema_file_says_where_it_was_looked_for(tmp_path):
    ds = DataSchema("orders", "ts", format="avro", format_options={"schemaFile": "schemas/nope.avsc"})
    with pytest.raises(ValueError, match="avro.schemaFile 'schemas/nope.avsc' cannot be read.*specs"):
        batch.task_plan(spec(ds), [PartitionRange("0", 0, 1)], tmp_path / "d", tmp_path / "dl",
                        spec_dir=str(tmp_path / "specs"))


@pytest.mark.parametrize("ts_format", ["auto", "iso", "seconds", "millis"])
def test_an_avro_timestamp_is_that_instant_whatever_the_format(tmp_path, ts_format):
    from reconciler.pipeline.transform import Transformer

    (tmp_path / "o.avsc").write_text(json.dumps(SCHEMA))
    ds = DataSchema("orders", "ts", timestamp_format=ts_format, format="avro", dimensions=("country",),
                    format_options={"schemaFile": "o.avsc"})
    values = [avro_body(SCHEMA, {"id": 1, "ts": T0 + 5, "country": "DE"})]
    out = Transformer(ds, base_dir=str(tmp_path))(records(values))
    assert out.dead.num_rows == 0
    assert out.rows.column("__time").cast(pa.int64()).to_pylist() == [(T0 + 5) * 1000]


@pytest.mark.parametrize("ts_format", ["iso", "seconds", "millis"])
def test_a_typed_timestamp_dimension_is_read_as_an_instant_whatever_the_format(ts_format):
    """JSON: the timestamp column declared as a ``timestamp`` dimension reads by that type's
    rule (ISO text, or a number of seconds or millis) whatever ``timestamp.format`` says."""
    from reconciler.model import Dimension
    from reconciler.pipeline.transform import Transformer

    ds = DataSchema("orders", "ts", timestamp_format=ts_format, format="json", dimensions=("ts", "country"),
                    typed=(Dimension("ts", "timestamp", ("ts",)), Dimension("country", "string", ("country",))))
    values = [json.dumps({"ts": v, "country": "DE"}).encode()
              for v in ("2023-11-14T22:13:20.005Z", T0 + 5, (T0 + 5) / 1000)]
    out = Transformer(ds)(records(values))
    assert out.dead.num_rows == 0, out.dead.column("reason").to_pylist()
    assert out.rows.column("__time").cast(pa.int64()).to_pylist() == [(T0 + 5) * 1000] * 3
    assert out.rows.column("ts").cast(pa.int64()).to_pylist() == [(T0 + 5) * 1000] * 3


def _json_rows(out, names):
    return {n: out.rows.column(n).to_pylist() for n in names}


def test_json_discovery_types_each_field_and_the_first_batch_decides():
    from reconciler.pipeline.transform import Transformer

    ds = DataSchema("orders", "ts", timestamp_format="millis", format="json", dimensions=("country",),
                    schema_discovery=True)
    t = Transformer(ds)
    first = [{"ts": T0, "country": "DE", "qty": 1, "price": 2, "ok": True, "tags": ["a"], "note": "x"},
             {"ts": T0, "country": "FR", "qty": 2, "price": 2.5, "geo": {"lat": 1}}]
    out = t(records([json.dumps(r).encode() for r in first]))
    types = {f.name: f.type for f in out.rows.schema}
    assert types["qty"] == pa.int64() and types["price"] == pa.float64() and types["ok"] == pa.bool_()
    assert types["tags"] == pa.string() and types["geo"] == pa.string() and types["note"] == pa.string()
    assert _json_rows(out, ["qty", "price", "tags", "geo"]) == {
        "qty": [1, 2], "price": [2.0, 2.5], "tags": ['["a"]', None], "geo": [None, '{"lat":1}']}
    assert out.rows.column_names[:2] == ["__time", "country"] and out.dead.num_rows == 0
    # later batches: an integer into the double column converts; a fraction into the long
    # column, or a string into it, is a dead letter naming the field and both types
    later = [{"ts": T0, "price": 3}, {"ts": T0, "qty": 1.5}, {"ts": T0, "qty": "many"}, {"ts": T0, "coupon": "C"}]
    out = t(records([json.dumps(r).encode() for r in later]))
    assert out.rows.column("price").to_pylist() == [3.0, None]
    assert out.rows.column("coupon").to_pylist() == [None, "C"]
    assert out.dead.column("reason").to_pylist() == [
        "incompatible schema: field qty is double, the table reads long",
        "incompatible schema: field qty is string, the table reads long"]  # each value alone, by the column's type


def test_json_discovery_follows_the_tables_types():
    from reconciler.pipeline.transform import Transformer

    ds = DataSchema("orders", "ts", timestamp_format="millis", format="json", schema_discovery=True)
    t = Transformer(ds, table_types={"qty": pa.float64(), "note": pa.string()})
    out = t(records([json.dumps({"ts": T0, "qty": 2, "note": 5}).encode()]))
    assert out.rows.column("qty").to_pylist() == [2.0] and out.rows.column("note").to_pylist() == ["5"]


def test_a_mixed_json_field_in_one_batch_joins_its_kinds_whatever_their_order():
    # It took the first value's kind: (1, "x", 2) a long column and "x" a dead letter,
    # ("x", 1, 2) a string column and no dead letter: the same records, another outcome.
    from reconciler.pipeline.transform import Transformer

    ds = DataSchema("orders", "ts", timestamp_format="millis", format="json", schema_discovery=True)
    for values in ((1, "x", 2), ("x", 1, 2), (2, 1, "x")):
        out = Transformer(ds)(records([json.dumps({"ts": T0, "a": v}).encode() for v in values]))
        assert out.rows.column("a").to_pylist() == [str(v) for v in values] and out.dead.num_rows == 0
    out = Transformer(ds)(records([json.dumps({"ts": T0, "a": v}).encode() for v in (True, 2, 0.5)]))
    assert out.rows.column("a").to_pylist() == ["true", "2", "0.5"]


def test_avro_discovery_writer_fields_and_a_type_the_table_refuses(tmp_path):
    from reconciler.pipeline.transform import Transformer

    schema = {**SCHEMA, "fields": [*SCHEMA["fields"], {"name": "n", "type": "int"},
                                   {"name": "tags", "type": {"type": "array", "items": "string"}}]}
    (tmp_path / "o.avsc").write_text(json.dumps(schema))
    ds = DataSchema("orders", "ts", format="avro", dimensions=("country",), schema_discovery=True,
                    format_options={"schemaFile": "o.avsc"})
    values = [avro_body(schema, {"id": 7, "ts": T0, "country": "DE", "n": 3, "tags": ["a"]})]
    out = Transformer(ds, base_dir=str(tmp_path), table_types={"n": pa.int64()})(records(values))
    assert out.rows.column_names == ["__time", "country", "id", "n", "tags", "time_chunk"]
    assert out.rows.schema.field("n").type == pa.int64() and out.rows.column("tags").to_pylist() == [["a"]]
    refused = Transformer(ds, base_dir=str(tmp_path), table_types={"id": pa.string(), "tags": pa.int64()})
    out = refused(records(values))
    assert out.rows.num_rows == 0
    assert out.dead.column("reason").to_pylist() == [
        "incompatible schema: field tags is list<element: string not null>, the table reads long"]


def test_a_task_reports_its_discovered_columns_and_the_batch_unions_them(tmp_path):
    """The plan carries the table's types; each task reports its discovered columns; the
    batch's schema is the declared columns and those (what the publish evolves the table to)."""
    ValuesReader.VALUES = [json.dumps({"ts": T0 + i, "country": "DE", "qty": i, "note": "n"}).encode()
                           for i in range(3)]
    ds = DataSchema("orders", "ts", timestamp_format="millis", format="json", dimensions=("country",),
                    schema_discovery=True)
    table = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("country", pa.large_string()),
                       ("note", pa.large_string())])
    plan = batch.task_plan(spec(ds), [PartitionRange("0", 0, 3)], tmp_path / "d", tmp_path / "dl",
                           table_schema=table)
    assert plan.table_types["note"] == pa.string()
    plan = tasks.TaskPlan(**{**plan.__dict__, "reader": ValuesReader})
    out = tasks.one_task(plan, plan.groups[0])
    [row] = [r for r in out if r["kind"] == tasks.SCHEMA]
    found = tasks._schema_of(row["path"])
    assert [(f.name, f.type) for f in found] == [("qty", pa.int64()), ("note", pa.string())]
    declared = pa.schema([("__time", pa.timestamp("us", tz="UTC")), ("country", pa.string())])
    union = batch.discovered_schema(declared, [found, pa.schema([("coupon", pa.string()), ("qty", pa.int64())])])
    assert union.names == ["__time", "country", "qty", "note", "coupon"]
    # tasks that typed qty long and double: the batch is run again with double (settle), never failed
    assert batch.discovered_schema(declared, [found, pa.schema([("qty", pa.float64())])]).field("qty").type \
        == pa.float64()
    assert settle([found, pa.schema([("qty", pa.float64())])])[1]["qty"] == pa.float64()


class DownRegistryReader(ValuesReader):
    """Avro values in the wire format under an id no registry can answer for (port 9)."""

    VALUES = [b"\x00\x00\x00\x00\x01" + avro_body(SCHEMA, {"id": 1, "ts": T0, "country": "DE"})]


@pytest.mark.integration
@pytest.mark.spark
def test_through_spark_discovery_and_a_registry_that_is_down(spark, tmp_path):
    """Real Spark tasks: discovered columns come back to the driver; a registry that does
    not answer fails the task with the product's own message (kind "unavailable": status
    shows it, the batch is not published) and writes no dead letter."""
    from reconciler.pipeline.worker_errors import product_message

    ValuesReader.VALUES = [json.dumps({"ts": T0 + i, "qty": i}).encode() for i in range(3)]
    ds = DataSchema("orders", "ts", timestamp_format="millis", format="json", schema_discovery=True)
    plan = batch.task_plan(spec(ds), [PartitionRange("0", 0, 3)], tmp_path / "d", tmp_path / "dl")
    results = tasks.run(spark, tasks.TaskPlan(**{**plan.__dict__, "reader": ValuesReader}))
    assert [[(f.name, f.type) for f in s] for s in results.discovered] == [[("qty", pa.int64())]]

    down = DataSchema("orders", "ts", format="avro",
                      format_options={"schemaRegistry": {"url": "http://127.0.0.1:9"}})
    plan = batch.task_plan(spec(down), [PartitionRange("0", 0, 1)], tmp_path / "d2", tmp_path / "dl2")
    with pytest.raises(Exception) as info:  # noqa: B017 (PySpark's own exception type varies by mode)
        tasks.run(spark, tasks.TaskPlan(**{**plan.__dict__, "reader": DownRegistryReader}))
    found = product_message(info.value)
    assert found is not None and found.kind == "unavailable", str(info.value)[-2000:]
    assert found.message.startswith("schema registry http://127.0.0.1:9 is unreachable")
    assert not (tmp_path / "dl2").exists() or not list((tmp_path / "dl2").rglob("*.parquet"))


@pytest.mark.parametrize("ts_format", ["iso", "seconds"])
def test_a_protobuf_timestamp_is_that_instant_whatever_the_format(pb, ts_format):
    """google.protobuf.Timestamp read as its instant; the descriptor's bytes from the plan."""
    from reconciler.pipeline.transform import Transformer

    ds = DataSchema("orders", "ts", timestamp_format=ts_format, format="protobuf", dimensions=("country",),
                    schema_discovery=True,
                    format_options={"descriptorFile": "schemas/orders.desc", "message": "acme.Order"})
    t = Transformer(ds, files={"schemas/orders.desc": pb.DESC.read_bytes()})
    out = t(records([proto_order(pb, 3).SerializeToString()]))
    assert out.dead.num_rows == 0, out.dead.column("reason").to_pylist()
    assert out.rows.column("__time").to_pylist() == [PROTO_TS]
    assert out.rows.column("id").to_pylist() == [3] and out.rows.column("tags").to_pylist() == [["a", "b"]]


def test_the_tables_nested_types_as_pyiceberg_hands_them_take_the_same_values(tmp_path):
    """pyiceberg's Arrow schema has large strings and lists (nested too): the plan's types
    are plain ones, so a record column the table has already is no incompatible change."""
    from reconciler.pipeline.transform import Transformer

    schema = {**SCHEMA, "fields": [*SCHEMA["fields"],
                                   {"name": "geo", "type": {"type": "record", "name": "G", "fields": [
                                       {"name": "city", "type": "string"}]}},
                                   {"name": "tags", "type": {"type": "array", "items": "string"}}]}
    (tmp_path / "o.avsc").write_text(json.dumps(schema))
    ds = DataSchema("orders", "ts", format="avro", schema_discovery=True, format_options={"schemaFile": "o.avsc"})
    table = pa.schema([pa.field("geo", pa.struct([pa.field("city", pa.large_string())])),
                       pa.field("tags", pa.large_list(pa.large_string()))])
    plan = batch.task_plan(spec(ds), [PartitionRange("0", 0, 1)], tmp_path / "d", tmp_path / "dl",
                           spec_dir=str(tmp_path), table_schema=table)
    t = Transformer(ds, files=plan.format_files, table_types=plan.table_types)
    out = t(records([avro_body(schema, {"id": 1, "ts": T0, "country": "DE", "geo": {"city": "B"},
                                        "tags": ["x"]})]))
    assert out.dead.num_rows == 0, out.dead.column("reason").to_pylist()
    assert out.rows.column("geo").to_pylist() == [{"city": "B"}]
