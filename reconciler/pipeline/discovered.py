"""Schema discovery (``schemaDiscovery: true``, issue 42): every top-level field of a record
that the data schema does not already read becomes a column of its own type.

* Avro and Protobuf: the writer schema's type (``table.avrotypes``), from the format's
  ``Decoded.discovered``;
* JSON (``infer``, then ``Discovered.conform``): each value is kept exactly (its JSON text)
  until the column's type is known, then converted alone by one rule (``_convert``).

The type of a column is decided once: by the table when it has the column, else by the
first batch of the task that meets it. Under a decided type every value converts alone,
whatever its neighbours: without loss (int -> long, an integer into a double column when
the double is that integer exactly, anything flat into a string column, a JSON number as
its text, an object as compact JSON) it is a row, else a dead letter naming the field and
both types. A type the column can promote to (int column, long values) widens it (the
table follows at publish). A JSON key's first batch decides by its values' kinds: text ->
string, integers -> long (one beyond 64 bits a dead letter), a number with a fraction ->
double (the batch's integers with it; one the double would round is a dead letter),
boolean -> boolean, object or array -> ``json``; values of several kinds take the first
value's kind (numbers combined). So a JSON field whose first batch held only integers is a
long column from then on and a later fraction a dead letter: which batch first meets a
field is the one thing a cut can change, never a value, and never an exception.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from reconciler.table.avrotypes import widens

_KINDS = {bool: "boolean", int: "long", float: "double", str: "string", dict: "json", list: "json"}
_TYPES = {"boolean": pa.bool_(), "long": pa.int64(), "double": pa.float64(), "string": pa.string(),
          "json": pa.string()}
# A JSON key's values as their exact JSON text, until conform knows the column's type.
_RAW = pa.struct([("__json_value", pa.string())])
_LONG = (-(2**63), 2**63 - 1)
_INT = (-(2**31), 2**31 - 1)


def infer(values: pa.Array, ok: pa.Array | None, skip: set[str]) -> tuple[dict[str, pa.Array], list[str | None]]:
    """JSON values -> (top-level field -> its values kept exactly, in first-seen order; no
    reasons: ``Discovered.conform`` types and judges each value). ``ok``: the records that
    are JSON objects (None: all); ``skip``: fields the data schema reads already."""
    n = len(values)
    good = [True] * n if ok is None else ok.fill_null(False).to_pylist()
    cols: dict[str, list] = {}
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
            if key in skip or v is None or type(v) not in _KINDS:
                continue
            cols.setdefault(key, [None] * n)[i] = {"__json_value": _text(v)}
    return {key: pa.array(column, _RAW) for key, column in cols.items()}, [None] * n


def _text(v: object) -> str:
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


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
            if col.type == _RAW:
                out[name] = self._json(name, col, have, reasons)
            elif have is None or col.type == have or widens(col.type, have):
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

    def _json(self, name: str, col: pa.Array, have: pa.DataType | None, reasons: list[str | None]) -> pa.Array:
        """A JSON key's values, each converted alone to the column's type (decided here by
        the batch's kinds when neither the table nor an earlier batch has the column)."""
        values = [None if r is None else json.loads(r["__json_value"]) for r in col.to_pylist()]
        present = [(i, v, _KINDS[type(v)]) for i, v in enumerate(values) if v is not None]
        field = None  # the batch's own kind, when it decides the type
        if have is None:
            kinds = [k for _, _, k in present]
            field = kinds[0]
            if field in ("long", "double"):
                field = "double" if "double" in kinds else "long"
            have = _TYPES[field]
        target = have
        if have == pa.int32() and any(k == "long" and not _within(v, _INT) and _within(v, _LONG)
                                      for _, v, k in present):
            target = pa.int64()  # Iceberg's promotion int -> long: the table follows
        elif have == pa.float32() and present:
            target = pa.float64()
        column: list = [None] * len(values)
        for i, v, kind in present:
            value, why = _convert(v, kind, target)
            if why is None:
                column[i] = value
                continue
            if why == "kind":
                why = (f"field {name}: {_show(v)} is a {kind}, the field is {field}" if field is not None
                       else f"incompatible schema: field {name} is {kind}, the table reads {_name(have)}")
            else:
                why = f"field {name}: {_show(v)} {why}"
            reasons[i] = reasons[i] or why
        if name in self.types and target != self.types[name]:
            self.types[name] = target
        self.types.setdefault(name, target)
        return pa.array(column, target)

    def schema(self) -> list[pa.Field]:
        return [pa.field(k, t) for k, t in self.types.items()]


def _convert(v: object, kind: str, target: pa.DataType) -> tuple[object, str | None]:
    """One JSON value in ``target`` without loss: (value, None), or (None, why): ``kind``
    when the kinds do not fit, else the loss in words."""
    if target == pa.string():
        return (v if kind == "string" else _text(v)), None
    if target == pa.bool_():
        return (v, None) if kind == "boolean" else (None, "kind")
    if target in (pa.int64(), pa.int32()):
        if kind != "long":
            return None, "kind"
        if not _within(v, _LONG):
            return None, "is beyond a long"
        return (v, None) if target == pa.int64() or _within(v, _INT) else (None, "is beyond an int")
    if target == pa.float64():
        if kind == "double":
            return v, None
        if kind != "long":
            return None, "kind"
        try:
            f = float(v)  # type: ignore[arg-type]
        except OverflowError:
            f = math.inf
        return (f, None) if math.isfinite(f) and int(f) == v else (None, "would lose precision as double")
    return None, "kind"


def _within(v: object, bounds: tuple[int, int]) -> bool:
    return bounds[0] <= v <= bounds[1]  # type: ignore[operator]


def _flat(t: pa.DataType) -> bool:
    return not pa.types.is_nested(t) and not pa.types.is_binary(t)


def _promotes(have: pa.DataType, want: pa.DataType) -> bool:
    """Iceberg's promotions (int -> long, float -> double): what the table can widen to."""
    return (have, want) in {(pa.int32(), pa.int64()), (pa.float32(), pa.float64())}


def _name(t: pa.DataType) -> str:
    return {pa.int32(): "int", pa.int64(): "long", pa.float32(): "float", pa.float64(): "double",
            pa.bool_(): "boolean", pa.string(): "string"}.get(t, str(t))
