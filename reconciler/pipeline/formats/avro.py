"""Avro values: Confluent wire format with a schema registry, or plain bodies of one schema
file (``avro: {schemaRegistry: {...}}`` / ``avro: {schemaFile: schemas/x.avsc}``).

Records are grouped by writer schema id; each group is decoded with its own writer schema
(``registry`` fetches each id once) into a struct array of that writer's types
(``table.avrotypes``), then resolved onto the data schema's fields (``binary.resolve``).

Decoding a group in bulk: a flat writer schema's bodies are read field by field for the
whole group at once in numpy (``avroflat``), which keeps only the records it reads exactly
as fastavro would. The per-record path (fastavro's ``schemaless_reader``) decodes the
rest: the records the bulk path did not keep (a truncated or corrupt body: fastavro names
the problem), schemas that are not flat (unions of several types, enums, fixed, decimals,
uuids, records, arrays, maps) and small groups.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from reconciler.pipeline.formats import Decoded, Field, Format, avroflat
from reconciler.pipeline.formats.binary import Group, resolve, split, writer_schema
from reconciler.pipeline.formats.registry import (
    RegistrySource,
    source_from,
)
from reconciler.table.avrotypes import avro_type, union_branch

BULK_MIN = 64  # below this many records a group is decoded record by record


class AvroDecoder:
    """One writer schema's decoder (kept per schema id)."""

    def __init__(self, schema_id: int, text: str):
        import fastavro

        self.schema_id = schema_id
        self.raw = json.loads(text)
        self.parsed = fastavro.parse_schema(self.raw)
        self.type = avro_type(self.raw)
        if not pa.types.is_struct(self.type):
            raise ValueError(f"schema id {schema_id}: an Avro value schema must be a record")
        self.steps = avroflat.steps_of(self.raw)  # None: not flat, every record alone
        self._fix = _fixer(self.raw, {})

    def decode(self, bodies: pa.Array, bulk: bool = True) -> tuple[pa.StructArray, list[str | None]]:
        if bulk and self.steps is not None and len(bodies) >= BULK_MIN:
            try:
                return self._bulk(bodies)
            except Exception:  # noqa: BLE001 - whatever the bulk path cannot take, the reference can
                pass
        return self.per_record(bodies.to_pylist())

    def _bulk(self, bodies: pa.Array) -> tuple[pa.StructArray, list[str | None]]:
        """The records the bulk path reads exactly as the per-record path does; the rest
        judged record by record, so a record's fate does not depend on its group's size."""
        n = len(bodies)
        values, ok = avroflat.decode(bodies, self.steps or [], self.type)
        if ok.all():
            return values, [None] * n
        keep, rest = np.flatnonzero(ok), np.flatnonzero(~ok)
        rest_values, rest_reasons = self.per_record(bodies.take(pa.array(rest)).to_pylist())
        where = np.empty(n, np.int64)
        where[keep] = np.arange(len(keep))
        where[rest] = len(keep) + np.arange(len(rest))
        reasons: list[str | None] = [None] * n
        for i, why in zip(rest.tolist(), rest_reasons, strict=True):
            reasons[i] = why
        return pa.concat_arrays([values.filter(pa.array(ok)), rest_values]).take(pa.array(where)), reasons

    def per_record(self, bodies: list[bytes]) -> tuple[pa.StructArray, list[str | None]]:
        from fastavro import schemaless_reader

        rows: list[Any] = []
        reasons: list[str | None] = []
        for body in bodies:
            try:
                rec = schemaless_reader(io.BytesIO(body), self.parsed, None, return_record_name=True)
                rows.append(self._fix(rec) if self._fix else rec)
                reasons.append(None)
            except (EOFError, StopIteration, IndexError):  # fastavro reads past the end
                rows.append(None)
                reasons.append(f"truncated body: ends inside a value of writer schema {self.schema_id}")
            except Exception as e:  # noqa: BLE001 - any decoding failure is this record's
                rows.append(None)
                reasons.append(f"corrupt body for writer schema {self.schema_id}: {type(e).__name__}: {e}"[:300])
        try:
            return pa.array(rows, self.type), reasons
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            return self._one_by_one(rows, reasons)

    def _one_by_one(self, rows: list[Any], reasons: list[str | None]) -> tuple[pa.StructArray, list[str | None]]:
        """A value that does not fit its Arrow type (a decimal wider than its precision):
        that record alone is a dead letter, named by field."""
        out = []
        for i, row in enumerate(rows):
            try:
                out.append(pa.array([row], self.type))
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
                bad = next((f.name for f in self.type if not _fits(row.get(f.name), f.type)), "?")
                reasons[i] = f"field {bad}: value does not fit {self.type.field(bad).type if bad != '?' else 'its type'}: {e}"[:300]
                out.append(pa.nulls(1, self.type))
        return pa.concat_arrays(out), reasons

