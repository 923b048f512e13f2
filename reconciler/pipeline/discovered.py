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
boolean -> boolean, object or array -> ``json``; values of several kinds join (``join``):
numbers of both sorts -> double, any other mix of flat kinds -> string, so the decision
does not depend on the values' order.

One Spark batch, many tasks, each task many record batches: each task reports, beside the
type it decided for a new column, the join of every type it met (``report``); the driver
joins the tasks' reports (``settle``). When some task wrote a column in a type the table
could not read as the joined one (a long column where the join is double), the batch is
run again with the joined types as the table's, so every task decides the same: a new
column's type then depends on the values of the Spark batch that first meets it, never on
how that batch is cut into tasks or record batches, and a batch never fails for it. Which
Spark batch first meets a field stays the one thing a cut can change: a JSON field whose
first batch held only integers is a long column from then on, and a later fraction a dead
letter naming the field and both types.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from reconciler.pipeline.casts import cast_exact, loss_words
from reconciler.table.avrotypes import widens

_KINDS = {bool: "boolean", int: "long", float: "double", str: "string", dict: "json", list: "json"}
_TYPES = {"boolean": pa.bool_(), "long": pa.int64(), "double": pa.float64(), "string": pa.string(),
          "json": pa.string()}
# A JSON key's values as their exact JSON text, until conform knows the column's type.
_RAW = pa.struct([("__json_value", pa.string())])
_WANTS = "reconciler.wants"  # a reported field's metadata: the join of the types its task met
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
        # Names as written: Iceberg's are case-sensitive. A table from before the case rule
        # may hold two spellings; each keeps its own type.
        self.table = dict(table_types or {})
        self.spelled: dict[str, str] = {}  # lower-case name -> the table's spelling
        for k in self.table:
            self.spelled.setdefault(k.lower(), k)
        self.types: dict[str, pa.DataType] = {}  # first-seen order: the output's order
        self.seen: dict[str, pa.DataType] = {}  # a column the table lacks: the join of every type met

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
            if name not in self.table and (other := self.spelled.get(name.lower())) is not None:
                _refuse(col, reasons, f"field {name}: the table has a column {other}; a column name that "
                        "differs from another only in case is refused (Trino, Glue and Hive read both as one)")
                continue
            have = self.types.get(name) or self.table.get(name)
            if col.type != _RAW:
                if (ready := _iceberg_ready(col.type)) is None:
                    continue  # a record without fields holds nothing, and Parquet cannot write it
                if ready != col.type:
                    col = col.cast(ready)
                self._saw(name, col.type)
            if col.type == _RAW:
                out[name] = self._json(name, col, have, reasons)
            elif (grown := _grown(have, col.type)) is not None:
                out[name] = _exact(name, col, grown, reasons)  # a record that gained a field: the column too
                self.types[name] = grown
            elif have is None or col.type == have or widens(col.type, have):
                target = have or col.type
                out[name] = _exact(name, col, target, reasons)
                self.types.setdefault(name, target)
            elif _flat(col.type) and have == pa.string():
                out[name] = col.cast(pa.string())
                self.types.setdefault(name, have)
            elif widens(have, col.type) and _promotes(have, col.type):
                out[name] = col
                self.types[name] = col.type
            else:
                _refuse(col, reasons, f"incompatible schema: field {name} is {_name(col.type)}, "
                        f"the table reads {_name(have)}")
                self.types.setdefault(name, have)
        return out, reasons

    def _json(self, name: str, col: pa.Array, have: pa.DataType | None, reasons: list[str | None]) -> pa.Array:
        """A JSON key's values, each converted alone to the column's type (decided here by
        the batch's kinds when neither the table nor an earlier batch has the column)."""
        values = [None if r is None else json.loads(r["__json_value"]) for r in col.to_pylist()]
        present = [(i, v, _KINDS[type(v)]) for i, v in enumerate(values) if v is not None]
        field = None  # the batch's own kind, when it decides the type
        kinds = list(dict.fromkeys(k for _, _, k in present))
        if kinds:
            self._saw(name, join([_TYPES[k] for k in kinds]))
        if have is None:
            have = join([_TYPES[k] for k in kinds])
            field = kinds[0] if len(kinds) == 1 else _name(have)
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

    def report(self) -> list[pa.Field]:
        """``schema()``, each new column carrying (metadata) the join of every type the task
        met when that differs from the one it decided: what ``settle`` needs."""
        out = []
        for k, t in self.types.items():
            want = self.seen.get(k, t)
            out.append(pa.field(k, t, metadata=None if want == t else {_WANTS: _type_text(want)}))
        return out

    def _saw(self, name: str, t: pa.DataType) -> None:
        if name not in self.table:
            self.seen[name] = join([self.seen[name], t]) if name in self.seen else t


def join(types: Sequence[pa.DataType]) -> pa.DataType:
    """One type for a new column met as each of ``types``, whatever their order: the same
    type; Iceberg's promotions (int -> long, float -> double, a decimal's precision up);
    numbers of both sorts -> double (JSON's widening); other flat types -> string (which
    takes any flat value); two records -> one with every field of both (each joined), two
    lists -> a list of the join; anything else (a nested or binary type against another)
    the first by name, so at least the choice is the same for every cut."""
    unique = sorted(set(types), key=str)
    out = unique[0]
    for t in unique[1:]:
        out = _join2(out, t)
    return out


