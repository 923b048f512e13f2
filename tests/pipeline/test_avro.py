"""Avro values (issue 42): produced by confluent-kafka's own AvroSerializer against the
minimal registry (devservices/registry.py), decoded by ``formats.avro`` in bulk and per
record, resolved onto the fields the data schema reads."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from devservices.registry import Registry
from reconciler.errors import RetryableError
from reconciler.model import DataSchema
from reconciler.pipeline.formats import Field, FormatUnavailable, format_for
from reconciler.pipeline.formats import avro as avro_mod
from reconciler.pipeline.formats.avro import AvroFormat

CTX = SerializationContext("orders", MessageField.VALUE)
V1 = {"type": "record", "name": "Order", "namespace": "acme", "fields": [
    {"name": "id", "type": "int"},
    {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "country", "type": ["null", "string"], "default": None},
    {"name": "amount", "type": "double"},
]}
V2 = {**V1, "fields": [*V1["fields"], {"name": "channel", "type": "string", "default": "web"}]}
WIDE = {**V1, "fields": [{"name": "id", "type": "long"}, *V1["fields"][1:]]}
BROKEN = {**V1, "fields": [{"name": "id", "type": "string"}, *V1["fields"][1:]]}
FIELDS = [Field("id", ("id",), "long"), Field("ts", ("ts",), "timestamp"),
          Field("country", ("country",), "string"), Field("amount", ("amount",), "double")]
T0 = 1_700_000_000_000


@pytest.fixture
def registry():
    from reconciler.pipeline.formats import registry as sources

    sources._FETCHED.clear()  # a port reused by a later test's registry must not see these ids
    with Registry() as reg:
        yield reg


def serializer(reg: Registry, schema: dict) -> AvroSerializer:
    return AvroSerializer(SchemaRegistryClient({"url": reg.url}), json.dumps(schema))


def order(i: int, **extra) -> dict:
    return {"id": i, "ts": T0 + i, "country": None if i % 3 == 0 else "DE", "amount": i / 2, **extra}


def fmt(reg: Registry, bulk: bool = True, **opts) -> AvroFormat:
    ds = DataSchema("orders", "ts", format="avro",
                    format_options={"schemaRegistry": {"url": reg.url, **opts}})
    f = format_for(ds)
    assert isinstance(f, AvroFormat)
    f.bulk = bulk
    return f


@pytest.fixture(params=["bulk", "per-record"])
def bulk(request, monkeypatch):
    """Both paths: DuckDB's reader over a container file, and fastavro per record."""
    monkeypatch.setattr(avro_mod, "BULK_MIN", 1)
    return request.param == "bulk"


def test_values_and_types_from_the_real_serializer(registry, bulk):
    ser = serializer(registry, V1)
    values = pa.array([ser(order(i), CTX) for i in range(300)], pa.binary())
    d = fmt(registry, bulk).decode(values, FIELDS)
    assert d.dead is None
    assert d.columns["id"].type == pa.int64() and d.columns["id"].to_pylist() == list(range(300))
    assert d.columns["ts"].type == pa.timestamp("us", tz="UTC")
    assert d.columns["ts"][7].as_py() == datetime.fromtimestamp((T0 + 7) / 1000, UTC)
    assert d.columns["country"].to_pylist()[:4] == [None, "DE", "DE", None]
    assert d.columns["amount"].to_pylist()[5] == 2.5


def test_bulk_and_per_record_agree(registry, monkeypatch):
    monkeypatch.setattr(avro_mod, "BULK_MIN", 1)
    ser = serializer(registry, V1)
    values = pa.array([ser(order(i), CTX) for i in range(500)], pa.binary())
    a, b = fmt(registry, True).decode(values, FIELDS), fmt(registry, False).decode(values, FIELDS)
    assert {k: v.to_pylist() for k, v in a.columns.items()} == {k: v.to_pylist() for k, v in b.columns.items()}


def test_v2_adds_a_field_old_and_new_records_in_one_batch(registry, bulk):
    old, new = serializer(registry, V1), serializer(registry, V2)
    values = pa.array([old(order(0), CTX), new(order(1, channel="app"), CTX), old(order(2), CTX)], pa.binary())
    d = fmt(registry, bulk).decode(values, [*FIELDS, Field("channel", ("channel",), "string")])
    assert d.dead is None
    assert d.columns["id"].to_pylist() == [0, 1, 2]
    assert d.columns["channel"].to_pylist() == [None, "app", None]


