"""What the binary formats (avro, protobuf) share: records grouped by writer schema, each
group decoded into one struct array of its writer's types, then resolved onto the fields
the data schema reads.

Resolution, per group and field: the field's value in the writer's own Arrow type; when
the field is read as a type (``Field.type``) the writer's type must be able to become it
(``readable``): int -> long, any number -> double, anything flat -> string, anything ->
json, a number -> timestamp (``typed``: by the timestamp ``auto`` rule). A writer whose
type cannot (a long field now written as a string) is an incompatible change: that group's records are dead letters naming the field and both
types, and the other groups flow. A field read in the format's own type takes the first
group's type; a later group's type must widen to it or from it (int -> long).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from reconciler.pipeline.casts import cast_exact, loss_words
from reconciler.pipeline.formats import ARROW_TYPES, Decoded, Field
from reconciler.pipeline.formats.registry import UnknownSchema, split_wire
from reconciler.table.avrotypes import widens


@dataclass
class Group:
    """One writer schema's records: their positions, their decoded values (a struct array
    of the writer's types, null where a record is a dead letter) and those reasons."""

    schema_id: int
    index: np.ndarray
    values: pa.StructArray
    reasons: list[str | None]


def split(values: pa.Array, wire: bool) -> tuple[np.ndarray, pa.Array, list[str | None]]:
    """Each record's writer schema id (-1: no value), body, and reason found before decoding
    (a bad wire header); a source without the wire format has one schema, id 0."""
    n = len(values)
    if wire:
        ids, bodies, head = split_wire(values)
        return ids, bodies, head.to_pylist() if head is not None else [None] * n
    valid = values.is_valid().to_numpy(zero_copy_only=False)
    return np.where(valid, 0, -1), values.cast(pa.binary()), [None] * n


def writer_schema(source: Any, schema_id: int, kind: str, label: str) -> tuple[Any, str]:
    """The source's schema ``schema_id`` if it is of ``kind``, else None and why."""
    try:
        schema = source.get(schema_id)
    except UnknownSchema:
        return None, f"unknown schema id {schema_id}: the schema registry has no such schema"
    if schema.kind != kind:
        return None, f"schema id {schema_id} is a {schema.kind} schema, not {label}"
    return schema, ""


def readable(writer: pa.DataType, field_type: str) -> bool:
    """Whether a writer's type can be read as a field's type (see the docstring)."""
    t = ARROW_TYPES[field_type]
    nested = pa.types.is_nested(writer)
    if field_type == "json" or widens(writer, t):
        return True
    if field_type == "string":
        return not nested
    if field_type == "long":
        return pa.types.is_integer(writer)
    if field_type == "double":
        return pa.types.is_integer(writer) or pa.types.is_floating(writer) or pa.types.is_decimal(writer)
    if field_type == "timestamp":  # a number: seconds or millis, as the typed column reads it
        return (pa.types.is_timestamp(writer) or pa.types.is_date(writer) or pa.types.is_integer(writer)
                or pa.types.is_floating(writer))
    return False


def type_name(t: pa.DataType) -> str:
    return {pa.int32(): "int", pa.int64(): "long", pa.float32(): "float", pa.float64(): "double",
            pa.bool_(): "boolean"}.get(t, str(t))


def _get(values: pa.StructArray, path: Sequence[str]) -> pa.Array | None:
    """The field at ``path`` (None where the writer has no such field)."""
    arr: pa.Array = values
    for key in path:
        if not pa.types.is_struct(arr.type) or arr.type.get_field_index(key) < 0:
            return None
        arr = pc.struct_field(arr, [key])
    return arr


def resolve(n: int, groups: Sequence[Group], fields: Sequence[Field], front: list[str | None],
            discovery: bool) -> Decoded:
    """The columns of ``n`` records from their groups; ``front``: reasons found before
    decoding (header, unknown id), one per record."""
    reasons = list(front)
    for g in groups:
        if g.reasons.count(None) == len(g.reasons):  # list.count runs in C: the clean case costs nothing
            continue
        for i, r in zip(g.index.tolist(), g.reasons, strict=True):
            if r is not None:
                reasons[i] = r
    wanted = list(fields)
    discovered: dict[str, pa.DataType] | None = None
    if discovery:
        discovered = {}
        for g in groups:
            for f in g.values.type:
                discovered.setdefault(f.name, f.type)
        have = {f.name for f in wanted}
        wanted += [Field(name, (name,)) for name in discovered if name not in have]
    columns: dict[str, pa.Array] = {}
    for f in wanted:
        columns[f.name] = _column(n, groups, f, reasons)
    if discovered is not None:
        discovered = {k: columns[k].type for k in discovered}
    dead = None
    if reasons.count(None) != n:
        dead = pa.array(reasons, pa.string())
        bad = dead.is_valid()
        columns = {k: pc.if_else(bad, pa.scalar(None, c.type), c) for k, c in columns.items()}
    return Decoded(columns, dead, discovered)


def _column(n: int, groups: Sequence[Group], f: Field, reasons: list[str | None]) -> pa.Array:
    target = ARROW_TYPES[f.type] if f.type and f.type != "json" else None
    pieces: list[tuple[Group, pa.Array]] = []
    for g in groups:
        arr = _get(g.values, f.path)
        if arr is None:
            continue
        if f.type is not None and not readable(arr.type, f.type):
            _refuse(g, f, arr.type, type_name(ARROW_TYPES[f.type]), reasons)
            continue
        if target is not None and arr.type != target and widens(arr.type, target):
            arr = _exact(g, f, arr, target, reasons)
        pieces.append((g, arr))
    if not pieces:
        return pa.nulls(n, target or pa.null())
    common = pieces[0][1].type
    for _, arr in pieces[1:]:
        if arr.type != common and widens(common, arr.type):
            common = arr.type
    kept: list[tuple[np.ndarray, pa.Array]] = []
    for g, arr in pieces:
        if arr.type == common:
            kept.append((g.index, arr))
        elif widens(arr.type, common):
            kept.append((g.index, _exact(g, f, arr, common, reasons)))
        else:
            _refuse(g, f, arr.type, type_name(common), reasons)
    if not kept:
        return pa.nulls(n, common)
    order = np.concatenate([i for i, _ in kept])
    values = kept[0][1] if len(kept) == 1 else pa.concat_arrays([a for _, a in kept])
    if len(order) == n and (order == np.arange(n)).all():
        return values  # one group of every record, in order: no copy
    pos = np.full(n, -1, np.int64)
    pos[order] = np.arange(len(order))
    return values.take(pa.array(pos, mask=pos < 0))


def _exact(g: Group, f: Field, arr: pa.Array, target: pa.DataType, reasons: list[str | None]) -> pa.Array:
    """``arr`` as ``target``; a value the promotion would round is null, its record a dead letter."""
    out, lossy = cast_exact(arr, target)
    if lossy is not None:
        for i in pc.indices_nonzero(lossy).to_pylist():
            at = int(g.index[i])
            reasons[at] = reasons[at] or f"field {'.'.join(f.path)}: {loss_words(arr[i].as_py(), target)}"
    return out


def _refuse(g: Group, f: Field, writer: pa.DataType, reader: str, reasons: list[str | None]) -> None:
    why = (f"incompatible schema: field {'.'.join(f.path)} is {type_name(writer)} in writer "
           f"schema {g.schema_id}, the table reads {reader}")
    for i in g.index.tolist():
        if reasons[i] is None:
            reasons[i] = why