def _fits(value: Any, t: pa.DataType) -> bool:
    try:
        pa.array([value], t)
        return True
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return False


def _fixer(schema: Any, named: dict[str, Any]) -> Callable[[Any], Any] | None:
    """What turns fastavro's value into the Arrow shape (``avrotypes``): a union of several
    types into its struct of branches, a uuid into its text; None where nothing needs it."""
    if isinstance(schema, str):
        return _fixer(named[schema], named) if schema in named and named[schema] is not schema else None
    if isinstance(schema, list):
        branches = [(i, b) for i, b in enumerate(schema) if b != "null"]
        if len(branches) == 1:
            return _fixer(branches[0][1], named)
        fixes = {i: _fixer(b, named) for i, b in branches}
        return lambda v: None if v is None else _branch(v, schema, branches, fixes)
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    if schema.get("logicalType") == "uuid":
        return lambda v: None if v is None else str(v)
    if kind in ("record", "error", "enum", "fixed"):
        named[schema["name"]] = schema
        if "namespace" in schema:
            named[f"{schema['namespace']}.{schema['name']}"] = schema
    if kind in ("record", "error"):
        fixes = {f["name"]: _fixer(f["type"], named) for f in schema["fields"]}
        fixes = {k: fx for k, fx in fixes.items() if fx is not None}
        if not fixes:
            return _strip_name
        return lambda v: None if v is None else {
            k: (fixes[k](x) if k in fixes else x) for k, x in _strip_name(v).items()}
    if kind == "array":
        fx = _fixer(schema["items"], named)
        return None if fx is None else (lambda v: None if v is None else [fx(x) for x in v])
    if kind == "map":
        fx = _fixer(schema["values"], named)
        return None if fx is None else (lambda v: None if v is None else {k: fx(x) for k, x in v.items()})
    return None


def _strip_name(v: Any) -> Any:
    """``return_record_name`` gives a record inside a union as (name, value)."""
    return v[1] if isinstance(v, tuple) else v


_PY = {"boolean": bool, "int": int, "long": int, "float": float, "double": float,
       "string": str, "bytes": bytes}


def _branch(v: Any, union: list, branches: list, fixes: dict) -> dict:
    """``{union_opt_<i>: value}`` for the branch a value was written with."""
    name = v[0] if isinstance(v, tuple) else None
    for i, b in branches:
        b_name = b.get("name") if isinstance(b, dict) else b
        kind = b.get("type") if isinstance(b, dict) else b
        if name is not None:
            hit = b_name == name or (isinstance(b, dict) and f"{b.get('namespace')}.{b_name}" == name) \
                or str(name).endswith(f".{b_name}")
        elif kind in _PY:
            hit = type(v) is _PY[kind] or (kind in ("float", "double") and type(v) is int)
        else:
            hit = {"array": list, "map": dict, "enum": str, "fixed": bytes}.get(kind) is type(v)
        if hit:
            fx = fixes.get(i)
            value = v[1] if isinstance(v, tuple) else v
            return {union_branch(i): fx(value) if fx else value}
    return {}


class AvroFormat(Format):
    name = "avro"
    bulk = True  # False: every group record by record (the reference the tests compare with)

    def __init__(self, data_schema: Any, base_dir: str | None = None, files: Any = None, *,
                 source: Any = None):
        super().__init__(data_schema, base_dir, files)
        options = dict(getattr(data_schema, "format_options", None) or {})
        options = options.get("avro", options)
        self.source = source or source_from(options, base_dir, "AVRO", "schemaFile", self.files)
        self._decoders: dict[int, AvroDecoder] = {}

    def decode(self, values: pa.Array, fields: Sequence[Field]) -> Decoded:
        n = len(values)
        ids, bodies, front = split(values, self.source.wire)
        groups = []
        for schema_id in np.unique(ids[ids >= 0]).tolist():
            index = np.nonzero(ids == schema_id)[0]
            decoder, why = self._decoder(schema_id)
            if decoder is None:
                for i in index.tolist():
                    front[i] = why
                continue
            group = bodies if len(index) == n else bodies.take(pa.array(index))
            values_, reasons = decoder.decode(group, self.bulk)
            groups.append(Group(schema_id, index, values_, reasons))
        return resolve(n, groups, fields, front, self.data_schema.schema_discovery)

    def _decoder(self, schema_id: int) -> tuple[AvroDecoder | None, str]:
        if schema_id in self._decoders:
            return self._decoders[schema_id], ""
        schema, why = writer_schema(self.source, schema_id, "AVRO", "Avro")
        if schema is None:
            return None, why
        try:
            self._decoders[schema_id] = AvroDecoder(schema_id, str(schema.text))
        except Exception as e:  # noqa: BLE001 - a schema the table cannot hold: its records
            return None, f"writer schema {schema_id} cannot be read: {e}"[:300]
        return self._decoders[schema_id], ""


__all__ = ["AvroFormat", "AvroDecoder", "RegistrySource"]