def test_int_widens_to_long_across_writer_schemas(registry, bulk):
    narrow, wide = serializer(registry, V1), serializer(registry, WIDE)
    values = pa.array([narrow(order(1), CTX), wide(order(2**40), CTX)], pa.binary())
    own = [Field("id", ("id",))]  # the format's own type: the two writers' types unify
    d = fmt(registry, bulk).decode(values, own)
    assert d.dead is None
    assert d.columns["id"].type == pa.int64() and d.columns["id"].to_pylist() == [1, 2**40]


def test_an_incompatible_writer_is_dead_letters_naming_field_and_types(registry, bulk):
    good, bad = serializer(registry, V1), serializer(registry, BROKEN)
    values = pa.array([good(order(1), CTX), bad({**order(2), "id": "two"}, CTX), good(order(3), CTX)],
                      pa.binary())
    d = fmt(registry, bulk).decode(values, FIELDS)
    reasons = d.dead.to_pylist()
    assert reasons[0] is None and reasons[2] is None
    assert "field id" in reasons[1] and "string" in reasons[1] and "long" in reasons[1]
    assert d.columns["id"].to_pylist() == [1, None, 3]


def test_each_kind_of_bad_input_has_its_reason(registry, bulk):
    ser = serializer(registry, V1)
    good = ser(order(5), CTX)
    values = pa.array([b"\x01" + good[1:], b"\x00\x00\x00\x00\x63" + good[5:], good[:8],
                       good[:3], good, None], pa.binary())
    d = fmt(registry, bulk).decode(values, FIELDS)
    reasons = d.dead.to_pylist()
    assert reasons[0].startswith("no magic byte")
    assert reasons[1].startswith("unknown schema id 99")
    assert reasons[2].startswith("truncated body")
    assert reasons[3].startswith("truncated header")
    assert reasons[4] is None and reasons[5] is None  # a tombstone is the transform's to judge
    assert d.columns["id"].to_pylist() == [None, None, None, None, 5, None]


def test_a_corrupt_body_among_many_is_found_by_the_per_record_path(registry, monkeypatch):
    monkeypatch.setattr(avro_mod, "BULK_MIN", 1)
    ser = serializer(registry, V1)
    values = [ser(order(i), CTX) for i in range(50)]
    values[17] = values[17][:7]
    d = fmt(registry, True).decode(pa.array(values, pa.binary()), FIELDS)
    reasons = d.dead.to_pylist()
    assert [i for i, r in enumerate(reasons) if r] == [17]
    assert d.columns["id"].to_pylist()[16:19] == [16, None, 18]


def test_registry_down_raises_retryable_and_makes_no_dead_letter(registry):
    ser = serializer(registry, V1)
    values = pa.array([ser(order(1), CTX)], pa.binary())
    f = fmt(registry)
    registry.down()
    with pytest.raises(RetryableError, match="unreachable.*retried") as e:
        f.decode(values, FIELDS)
    assert isinstance(e.value, FormatUnavailable)
    registry.up()
    assert f.decode(values, FIELDS).dead is None


def test_schemas_are_fetched_once_per_id(registry):
    ser = serializer(registry, V1)
    values = pa.array([ser(order(i), CTX) for i in range(10)] + [b"\x00\x00\x00\x00\x07\x00"], pa.binary())
    f = fmt(registry)
    for _ in range(3):
        f.decode(values, FIELDS)
    assert registry.requests["GET /schemas/ids/1"] == 1
    assert registry.requests["GET /schemas/ids/7"] == 1  # a 404 is remembered too


def test_basic_auth_password_from_a_granted_reference(monkeypatch):
    from reconciler.spec import grants

    monkeypatch.setenv("REG_PASSWORD", "s3cret")
    monkeypatch.setattr(grants, "current", lambda: grants.Grants(secrets_dir=None, env=frozenset({"REG_PASSWORD"})))
    with Registry(auth=("ingest", "s3cret")) as reg:
        client = SchemaRegistryClient({"url": reg.url, "basic.auth.user.info": "ingest:s3cret"})
        value = AvroSerializer(client, json.dumps(V1))(order(1), CTX)
        f = fmt(reg, basicAuth={"username": "ingest", "password": "${env:REG_PASSWORD}"})
        assert f.decode(pa.array([value], pa.binary()), FIELDS).columns["id"].to_pylist() == [1]


