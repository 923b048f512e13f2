"""Protobuf values (issue 42): produced by confluent-kafka's own ProtobufSerializer against
the minimal registry (devservices/registry.py), the registry's .proto text compiled by
grpcio-tools' protoc, decoded by ``formats.protobuf``."""

from __future__ import annotations

import importlib
import sys
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from devservices.registry import Registry
from reconciler.errors import RetryableError
from reconciler.model import DataSchema
from reconciler.pipeline.formats import Field, format_for
from reconciler.pipeline.formats.protobuf import ProtobufFormat, read_indexes

CTX = SerializationContext("orders", MessageField.VALUE)
PROTO = """syntax = "proto3";
package acme;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";

enum Status { NEW = 0; PAID = 1; }

message Order {
  message Line { string sku = 1; int32 qty = 2; }
  int32 id = 1;
  google.protobuf.Timestamp ts = 2;
  string country = 3;
  double amount = 4;
  repeated string tags = 5;
  map<string, int64> counts = 6;
  Status status = 7;
  google.protobuf.Int64Value discount = 8;
  Line line = 9;
}

message Note { string text = 1; }
"""
TS = datetime(2026, 11, 28, 7, 0, 1, 250000, tzinfo=UTC)


@pytest.fixture(scope="module")
def pb(tmp_path_factory):
    import grpc_tools
    from grpc_tools import protoc

    out = tmp_path_factory.mktemp("proto")
    (out / "rc_orders.proto").write_text(PROTO)
    include = f"{grpc_tools.__path__[0]}/_proto"
    assert protoc.main(["protoc", f"-I{out}", f"-I{include}", f"--python_out={out}",
                        f"--descriptor_set_out={out / 'orders.desc'}", "--include_imports",
                        str(out / "rc_orders.proto")]) == 0
    sys.path.insert(0, str(out))
    try:
        module = importlib.import_module("rc_orders_pb2")
    finally:
        sys.path.remove(str(out))
    module.DESC = out / "orders.desc"
    return module


@pytest.fixture
def registry():
    from reconciler.pipeline.formats import registry as sources

    sources._FETCHED.clear()  # a port reused by a later test's registry must not see these ids
    with Registry() as reg:
        yield reg


def serialize(reg: Registry, msg) -> bytes:
    ser = ProtobufSerializer(type(msg), SchemaRegistryClient({"url": reg.url}),
                             {"use.deprecated.format": False})
    return ser(msg, CTX)


def order(pb, i: int):
    o = pb.Order(id=i, country="DE", amount=i / 2, tags=["a", "b"], status=pb.PAID)
    o.ts.FromDatetime(TS)
    o.counts["x"] = i
    if i % 2:
        o.discount.value = 7
    o.line.sku = f"sku{i}"
    return o


def fmt(reg: Registry) -> ProtobufFormat:
    ds = DataSchema("orders", "ts", format="protobuf", format_options={"schemaRegistry": {"url": reg.url}})
    return format_for(ds)


def test_values_and_the_type_mapping(pb, registry):
    values = pa.array([serialize(registry, order(pb, i)) for i in range(3)], pa.binary())
    names = ["id", "ts", "country", "amount", "tags", "counts", "status", "discount", "line"]
    d = fmt(registry).decode(values, [Field(n, (n,)) for n in names] + [Field("sku", ("line", "sku"), "string")])
    assert d.dead is None
    c = d.columns
    assert c["id"].type == pa.int32() and c["id"].to_pylist() == [0, 1, 2]
    assert c["ts"].type == pa.timestamp("us", tz="UTC") and c["ts"][0].as_py() == TS
    assert c["tags"].type == pa.list_(pa.string()) and c["tags"][0].as_py() == ["a", "b"]
    assert pa.types.is_map(c["counts"].type) and c["counts"][2].as_py() == [("x", 2)]
    assert c["status"].to_pylist() == ["PAID"] * 3  # enum -> its name
    assert c["discount"].type == pa.int64() and c["discount"].to_pylist() == [None, 7, None]  # wrapper -> optional
    assert c["sku"].to_pylist() == ["sku0", "sku1", "sku2"]
    assert pa.types.is_struct(c["line"].type)