def _join2(a: pa.DataType, b: pa.DataType) -> pa.DataType:
    if a == b:
        return a
    if (wider := promoted(a, b)) is not None:
        return wider
    if _number(a) and _number(b):
        return pa.float64()
    if _flat(a) and _flat(b):
        return pa.string()
    if pa.types.is_struct(a) and pa.types.is_struct(b):  # every field of both: none dropped
        fields = {f.name: f.type for f in a}
        for f in b:
            fields[f.name] = _join2(fields[f.name], f.type) if f.name in fields else f.type
        return pa.struct(list(fields.items()))
    if pa.types.is_list(a) and pa.types.is_list(b):
        return pa.list_(_join2(a.value_type, b.value_type))
    return min(a, b, key=str)


def promoted(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """Of ``a`` and ``b``, the one Iceberg promotes the other to (its files read as it), or None."""
    for narrow, wide in ((a, b), (b, a)):
        if _promotes(narrow, wide):
            return wide
        if (pa.types.is_decimal(narrow) and pa.types.is_decimal(wide) and narrow.scale == wide.scale
                and narrow.precision <= wide.precision):
            return wide
    return None


def settle(found: Sequence[pa.Schema]) -> tuple[dict[str, pa.DataType], dict[str, pa.DataType]]:
    """The tasks' reports (``report``) of one batch -> (each discovered column's type, in
    first-seen order; the types to run the batch again with, empty when every task wrote
    its columns in a type the table reads as the joined one)."""
    met: dict[str, list[pa.DataType]] = {}
    for schema in found:
        for f in schema:
            wants = (f.metadata or {}).get(_WANTS.encode())
            met.setdefault(f.name, []).extend([f.type] + ([_type_of(wants)] if wants else []))
    final = {name: join(types) for name, types in met.items()}
    # Names that differ only in case are one column to Trino, Glue and Hive: the spelling
    # that sorts first is the column, whichever task met which, and the batch runs again
    # with it as the table's, so every task dead-letters the other spellings alike.
    spellings: dict[str, list[str]] = {}
    for name in final:
        spellings.setdefault(name.lower(), []).append(name)
    others = {n for names in spellings.values() for n in sorted(names)[1:]}
    final = {name: t for name, t in final.items() if name not in others}
    again = bool(others) or any(f.type != final[f.name] and promoted(f.type, final[f.name]) != final[f.name]
                                for schema in found for f in schema)
    return final, (dict(final) if again else {})


def _refuse(col: pa.Array, reasons: list[str | None], why: str) -> None:
    """Every record with a value in ``col`` is a dead letter for ``why`` (unless it is already)."""
    for i in pc.indices_nonzero(col.is_valid()).to_pylist():
        reasons[i] = reasons[i] or why


def _exact(name: str, col: pa.Array, target: pa.DataType, reasons: list[str | None]) -> pa.Array:
    """``col`` as ``target``; a value the cast would round (a long beyond 2^53 as a double)
    is null and its record a dead letter naming the field, as JSON's rule has it."""
    out, lossy = cast_exact(col, target)
    if lossy is not None:
        for i in pc.indices_nonzero(lossy).to_pylist():
            reasons[i] = reasons[i] or f"field {name}: {loss_words(col[i].as_py(), target)}"
    return out


def _type_text(t: pa.DataType) -> str:
    return base64.b64encode(pa.schema([pa.field("t", t)]).serialize().to_pybytes()).decode()


def _type_of(text: bytes) -> pa.DataType:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text))).field("t").type


def _grown(have: pa.DataType | None, t: pa.DataType) -> pa.DataType | None:
    """A record column ``have`` with the fields record ``t`` adds (Iceberg adds nested
    optional fields as it adds columns), when both read as it; else None. Casting ``t`` to
    ``have`` would drop what it adds without a word."""
    if have is None or not (pa.types.is_struct(have) and pa.types.is_struct(t)):
        return None
    merged = join([have, t])
    return merged if merged != have and widens(have, merged) and widens(t, merged) else None


def _iceberg_ready(t: pa.DataType) -> pa.DataType | None:
    """``t`` with every time of day in microseconds, Iceberg's only ``time`` (Avro's
    time-millis is Arrow's time32[ms], which no Iceberg column holds: every publish failed),
    and without records of no fields (Avro's ``"fields": []``, Protobuf's Empty: Parquet
    cannot write a struct without children, so every task failed); None when nothing is left."""
    if pa.types.is_time(t):
        return pa.time64("us")
    if pa.types.is_struct(t):
        fields = [pa.field(f.name, ready, f.nullable) for f in t if (ready := _iceberg_ready(f.type)) is not None]
        return pa.struct(fields) if fields else None
    if pa.types.is_map(t):
        item = _iceberg_ready(t.item_type)
        return None if item is None else pa.map_(t.key_type, item)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        value = _iceberg_ready(t.value_type)
        return None if value is None else pa.list_(pa.field(t.value_field.name, value, t.value_field.nullable))
    return t


def _number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


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