def test_the_mapping_of_avro_types(registry):
    schema = {"type": "record", "name": "All", "fields": [
        {"name": "b", "type": "bytes"}, {"name": "fx", "type": {"type": "fixed", "name": "F", "size": 2}},
        {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
        {"name": "arr", "type": {"type": "array", "items": "int"}},
        {"name": "m", "type": {"type": "map", "values": "long"}},
        {"name": "u", "type": ["null", "int", "string"]},
        {"name": "d", "type": {"type": "int", "logicalType": "date"}},
        {"name": "lt", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "dec", "type": {"type": "bytes", "logicalType": "decimal", "precision": 6, "scale": 2}},
        {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
        {"name": "rec", "type": {"type": "record", "name": "R", "fields": [{"name": "x", "type": "float"}]}},
    ]}
    import uuid

    u = uuid.UUID(int=5)
    rec = {"b": b"\x01", "fx": b"ab", "e": "B", "arr": [1, 2], "m": {"k": 3}, "u": "s",
           "d": datetime(2026, 1, 2).date(), "lt": datetime(2026, 1, 2, 3, 4), "dec": Decimal("12.34"),
           "id": u, "rec": {"x": 1.5}}
    value = serializer(registry, schema)(rec, CTX)
    d = fmt(registry).decode(pa.array([value], pa.binary()), [Field(k, (k,)) for k in rec])
    types = {k: v.type for k, v in d.columns.items()}
    assert types["b"] == types["fx"] == pa.binary()
    assert types["e"] == pa.string() and d.columns["e"][0].as_py() == "B"
    assert pa.types.is_list(types["arr"]) and pa.types.is_map(types["m"])
    assert d.columns["u"][0].as_py() == {"union_opt_1": None, "union_opt_2": "s"}
    assert types["d"] == pa.date32() and types["lt"] == pa.timestamp("us")
    assert types["dec"] == pa.decimal128(6, 2) and d.columns["dec"][0].as_py() == Decimal("12.34")
    assert d.columns["id"][0].as_py() == str(u)
    assert d.columns["rec"][0].as_py() == {"x": 1.5}


def test_a_nested_path_and_schema_file(tmp_path):
    schema = {"type": "record", "name": "O", "fields": [
        {"name": "geo", "type": {"type": "record", "name": "G", "fields": [{"name": "country", "type": "string"}]}}]}
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "o.avsc").write_text(json.dumps(schema))
    import io

    from fastavro import parse_schema, schemaless_writer

    buf = io.BytesIO()
    schemaless_writer(buf, parse_schema(schema), {"geo": {"country": "FR"}})
    ds = DataSchema("o", "ts", format="avro", format_options={"schemaFile": "schemas/o.avsc"})
    d = format_for(ds, str(tmp_path)).decode(pa.array([buf.getvalue()], pa.binary()),
                                             [Field("country", ("geo", "country"), "string")])
    assert d.columns["country"].to_pylist() == ["FR"]


def test_through_the_transform(registry):
    """The pipeline's Transformer picks the format by name and writes its dead letters."""
    from reconciler.model import Metric
    from reconciler.pipeline.transform import Transformer
    from reconciler.streams.base import record_schema

    ser = serializer(registry, V1)
    values = [ser(order(i), CTX) for i in range(4)] + [b"\x05x"]
    ds = DataSchema("orders", "ts", format="avro", dimensions=("country",),
                    metrics=(Metric("amount", "doubleSum", "amount"),),
                    format_options={"schemaRegistry": {"url": registry.url}})
    n = len(values)
    cols = {"partition": pa.array(["0"] * n), "offset": pa.array(range(n), pa.int64()),
            "key": pa.nulls(n, pa.binary()), "value": pa.array(values, pa.binary()),
            "stream_time": pa.array([T0 * 1000] * n, pa.timestamp("us", tz="UTC"))}
    schema = record_schema("us")
    out = Transformer(ds)(pa.RecordBatch.from_arrays([cols[f.name].cast(f.type) for f in schema], schema=schema))
    assert out.rows.column("amount").to_pylist() == [0.0, 0.5, 1.0, 1.5]
    assert out.rows.column("country").to_pylist() == [None, "DE", "DE", None]
    assert out.dead.column("reason").to_pylist() == [
        "no magic byte: not in the Confluent wire format (byte 0 must be 0)"]
