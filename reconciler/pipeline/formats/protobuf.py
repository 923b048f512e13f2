"""Protobuf values: Confluent wire format with a schema registry (``protobuf:
{schemaRegistry: {...}}``), or plain bodies of one message of a descriptor set in the
config repo (``{descriptorFile: schemas/orders.desc, message: acme.Order}``).

After the schema id, a wire value holds the message-index array (which message of the
``.proto`` file, nested messages by their index inside their parent), read in both
encodings: a single zero byte for ``[0]``, or a zigzag varint count then that many
zigzag varint indexes. A registry's schema is ``.proto`` text (its imports registered as
references): it is compiled to a descriptor set once per id with the ``protoc`` that
``grpcio-tools`` ships, its well-known types included.

Each record is parsed with the ``protobuf`` runtime (its C extension: upb) and turned into
the Arrow shape of ``table.avrotypes`` by a converter built once per message type; records
are grouped by (schema id, message index) and resolved onto the fields like Avro's.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa

from reconciler.pipeline.formats import Decoded, Field, Format
from reconciler.pipeline.formats.binary import Group, resolve, split, writer_schema
from reconciler.pipeline.formats.registry import (
    WriterSchema,
    source_from,
)
from reconciler.table.avrotypes import TIMESTAMP_MESSAGE, WRAPPERS, proto_message_type

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class IndexError_(ValueError):
    pass


def read_indexes(body: bytes) -> tuple[list[int], int]:
    """(the message-index array, where the message's bytes start)."""
    def varint(pos: int) -> tuple[int, int]:
        shift = result = 0
        while True:
            if pos >= len(body):
                raise IndexError_("truncated message-index array")
            b = body[pos]
            result |= (b & 0x7F) << shift
            pos += 1
            if not b & 0x80:
                return (result >> 1) ^ -(result & 1), pos
            shift += 7
            if shift > 63:
                raise IndexError_("corrupt message-index array")

    count, pos = varint(0)
    if count == 0:
        return [0], pos
    if not 0 < count <= 64:
        raise IndexError_(f"corrupt message-index array (count {count})")
    out = []
    for _ in range(count):
        i, pos = varint(pos)
        out.append(i)
    return out, pos


def compile_proto(schema: WriterSchema) -> bytes:
    """A ``.proto`` text (and its references) -> a serialized FileDescriptorSet."""
    import grpc_tools
    from grpc_tools import protoc

    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    with tempfile.TemporaryDirectory(prefix="rc-proto-") as tmp:
        main = f"schema_{schema.id}.proto"
        for name, text in {**schema.references, main: schema.text}.items():
            path = os.path.join(tmp, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(str(text))
        out = os.path.join(tmp, "set.desc")
        code = protoc.main(["protoc", f"-I{tmp}", f"-I{include}", "--include_imports",
                            f"--descriptor_set_out={out}", os.path.join(tmp, main)])
        if code != 0 or not os.path.exists(out):
            raise ValueError(f"protoc could not compile writer schema {schema.id} (exit {code})")
        with open(out, "rb") as f:
            return f.read()


def _file_proto(text: str) -> Any:
    """A base64 FileDescriptorProto (the registry's ``serialized`` format), or None."""
    import base64
    import binascii

    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        fdp = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text, validate=True))
    except (binascii.Error, DecodeError, ValueError):
        return None
    return fdp if fdp.name else None


def from_serialized(schema: WriterSchema) -> tuple[bytes, str] | None:
    """A schema registered as a serialized descriptor (what confluent-kafka's Python
    ProtobufSerializer sends; a real registry answers ``.proto`` text unless asked for
    ``format=serialized``) -> (a descriptor set, its main file's name); None for text."""
    # the well-known types' files, in the default pool for what follows
    from google.protobuf import (  # noqa: F401  # noqa: F401
        any_pb2,
        descriptor_pb2,
        descriptor_pool,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )

    main = _file_proto(str(schema.text))
    if main is None:
        return None
    files = [_file_proto(str(t)) for t in schema.references.values()]
    if any(f is None for f in files):
        return None
    given = {f.name for f in [*files, main]}
    out = descriptor_pb2.FileDescriptorSet()
    for dep in {d for f in [*files, main] for d in f.dependency} - given:
        # the well-known types (google/protobuf/*.proto): the serializer leaves them out
        descriptor_pool.Default().FindFileByName(dep).CopyToProto(out.file.add())
    out.file.extend([*files, main])
    return out.SerializeToString(), main.name


class ProtoSchema:
    """One writer schema's descriptors: the main file's messages by index path."""

    def __init__(self, descriptor_set: bytes, main: str | None = None):
        from google.protobuf import descriptor_pb2, descriptor_pool

        fds = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set)
        self.pool = descriptor_pool.DescriptorPool()
        for f in fds.file:
            self.pool.Add(f)
        self.file = self.pool.FindFileByName(main or fds.file[-1].name)
        self._types: dict[tuple[int, ...], MessageType] = {}

    def by_index(self, indexes: Sequence[int]) -> MessageType:
        key = tuple(indexes)
        if key not in self._types:
            msgs = list(self.file.message_types_by_name.values())
            desc = None
            for i in key:
                if not 0 <= i < len(msgs):
                    raise IndexError_(f"message index {list(key)} is not in the schema")
                desc = msgs[i]
                msgs = list(desc.nested_types)
            self._types[key] = MessageType(desc)
        return self._types[key]

    def by_name(self, name: str) -> MessageType:
        return MessageType(self.pool.FindMessageTypeByName(name))


