"""Avro and Protobuf schemas -> the Arrow types of the table's columns (issue 42).

The mapping is Iceberg's, with Redpanda's answer where Iceberg has none:

* Avro: int/long/float/double/boolean/string as themselves; bytes and fixed -> binary;
  enum -> string; record -> struct; array -> list; map -> map<string, T>; a union of null
  and T -> T, nullable; any other union -> a struct of one nullable field per branch
  (``union_opt_<i>``, i the branch's position in the union, as Redpanda names them);
  logical types date, time-millis/micros, timestamp-millis/micros (-> timestamptz,
  microseconds UTC), local-timestamp-millis/micros (-> timestamp without zone), decimal,
  uuid (-> string, its canonical text).
* Protobuf: message -> struct; repeated -> list; map -> map; enum -> string;
  ``google.protobuf.Timestamp`` -> timestamptz; the wrapper types (``Int64Value``...) ->
  their value, nullable; every field is nullable (proto3 has no "required").

``widens(writer, reader)``: whether the writer's type can be read as the reader's (Avro's
promotion rules: int -> long -> float -> double, and the same inside structs, lists and
maps); a writer schema that fails it is an incompatible change. Iceberg promotes only int
-> long and float -> double; the other steps can round a value (a long beyond 2^53 as a
double, an int beyond 2^24 as a float), so each value is cast alone
(``pipeline.casts.cast_exact``) and one that would round is a dead letter, never a batch
that fails.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

TIMESTAMPTZ = pa.timestamp("us", tz="UTC")

_PRIMITIVE = {
    "null": pa.null(), "boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(),
    "float": pa.float32(), "double": pa.float64(), "bytes": pa.binary(), "string": pa.string(),
}
_LOGICAL = {
    "date": pa.date32(), "time-millis": pa.time32("ms"), "time-micros": pa.time64("us"),
    "timestamp-millis": TIMESTAMPTZ, "timestamp-micros": TIMESTAMPTZ,
    "local-timestamp-millis": pa.timestamp("us"), "local-timestamp-micros": pa.timestamp("us"),
    "uuid": pa.string(),
}


class UnsupportedSchema(ValueError):
    """A schema uses something the table cannot hold (the message names it)."""


def union_branch(i: int) -> str:
    return f"union_opt_{i}"


def avro_schema_type(schema: Any) -> pa.Schema:
    """The Arrow schema of an Avro record schema's fields (parsed JSON)."""
    t = avro_type(schema)
    if not pa.types.is_struct(t):
        raise UnsupportedSchema(f"an Avro value schema must be a record, not {schema!r:.80}")
    return pa.schema([t.field(i) for i in range(t.num_fields)])


def avro_type(schema: Any, named: dict[str, Any] | None = None, namespace: str = "") -> pa.DataType:
    """The Arrow type of one Avro schema (a nullable union's ``T``)."""
    return _avro(schema, {} if named is None else named, namespace)[0]


def _full(name: str, namespace: str) -> str:
    return name if "." in name or not namespace else f"{namespace}.{name}"


def _avro(schema: Any, named: dict[str, Any], ns: str) -> tuple[pa.DataType, bool]:
    """(the type, whether it is nullable)."""
    if isinstance(schema, str):
        if schema in _PRIMITIVE:
            return _PRIMITIVE[schema], schema == "null"
        key = _full(schema, ns) if _full(schema, ns) in named else schema
        if key not in named:
            raise UnsupportedSchema(f"unknown Avro type name {schema!r}")
        return _avro(named[key], named, ns)
    if isinstance(schema, list):
        branches = [b for b in schema if b != "null"]
        if len(branches) == 1:
            return _avro(branches[0], named, ns)[0], True
        fields = [pa.field(union_branch(i), _avro(b, named, ns)[0])
                  for i, b in enumerate(schema) if b != "null"]
        return pa.struct(fields), "null" in schema
    if not isinstance(schema, Mapping):
        raise UnsupportedSchema(f"not an Avro schema: {schema!r:.80}")
    kind = schema.get("type")
    logical = schema.get("logicalType")
    if logical == "decimal":
        return pa.decimal128(int(schema["precision"]), int(schema.get("scale", 0))), False
    if logical in _LOGICAL:
        return _LOGICAL[logical], False
    if kind in ("record", "error", "enum", "fixed"):
        name = _full(str(schema["name"]), str(schema.get("namespace", ns)))
        named[name] = schema
        ns = name.rpartition(".")[0]
    if kind in ("record", "error"):
        return pa.struct([pa.field(f["name"], *_avro(f["type"], named, ns))
                          for f in schema["fields"]]), False
    if kind == "enum":
        return pa.string(), False
    if kind == "fixed":
        return pa.binary(), False
    if kind == "array":
        return pa.list_(pa.field("element", *_avro(schema["items"], named, ns))), False
    if kind == "map":
        return pa.map_(pa.string(), pa.field("value", *_avro(schema["values"], named, ns))), False
    return _avro(kind, named, ns)


