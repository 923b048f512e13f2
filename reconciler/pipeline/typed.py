"""A field's values as a typed column (a typed dimension): the conversions and what does
not fit.

* text (the JSON and CSV formats: a value's text by the JSON rules) reads by one rule per
  value, whatever its batch: ``long`` and ``double`` by ``times.to_long``/``to_double``,
  ``boolean`` only ``true``/``false``, ``timestamp`` as the timestamp ``auto`` rule (a
  number of seconds or millis, or ISO), ``string`` and ``json`` the text itself (an
  object's or array's compact JSON);
* a format's own types (Avro, Protobuf) cast safely to the column's type; a nested value
  is its compact JSON text under ``string`` or ``json``; a number under ``timestamp``
  reads as its text would (``auto``: seconds or millis, as ``__time`` reads that column);
* a present value that does not convert is a misfit: the transform dead-letters the
  record (``qty: "abc" is not a long``); an absent one is null.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

from reconciler.pipeline.formats import ARROW_TYPES
from reconciler.pipeline.times import (
    TIME_FROM_MICROS,
    TIME_UNTIL_MICROS,
    parse_times,
    to_double,
    to_long,
)


def typed_values(values: pa.Array, kind: str) -> tuple[pa.Array, pa.Array | None]:
    """(the values as a dimension of type ``kind``, which present values do not fit it, or
    None when all do). Text reads by the JSON rules (``times``: one rule per value, whatever
    its batch); a format's own types cast safely."""
    target = ARROW_TYPES[kind]
    if kind in ("string", "json"):
        return as_text(values), None
    if kind == "timestamp" and (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
        values = values.cast(pa.string())  # a number of seconds or millis, as text and __time read it
    if values.type == pa.string():
        if kind == "long":
            out = to_long(values)
        elif kind == "double":
            out = to_double(values)
        elif kind == "boolean":
            trimmed = pc.ascii_trim_whitespace(values)
            out = pc.if_else(pc.equal(trimmed, "true"), True,
                             pc.if_else(pc.equal(trimmed, "false"), False, pa.scalar(None, pa.bool_())))
        else:
            micros = parse_times(pc.utf8_trim(values, " "), "auto")
            inside = pc.and_(pc.greater_equal(micros, TIME_FROM_MICROS), pc.less(micros, TIME_UNTIL_MICROS))
            out = pc.if_else(inside, micros, pa.scalar(None, pa.int64())).cast(target)
    else:
        try:
            out = values.cast(target)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            out = pa.array([_cast_one(v, target) for v in values.to_pylist()], target)
    bad = pc.and_(values.is_valid(), out.is_null())
    return out, bad if pc.any(bad).as_py() else None


def _cast_one(value: object, target: pa.DataType) -> object:
    try:
        return pa.array([value]).cast(target)[0].as_py()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None


def as_text(values: pa.Array) -> pa.Array:
    """A column as text: itself when it is text; a nested value its compact JSON."""
    if values.type == pa.string():
        return values
    if pa.types.is_nested(values.type) or pa.types.is_binary(values.type):
        return pa.array([None if v is None else json.dumps(v, separators=(",", ":"), ensure_ascii=False,
                                                           default=str) for v in values.to_pylist()], pa.string())
    return values.cast(pa.string())
