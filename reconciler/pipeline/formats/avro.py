"""Avro values: Confluent wire format with a schema registry, or plain bodies of one schema
file (``avro: {schemaRegistry: {...}}`` / ``avro: {schemaFile: schemas/x.avsc}``).

Records are grouped by writer schema id; each group is decoded with its own writer schema
(``registry`` fetches each id once) into a struct array of that writer's types
(``table.avrotypes``), then resolved onto the data schema's fields (``binary.resolve``).

Decoding a group in bulk: its bodies become an in-memory Avro object container file, one
block per record (a block carries its byte length, so a truncated body cannot run into
the next record), read by DuckDB's Avro extension (C, straight into Arrow). The
per-record path (fastavro's ``schemaless_reader``) decodes what that reader does not
take: schemas with unions of several types, enums, fixed, decimals, uuids, maps (whose
Arrow shapes DuckDB gives differently), small groups, and any group the bulk reader
refuses (a corrupt body among them: the per-record path finds which record it is).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reconciler.pipeline.formats import Decoded, Field, Format
from reconciler.pipeline.formats.binary import Group, resolve, split, writer_schema
from reconciler.pipeline.formats.registry import (
    RegistrySource,
    source_from,
)
from reconciler.pipeline.times import TIME_FROM_MICROS, TIME_UNTIL_MICROS
from reconciler.table.avrotypes import avro_type, union_branch

BULK_MIN = 256  # below this many records a group is decoded record by record
_SYNC = b"reconciler-sync!"
assert len(_SYNC) == 16
_BULK_PRIMITIVES = {"boolean", "int", "long", "float", "double", "string", "bytes"}
_BULK_LOGICAL = {"timestamp-millis", "timestamp-micros", "date"}


def _zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n & ~0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


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
        self.bulk = _bulk_ok(self.raw)
        self.min_length = sum(_min_length(f["type"]) for f in self.raw["fields"]) if self.bulk else 0
        self._fix = _fixer(self.raw, {})
        self._header: bytes | None = None

    def decode(self, bodies: pa.Array, reader: Callable[[bytes], pa.Table] | None) -> tuple[pa.StructArray, list[str | None]]:
        if reader is not None and self.bulk and len(bodies) >= BULK_MIN:
            try:
                return self._bulk_checked(bodies, reader)
            except Exception:  # noqa: BLE001 - a corrupt body: the per-record path finds which
                pass
        return self.per_record(bodies.to_pylist())

    def _bulk_checked(self, bodies: pa.Array, reader: Callable[[bytes], pa.Table]) -> tuple[pa.StructArray, list[str | None]]:
        """The bulk path on the bodies it reads exactly as the per-record path does; the
        rest judged record by record. DuckDB reads a block shorter than one record as the
        previous record again (an empty body became its neighbour's row), and reads dates
        and instants outside years 1..9999, which fastavro refuses: both go record by record,
        so a record's fate does not depend on its group's size."""
        n = len(bodies)
        whole = pc.greater_equal(pc.binary_length(bodies), self.min_length).fill_null(False)
        first = np.flatnonzero(whole.to_numpy(zero_copy_only=False))
        part = self._bulk(bodies.take(pa.array(first)), reader) if len(first) else None
        inside = np.zeros(0, bool)
        if part is not None:  # a row is its body's record only when it re-encodes to its length
            lengths = pc.binary_length(bodies.take(pa.array(first))).to_numpy(zero_copy_only=False)
            inside = _in_range(part) & (_encoded_lengths(part, self.raw) == lengths)
        keep = first[inside]
        if len(keep) == n:
            return part, [None] * n  # type: ignore[return-value]
        rest = np.setdiff1d(np.arange(n), keep)
        values, rest_reasons = self.per_record(bodies.take(pa.array(rest)).to_pylist())
        pieces = [values] if part is None else [part.filter(pa.array(inside)), values]
        where = np.empty(n, np.int64)
        where[np.concatenate([keep, rest])] = np.arange(n)
        reasons: list[str | None] = [None] * n
        for i, why in zip(rest.tolist(), rest_reasons, strict=True):
            reasons[i] = why
        return pa.concat_arrays(pieces).take(pa.array(where)), reasons

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

    def _ocf(self, bodies: pa.Array) -> bytes:
        """The bodies as an Avro object container file, one block per record."""
        if self._header is None:
            meta = {"avro.schema": json.dumps(self.raw).encode(), "avro.codec": b"null"}
            h = bytearray(b"Obj\x01") + _zigzag(len(meta))
            for k, v in meta.items():
                h += _zigzag(len(k)) + k.encode() + _zigzag(len(v)) + v
            self._header = bytes(h + _zigzag(0) + _SYNC)
        lengths = pc.binary_length(bodies)
        encoded = pc.dictionary_encode(lengths)
        prefixes = pa.array([_zigzag(1) + _zigzag(n) for n in encoded.dictionary.to_pylist()], pa.binary())
        blocks = pc.binary_join_element_wise(prefixes.take(encoded.indices), bodies,
                                             pa.scalar(_SYNC, pa.binary()), b"")
        offsets = np.frombuffer(blocks.buffers()[1], np.int32, count=len(blocks) + 1, offset=4 * blocks.offset)
        data = memoryview(blocks.buffers()[2])[offsets[0]:offsets[-1]]
        return self._header + bytes(data)

    def _bulk(self, bodies: pa.Array, reader: Callable[[bytes], pa.Table]) -> pa.StructArray:
        table = reader(self._ocf(bodies))
        if table.num_rows != len(bodies):
            raise ValueError("the bulk reader lost records")
        arrays = [table.column(f.name).combine_chunks().cast(f.type) for f in self.type]
        return pa.StructArray.from_arrays(arrays, fields=list(self.type))


# the days and instants Python's datetime (fastavro's values) holds: years 1..9999
_DAYS = (-719_162, 2_932_896)
_MICROS = {"s": 1_000_000, "ms": 1_000, "us": 1}  # microseconds per unit


def _in_range(part: pa.StructArray) -> np.ndarray:
    """Which rows' dates and timestamps lie within years 1..9999 (nulls do)."""
    ok = np.ones(len(part), bool)
    for i, f in enumerate(part.type):
        if pa.types.is_date32(f.type):
            low, high = _DAYS
        elif pa.types.is_timestamp(f.type):
            if f.type.unit == "ns":
                continue  # an int64 of nanoseconds cannot leave years 1677..2262
            per = _MICROS[f.type.unit]
            low, high = TIME_FROM_MICROS // per, (TIME_UNTIL_MICROS - 1) // per
        else:
            continue
        n = part.field(i).cast(pa.int32() if pa.types.is_date32(f.type) else pa.int64())
        fits = pc.and_(pc.greater_equal(n, low), pc.less_equal(n, high)).fill_null(True)
        ok &= fits.to_numpy(zero_copy_only=False)
    return ok


def _varint_lengths(v: np.ndarray) -> np.ndarray:
    """The bytes of each integer's zigzag varint (Avro's int and long)."""
    z = ((v << 1) ^ (v >> 63)).view(np.uint64)  # wraps as Avro's 64-bit zigzag does
    return 1 + sum((z >= np.uint64(1 << (7 * k))).astype(np.int64) for k in range(1, 10))


def _encoded_lengths(part: pa.StructArray, schema: dict) -> np.ndarray:
    """The bytes each row takes written by ``schema`` (flat, the bulk path's types)."""
    out = np.zeros(len(part), np.int64)
    for i, f in enumerate(schema["fields"]):
        t, col = f["type"], part.field(i)
        if isinstance(t, list):
            out += 1  # the branch index
            t = next(b for b in t if b != "null")
        logical = t.get("logicalType") if isinstance(t, dict) else None
        kind = t.get("type") if isinstance(t, dict) else t
        valid = col.is_valid().to_numpy(zero_copy_only=False)
        if kind in ("float", "double"):
            n = np.full(len(col), 4 if kind == "float" else 8, np.int64)
        elif kind == "boolean":
            n = np.ones(len(col), np.int64)
        elif kind in ("string", "bytes"):
            size = pc.binary_length(col)
            size = size.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
            n = _varint_lengths(size) + size
        else:
            raw = (col.cast(pa.int32()) if logical == "date" else col).cast(pa.int64())
            raw = raw.fill_null(0).to_numpy(zero_copy_only=False)
            n = _varint_lengths(raw // 1000 if logical == "timestamp-millis" else raw)
        out += np.where(valid, n, 0)
    return out


def _min_length(t: Any) -> int:
    """The fewest bytes a value of a bulk-readable type is written in."""
    if isinstance(t, list):
        return 1  # the branch index
    kind = t.get("type") if isinstance(t, dict) else t
    return {"float": 4, "double": 8}.get(kind, 1)


def _fits(value: Any, t: pa.DataType) -> bool:
    try:
        pa.array([value], t)
        return True
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return False


def _bulk_ok(schema: dict) -> bool:
    """Whether DuckDB's reader gives this record's Arrow shape (flat, simple types)."""
    def simple(t: Any) -> bool:
        if isinstance(t, list):
            rest = [b for b in t if b != "null"]
            return len(rest) == 1 and len(t) <= 2 and simple(rest[0])
        if isinstance(t, dict):
            return t.get("logicalType") in _BULK_LOGICAL or (
                "logicalType" not in t and t.get("type") in _BULK_PRIMITIVES)
        return t in _BULK_PRIMITIVES
    return all(simple(f["type"]) for f in schema["fields"])


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


class _DuckReader:
    """DuckDB's Avro reader on one thread (the task is one core's work), its extension
    loaded by path from the ``duckdb-extension-avro`` wheel (nothing downloaded)."""

    def __init__(self) -> None:
        import duckdb
        import duckdb_extension_avro

        root = os.path.dirname(duckdb_extension_avro.__file__)
        path = next(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
                    if f.endswith(".duckdb_extension"))
        self.con = duckdb.connect(config={"threads": 1, "allow_unsigned_extensions": True})
        self.con.execute(f"LOAD '{path}'")

    def __call__(self, ocf: bytes) -> pa.Table:
        with tempfile.NamedTemporaryFile(suffix=".avro", dir=_scratch()) as f:
            f.write(ocf)
            f.flush()
            return self.con.execute("SELECT * FROM read_avro(?)", [f.name]).to_arrow_table()


def _scratch() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


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
        self._reader: _DuckReader | None = None

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
            values_, reasons = decoder.decode(bodies.take(pa.array(index)), self._bulk_reader())
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

    def _bulk_reader(self) -> Callable[[bytes], pa.Table] | None:
        if not self.bulk:
            return None
        if self._reader is None:
            self._reader = _DuckReader()
        return self._reader


__all__ = ["AvroFormat", "AvroDecoder", "RegistrySource"]