def test_message_indexes_in_both_encodings(pb, registry):
    first = serialize(registry, order(pb, 4))
    assert first[5] == 0  # the serializer writes [0] as a single zero byte
    as_array = first[:5] + b"\x02\x00" + first[6:]  # the same [0] as count 1, index 0
    note = serialize(registry, pb.Note(text="hi"))  # message 1 of the file: [1]
    line = serialize(registry, pb.Order.Line(sku="s", qty=3))  # nested: [0, 0]
    assert read_indexes(note[5:])[0] == [1] and read_indexes(line[5:])[0] == [0, 0]
    d = fmt(registry).decode(pa.array([first, as_array, note, line], pa.binary()),
                             [Field("id", ("id",), "long"), Field("text", ("text",), "string"),
                              Field("sku", ("sku",), "string")])
    assert d.dead is None
    assert d.columns["id"].to_pylist() == [4, 4, None, None]
    assert d.columns["text"].to_pylist() == [None, None, "hi", None]
    assert d.columns["sku"].to_pylist() == [None, None, None, "s"]


def test_bad_input_and_unknown_ids(pb, registry):
    good = serialize(registry, order(pb, 1))
    values = pa.array([b"\x07" + good[1:], b"\x00\x00\x00\x01\x00" + good[5:], good[:-3],
                       good[:5] + b"\x08\x02", good], pa.binary())
    d = fmt(registry).decode(values, [Field("id", ("id",), "long")])
    r = d.dead.to_pylist()
    assert r[0].startswith("no magic byte")
    assert r[1].startswith("unknown schema id 256")
    assert r[2].startswith("truncated or corrupt body for acme.Order")
    assert "message index [1, 1]" in r[3] or "message-index" in r[3] or "not in the schema" in r[3]
    assert r[4] is None and d.columns["id"].to_pylist()[4] == 1


def test_an_incompatible_field_type_is_named(pb, registry):
    values = pa.array([serialize(registry, order(pb, 1))], pa.binary())
    d = fmt(registry).decode(values, [Field("tags", ("tags",), "long")])
    assert "field tags" in d.dead[0].as_py() and "long" in d.dead[0].as_py()


def test_registry_down_is_retryable_and_schemas_are_cached(pb, registry):
    values = pa.array([serialize(registry, order(pb, i)) for i in range(5)], pa.binary())
    f = fmt(registry)
    f.decode(values, [Field("id", ("id",))])
    f.decode(values, [Field("id", ("id",))])
    assert registry.requests["GET /schemas/ids/1"] == 1
    g = fmt(registry)  # a later task: the schema fetched before serves it
    assert g.decode(values, [Field("id", ("id",))]).dead is None
    assert registry.requests["GET /schemas/ids/1"] == 1
    sid = registry.register("x-value", 'syntax = "proto3"; message X { int32 id = 1; }', "PROTOBUF")
    registry.down()
    with pytest.raises(RetryableError, match="unreachable"):
        g.decode(pa.array([b"\x00" + sid.to_bytes(4, "big") + b"\x00"], pa.binary()), [Field("id", ("id",))])


def test_a_descriptor_file_and_plain_bodies(pb, tmp_path):
    (tmp_path / "schemas").mkdir()
    (tmp_path / "schemas" / "orders.desc").write_bytes(pb.DESC.read_bytes())
    ds = DataSchema("orders", "ts", format="protobuf",
                    format_options={"descriptorFile": "schemas/orders.desc", "message": "acme.Order"})
    body = order(pb, 9).SerializeToString()
    d = format_for(ds, str(tmp_path)).decode(pa.array([body, b"\xff\xff"], pa.binary()),
                                             [Field("id", ("id",), "long")])
    assert d.columns["id"].to_pylist() == [9, None]
    assert d.dead.to_pylist()[1].startswith("truncated or corrupt body")


def test_proto_text_in_the_registry_is_compiled_with_protoc(pb, registry):
    """What a real registry answers (and Java producers register): ``.proto`` text."""
    sid = registry.register("orders-value", PROTO, "PROTOBUF")
    body = order(pb, 3).SerializeToString()
    header = b"\x00" + sid.to_bytes(4, "big")
    values = pa.array([header + b"\x00" + body, header + b"\x02\x02" + pb.Note(text="n").SerializeToString()],
                      pa.binary())
    d = fmt(registry).decode(values, [Field("id", ("id",), "long"), Field("ts", ("ts",), "timestamp"),
                                      Field("text", ("text",), "string")])
    assert d.dead is None
    assert d.columns["id"].to_pylist() == [3, None] and d.columns["ts"][0].as_py() == TS
    assert d.columns["text"].to_pylist() == [None, "n"]
