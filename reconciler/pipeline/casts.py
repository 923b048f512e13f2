"""A column cast to the type a table reads it as, value by value, never a failed batch.

Avro's promotions (int -> long -> float -> double) and Iceberg's (int -> long, float ->
double) are judged by type, but a type's promotion can still round a value: a long beyond
2^53 read as a double, an int beyond 2^24 read as a float. Arrow's safe cast raises on the
whole column for one such value, and a task that raises fails its batch on every retry
(the same records come back). Here the values that would change are null, with a mask
saying which, so the caller makes those records dead letters naming the field and keeps
the rest.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError)


def cast_exact(values: pa.Array, target: pa.DataType) -> tuple[pa.Array, pa.Array | None]:
    """(``values`` as ``target``, null where a value would not read back the same; which
    present values those are, or None when every one casts exactly)."""
    if values.type == target:
        return values, None
    try:
        return values.cast(target), None
    except _ARROW_ERRORS:
        pass
    try:
        # Round trip: a value that comes back as itself lost nothing (a long 2^53 + 1 comes
        # back as 2^53 through a double).
        out = values.cast(target, safe=False)
        back = out.cast(values.type, safe=False)
        same = pc.equal(back, values)
        if pa.types.is_floating(values.type):  # NaN reads back as NaN, though it equals nothing
            same = pc.or_(same, pc.and_(pc.is_nan(back), pc.is_nan(values)))
        lossy = pc.and_(values.is_valid(), pc.invert(same.fill_null(False)))
    except _ARROW_ERRORS:  # nested types: each value alone
        kept = [_one(v, values.type, target) for v in values.to_pylist()]
        out = pa.array([v for v, _ in kept], target)
        lossy = pa.array([bad for _, bad in kept], pa.bool_())
    if not pc.any(lossy).as_py():
        return out, None
    return pc.if_else(lossy, pa.scalar(None, target), out), lossy


def _one(value: object, source: pa.DataType, target: pa.DataType) -> tuple[object, bool]:
    if value is None:
        return None, False
    try:
        return pa.array([value], source).cast(target)[0].as_py(), False
    except _ARROW_ERRORS:
        return None, True


def loss_words(value: object, target: pa.DataType) -> str:
    """How a lost value reads in a dead letter's reason."""
    name = {pa.float32(): "float", pa.float64(): "double", pa.int32(): "int", pa.int64(): "long"}.get(target)
    return f"{str(value)[:60]} would lose precision as {name or target}"