# --------------------------------------------------------------------------- protobuf

WRAPPERS = {
    "google.protobuf.DoubleValue": pa.float64(), "google.protobuf.FloatValue": pa.float32(),
    "google.protobuf.Int64Value": pa.int64(), "google.protobuf.UInt64Value": pa.uint64(),
    "google.protobuf.Int32Value": pa.int32(), "google.protobuf.UInt32Value": pa.uint32(),
    "google.protobuf.BoolValue": pa.bool_(), "google.protobuf.StringValue": pa.string(),
    "google.protobuf.BytesValue": pa.binary(),
}
TIMESTAMP_MESSAGE = "google.protobuf.Timestamp"


def proto_scalar_types() -> dict[int, pa.DataType]:
    from google.protobuf.descriptor import FieldDescriptor as F

    return {
        F.TYPE_DOUBLE: pa.float64(), F.TYPE_FLOAT: pa.float32(), F.TYPE_INT64: pa.int64(),
        F.TYPE_UINT64: pa.uint64(), F.TYPE_INT32: pa.int32(), F.TYPE_FIXED64: pa.uint64(),
        F.TYPE_FIXED32: pa.uint32(), F.TYPE_BOOL: pa.bool_(), F.TYPE_STRING: pa.string(),
        F.TYPE_BYTES: pa.binary(), F.TYPE_UINT32: pa.uint32(), F.TYPE_ENUM: pa.string(),
        F.TYPE_SFIXED32: pa.int32(), F.TYPE_SFIXED64: pa.int64(), F.TYPE_SINT32: pa.int32(),
        F.TYPE_SINT64: pa.int64(),
    }


def proto_message_type(descriptor: Any, _depth: int = 0) -> pa.DataType:
    """The Arrow struct of a protobuf message descriptor."""
    if _depth > 32:
        raise UnsupportedSchema(f"message {descriptor.full_name} nests itself: a table cannot hold it")
    return pa.struct([pa.field(f.name, proto_field_type(f, _depth)) for f in descriptor.fields])


def proto_field_type(f: Any, depth: int = 0) -> pa.DataType:
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        key, value = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
        return pa.map_(_proto_single(key, depth), _proto_single(value, depth))
    single = _proto_single(f, depth)
    return pa.list_(single) if _repeated(f) else single


def _repeated(f: Any) -> bool:
    is_repeated = getattr(f, "is_repeated", None)
    return bool(is_repeated) if is_repeated is not None else f.label == f.LABEL_REPEATED


def _proto_single(f: Any, depth: int) -> pa.DataType:
    if f.message_type is None:
        return proto_scalar_types()[f.type]
    name = f.message_type.full_name
    if name == TIMESTAMP_MESSAGE:
        return TIMESTAMPTZ
    if name in WRAPPERS:
        return WRAPPERS[name]
    return proto_message_type(f.message_type, depth + 1)


# --------------------------------------------------------------------------- resolution

_WIDER = {
    pa.int8(): 0, pa.int16(): 1, pa.int32(): 2, pa.int64(): 3, pa.float32(): 4, pa.float64(): 5,
}


def widens(writer: pa.DataType, reader: pa.DataType) -> bool:
    """Whether ``writer`` reads as ``reader`` by Avro's promotions (see the docstring)."""
    if writer == reader or pa.types.is_null(writer):
        return True
    if writer in _WIDER and reader in _WIDER:
        return _WIDER[writer] <= _WIDER[reader]
    if pa.types.is_struct(writer) and pa.types.is_struct(reader):
        have = {writer.field(i).name: writer.field(i).type for i in range(writer.num_fields)}
        return all(widens(have[r.name], r.type) for r in reader if r.name in have)
    if pa.types.is_list(writer) and pa.types.is_list(reader):
        return widens(writer.value_type, reader.value_type)
    if pa.types.is_map(writer) and pa.types.is_map(reader):
        return widens(writer.key_type, reader.key_type) and widens(writer.item_type, reader.item_type)
    return False
