"""What a spec's value format needs that the schema cannot say, checked by ``validate``.

* the block of the chosen format is given (``format: avro`` needs ``avro:``, ``csv``
  needs ``csv:``), and no block of another format is (a ``csv:`` block beside
  ``format: json`` would be silently ignored);
* a schema or descriptor file (``avro.schemaFile``, ``protobuf.descriptorFile``) lies
  inside the spec's directory, exists and parses (Avro with fastavro, a descriptor set
  with protobuf; the message is in it);
* with an Avro schema file, ``timestamp.column`` and each dimension's path exist in it;
* with CSV, every field the spec reads is one of its ``columns``;
* ``schemaDiscovery`` is not combined with rollup: a rolled-up row is one per distinct set
  of dimension values, so every discovered field would silently become a grouping key
  that no spec declares (and compaction, which groups by the specs' dimensions, could not
  merge such rows). Refused, not ignored: the user lists the fields as dimensions instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reconciler.errors import SpecProblem
from reconciler.spec.yamlsafe import ParsedYaml, YamlPath, format_field

_DS: YamlPath = ("dataSchema",)
_BLOCKS = ("avro", "protobuf", "csv")
_VIRTUAL = ("__key", "__partition", "__offset", "__stream_time")


def problems(parsed: ParsedYaml) -> list[SpecProblem]:
    ds = parsed.data.get("dataSchema") if isinstance(parsed.data, Mapping) else None
    if not isinstance(ds, Mapping):
        return []
    fmt = ds.get("format", "json")
    out: list[tuple[YamlPath, str]] = []
    granularity = ds.get("granularity")
    if ds.get("schemaDiscovery") is True and isinstance(granularity, Mapping) and granularity.get("rollup") is True:
        out.append(((*_DS, "schemaDiscovery"), "schemaDiscovery cannot be combined with granularity.rollup: "
                                               "true (each discovered field would become a grouping key no "
                                               "spec declares): list the fields you need under dimensions and "
                                               "remove schemaDiscovery, or set rollup: false"))
    for block in _BLOCKS:
        if block in ds and block != fmt:
            out.append(((*_DS, block), f"{block}: is given but format is {fmt!r}: set format: {block}, "
                                       "or remove the block"))
    if fmt in _BLOCKS and not isinstance(ds.get(fmt), Mapping):
        out.append(((*_DS, "format"), f"format {fmt} needs a dataSchema.{fmt} block"))
    elif fmt == "csv":
        out += _csv(ds)
    elif fmt in ("avro", "protobuf"):
        out += _schema_file(parsed, ds, fmt)
    return [_problem(parsed, at, message) for at, message in out]


def _reads(ds: Mapping[str, Any]) -> list[tuple[YamlPath, list[str]]]:
    """Each field the spec reads from a record, as a path, and where it is declared."""
    found: list[tuple[YamlPath, list[str]]] = []
    ts = ds.get("timestamp")
    if isinstance(ts, Mapping) and isinstance(ts.get("column"), str):
        found.append(((*_DS, "timestamp", "column"), [ts["column"]]))
    for i, d in enumerate(ds.get("dimensions") or ()):
        if isinstance(d, str):
            found.append(((*_DS, "dimensions", i), [d]))
        elif isinstance(d, Mapping) and isinstance(d.get("name"), str):
            path = d.get("path") if isinstance(d.get("path"), str) else d["name"]
            found.append(((*_DS, "dimensions", i), path.split(".")))
    for i, m in enumerate(ds.get("metrics") or ()):
        if isinstance(m, Mapping) and isinstance(m.get("field"), str):
            found.append(((*_DS, "metrics", i, "field"), [m["field"]]))
    return [(at, p) for at, p in found if p[0] not in _VIRTUAL]


def _csv(ds: Mapping[str, Any]) -> list[tuple[YamlPath, str]]:
    cols = ds["csv"].get("columns")
    if not isinstance(cols, list):
        return []
    out = []
    for at, path in _reads(ds):
        if len(path) > 1:
            out.append((at, f"a CSV field has no nested fields: {'.'.join(path)!r}"))
        elif path[0] not in cols:
            out.append((at, f"{path[0]!r} is not one of the CSV columns {cols}"))
    return out


def _schema_file(parsed: ParsedYaml, ds: Mapping[str, Any], fmt: str) -> list[tuple[YamlPath, str]]:
    block = ds[fmt]
    key = "schemaFile" if fmt == "avro" else "descriptorFile"
    name = block.get(key)
    if not isinstance(name, str):
        return []
    at: YamlPath = (*_DS, fmt, key)
    base = Path(parsed.path).resolve().parent
    path = (base / name).resolve()
    if not path.is_relative_to(base):
        return [(at, f"{name!r} lies outside the spec's directory {str(base)!r}: keep schemas beside the specs")]
    if not path.is_file():
        return [(at, f"{name!r} does not exist (looked for {str(path)!r})")]
    try:
        if fmt == "avro":
            return _avro_paths(ds, _avro_schema(path))
        return _descriptor(path, block.get("message"), (*_DS, fmt, "message"))
    except _Unreadable as exc:
        return [(at, f"{name!r} does not parse: {exc}")]


class _Unreadable(Exception):
    pass


def _avro_schema(path: Path) -> Any:
    import fastavro

    try:
        return fastavro.parse_schema(json.loads(path.read_text(encoding="utf-8")))
    except Exception as exc:  # fastavro raises several kinds for a bad schema
        raise _Unreadable(str(exc)[:300]) from None


def _avro_paths(ds: Mapping[str, Any], schema: Any) -> list[tuple[YamlPath, str]]:
    out = []
    for at, path in _reads(ds):
        node, walked = schema, []
        for key in path:
            record = _record_of(node)
            fields = {f["name"]: f["type"] for f in record.get("fields", ())} if record else {}
            if key not in fields:
                where = ".".join(walked) or "the record"
                out.append((at, f"{'.'.join(path)!r}: {where} has no field {key!r} in the schema file"))
                break
            node, walked = fields[key], [*walked, key]
    return out


def _record_of(node: Any) -> Mapping[str, Any] | None:
    """The record a (parsed) Avro type is, or holds as a union's branch."""
    if isinstance(node, Mapping) and node.get("type") == "record":
        return node
    if isinstance(node, list):
        for branch in node:
            found = _record_of(branch)
            if found is not None:
                return found
    return None


def _descriptor(path: Path, message: Any, at: YamlPath) -> list[tuple[YamlPath, str]]:
    from google.protobuf import descriptor_pb2

    files = descriptor_pb2.FileDescriptorSet()
    try:
        files.ParseFromString(path.read_bytes())
    except Exception as exc:  # DecodeError, or a message that is not a descriptor set
        raise _Unreadable(f"not a FileDescriptorSet ({exc})") from None
    names = [f"{f.package}.{m.name}" if f.package else m.name for f in files.file for m in f.message_type]
    if isinstance(message, str) and message not in names:
        return [(at, f"message {message!r} is not in the descriptor file (it has {', '.join(names) or 'none'})")]
    return []


def _problem(parsed: ParsedYaml, at: YamlPath, message: str) -> SpecProblem:
    line, column = parsed.value_position(at)
    return SpecProblem(parsed.path, line, column, format_field(at), message)