class MessageType:
    def __init__(self, descriptor: Any):
        from google.protobuf import message_factory

        self.descriptor = descriptor
        self.cls = message_factory.GetMessageClass(descriptor)
        self.type = proto_message_type(descriptor)
        self.convert = _converter(descriptor)


def _converter(desc: Any) -> Callable[[Any], dict]:
    parts = [(f.name, _field_converter(f)) for f in desc.fields]
    return lambda m: {name: conv(m) for name, conv in parts}


def _value_converter(f: Any) -> Callable[[Any], Any]:
    if f.enum_type is not None:
        names = {v.number: v.name for v in f.enum_type.values}
        return lambda v: names.get(v, str(v))
    if f.message_type is None:
        return lambda v: v
    full = f.message_type.full_name
    if full == TIMESTAMP_MESSAGE:
        return lambda v: _EPOCH + timedelta(seconds=v.seconds, microseconds=v.nanos // 1000)
    if full in WRAPPERS:
        return lambda v: v.value
    return _converter(f.message_type)


def _field_converter(f: Any) -> Callable[[Any], Any]:
    name = f.name
    if f.message_type is not None and f.message_type.GetOptions().map_entry:
        conv = _value_converter(f.message_type.fields_by_name["value"])
        return lambda m: [(k, conv(v)) for k, v in getattr(m, name).items()]
    conv = _value_converter(f)
    repeated = f.is_repeated if hasattr(f, "is_repeated") else f.label == f.LABEL_REPEATED
    if repeated:
        return lambda m: [conv(v) for v in getattr(m, name)]
    if f.has_presence:
        return lambda m: conv(getattr(m, name)) if m.HasField(name) else None
    return lambda m: conv(getattr(m, name))


class ProtobufFormat(Format):
    name = "protobuf"

    def __init__(self, data_schema: Any, base_dir: str | None = None, files: Any = None, *,
                 source: Any = None):
        super().__init__(data_schema, base_dir, files)
        options = dict(getattr(data_schema, "format_options", None) or {})
        options = options.get("protobuf", options)
        self.source = source or source_from(options, base_dir, "PROTOBUF", "descriptorFile", self.files)
        self.message = options.get("message")
        self._schemas: dict[int, ProtoSchema] = {}

    def decode(self, values: pa.Array, fields: Sequence[Field]) -> Decoded:
        n = len(values)
        ids, bodies, front = split(values, self.source.wire)
        raw = bodies.to_pylist()
        # (schema id, message index) -> [(record, message bytes)]
        keyed: dict[tuple[int, tuple[int, ...]], list[tuple[int, bytes]]] = {}
        for schema_id in np.unique(ids[ids >= 0]).tolist():
            schema, why = self._schema(schema_id)
            for i in np.nonzero(ids == schema_id)[0].tolist():
                if schema is None:
                    front[i] = why
                    continue
                if not self.source.wire:
                    keyed.setdefault((schema_id, ()), []).append((i, raw[i]))
                    continue
                try:
                    indexes, start = read_indexes(raw[i])
                except IndexError_ as e:
                    front[i] = f"{e} (writer schema {schema_id})"
                    continue
                keyed.setdefault((schema_id, tuple(indexes)), []).append((i, raw[i][start:]))
        groups = []
        for (schema_id, indexes), recs in keyed.items():
            try:
                mt = (self._schemas[schema_id].by_name(self.message) if not self.source.wire
                      else self._schemas[schema_id].by_index(indexes))
            except (IndexError_, KeyError) as e:
                for i, _ in recs:
                    front[i] = f"{e} (writer schema {schema_id})"
                continue
            groups.append(self._group(schema_id, mt, recs))
        return resolve(n, groups, fields, front, self.data_schema.schema_discovery)

    def _group(self, schema_id: int, mt: MessageType, recs: list[tuple[int, bytes]]) -> Group:
        from google.protobuf.message import DecodeError

        rows: list[dict | None] = []
        reasons: list[str | None] = []
        for _, data in recs:
            try:
                rows.append(mt.convert(mt.cls.FromString(data)))
                reasons.append(None)
            except DecodeError as e:
                rows.append(None)
                reasons.append(f"truncated or corrupt body for {mt.descriptor.full_name} "
                               f"(writer schema {schema_id}): {e}"[:300])
        index = np.array([i for i, _ in recs], np.int64)
        return Group(schema_id, index, pa.array(rows, mt.type), reasons)

    def _schema(self, schema_id: int) -> tuple[ProtoSchema | None, str]:
        if schema_id in self._schemas:
            return self._schemas[schema_id], ""
        schema, why = writer_schema(self.source, schema_id, "PROTOBUF", "Protobuf")
        if schema is None:
            return None, why
        try:
            if isinstance(schema.text, bytes):
                self._schemas[schema_id] = ProtoSchema(schema.text)
            elif (serialized := from_serialized(schema)) is not None:
                self._schemas[schema_id] = ProtoSchema(*serialized)
            else:
                self._schemas[schema_id] = ProtoSchema(compile_proto(schema), f"schema_{schema_id}.proto")
        except Exception as e:  # noqa: BLE001 - a schema that does not compile: its records
            return None, f"writer schema {schema_id} cannot be read: {e}"[:300]
        return self._schemas[schema_id], ""
