"""Schema discovery (``schemaDiscovery: true``, issue 42): every top-level field of a record
that the data schema does not already read becomes a column of its own type.

* Avro and Protobuf: the writer schema's type (``table.avrotypes``), from the format's
  ``Decoded.discovered``;
* JSON (``infer``): from the values: text -> string, integer -> long, a number with a
  fraction -> double (the batch's integers with it), boolean -> boolean, object or array
  -> ``json`` (compact text). Within a batch, values of another kind than the field's
  first one (a string where the field's first value was a number) are dead letters.

The type of a column is decided once: by the table when it has the column, else by the
first batch of the task that meets it. A later value converts to that type when it can
without loss (int -> long, a long into a double column, anything flat into a string
column); a type the column can promote to (int column, long values) widens it (the table
follows at publish); anything else makes those records dead letters naming the field and
both types, and the rest flow. So a JSON field whose first batch held only integers is a
long column from then on, and a later fraction a dead letter: only the batch that first
meets a field decides, whatever the cuts after it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from reconciler.table.avrotypes import widens

_KINDS = {bool: "boolean", int: "long", float: "double", str: "string", dict: "json", list: "json"}
_TYPES = {"boolean": pa.bool_(), "long": pa.int64(), "double": pa.float64(), "string": pa.string(),
          "json": pa.string()}


def infer(values: pa.Array, ok: pa.Array | None, skip: set[str]) -> tuple[dict[str, pa.Array], list[str | None]]:
    """JSON values -> (top-level field -> typed column, in first-seen order; a reason per
    record for a value of another kind than its field's). ``ok``: the records that are
    JSON objects (None: all); ``skip``: fields the data schema reads already."""
    n = len(values)
    good = [True] * n if ok is None else ok.fill_null(False).to_pylist()
    cols: dict[str, list] = {}
    kinds: dict[str, str] = {}
    reasons: list[str | None] = [None] * n
    for i, raw in enumerate(values.to_pylist()):
        if raw is None or not good[i]:
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            continue
        if not isinstance(obj, dict):
            continue
        for key, v in obj.items():
            if key in skip or v is None:
                continue
            kind = _KINDS.get(type(v))
            if kind is None:
                continue
            column = cols.setdefault(key, [None] * n)
            have = kinds.setdefault(key, kind)
            if kind != have and {kind, have} == {"long", "double"}:
                kinds[key] = "double"
            elif kind != have:
                if reasons[i] is None:
                    reasons[i] = f"field {key}: {_show(v)} is a {kind}, the field is {have}"
                continue
            column[i] = json.dumps(v, separators=(",", ":"), ensure_ascii=False) if kind == "json" else v
    out = {}
    for key, column in cols.items():
        kind = kinds[key]
        if kind == "double":
            column = [float(v) if isinstance(v, int) and not isinstance(v, bool) else v for v in column]
        out[key] = pa.array(column, _TYPES[kind])
    bad = {i for i, r in enumerate(reasons) if r is not None}
    if bad:  # a dead letter's other fields are no values either
        mask = pa.array([i in bad for i in range(n)])
        out = {k: pc.if_else(mask, pa.scalar(None, c.type), c) for k, c in out.items()}
    return out, reasons


def _show(v: object) -> str:
    return json.dumps(v, ensure_ascii=False)[:60]


class Discovered:
    """The discovered columns of one task: each one's type, decided once (see the docstring)."""

    def __init__(self, table_types: Mapping[str, pa.DataType] | None = None):
        self.table = {k.lower(): t for k, t in (table_types or {}).items()}
        self.types: dict[str, pa.DataType] = {}  # first-seen order: the output's order

    def conform(self, columns: Mapping[str, pa.Array], names: Sequence[str]) -> tuple[dict[str, pa.Array], list[str | None]]:
        """``names``' columns in their decided types, and a reason per record whose value
        cannot be (null: none)."""
        n = len(next(iter(columns.values()))) if columns else 0
        reasons: list[str | None] = [None] * n
        out: dict[str, pa.Array] = {}
        for name in names:
            col = columns[name]
            if pa.types.is_null(col.type):
                continue
            have = self.types.get(name) or self.table.get(name.lower())
            if have is None or col.type == have or widens(col.type, have):
                target = have or col.type
                out[name] = col if col.type == target else col.cast(target)
                self.types.setdefault(name, target)
            elif _flat(col.type) and have == pa.string():
                out[name] = col.cast(pa.string())
                self.types.setdefault(name, have)
            elif widens(have, col.type) and _promotes(have, col.type):
                out[name] = col
                self.types[name] = col.type
            else:
                why = f"incompatible schema: field {name} is {_name(col.type)}, the table reads {_name(have)}"
                for i in pc.indices_nonzero(col.is_valid()).to_pylist():
                    reasons[i] = reasons[i] or why
                self.types.setdefault(name, have)
        return out, reasons

    def schema(self) -> list[pa.Field]:
        return [pa.field(k, t) for k, t in self.types.items()]


def _flat(t: pa.DataType) -> bool:
    return not pa.types.is_nested(t) and not pa.types.is_binary(t)


def _promotes(have: pa.DataType, want: pa.DataType) -> bool:
    """Iceberg's promotions (int -> long, float -> double): what the table can widen to."""
    return (have, want) in {(pa.int32(), pa.int64()), (pa.float32(), pa.float64())}


def _name(t: pa.DataType) -> str:
    return {pa.int32(): "int", pa.int64(): "long", pa.float32(): "float", pa.float64(): "double",
            pa.bool_(): "boolean", pa.string(): "string"}.get(t, str(t))
