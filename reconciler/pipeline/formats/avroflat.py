"""Flat Avro records decoded in bulk, column by column, in numpy (``avro``'s bulk path).

A flat record (fields of boolean, int, long, float, double, string, bytes, date,
timestamp-millis/micros, each alone or in a union with null) is read one field at a time
for every body of a group at once: each body has a read position, and each field's step
reads its value at every position and moves them on. No Python per record, no copy of a
body other than the bytes of its strings.

Only what the per-record path (fastavro) would read the same is kept (``ok``): a body
read to exactly its end; every integer within 64 bits and within its type; a union branch
index the union has; a string of valid UTF-8 and of a length within its body; a date or
instant within years 1..9999 (what Python's datetime, fastavro's value, holds). Anything
else (a truncated or overlong body, a corrupt byte) is left to the per-record path, which
is the reference and names the problem: so a record's fate never depends on its group.
Read alike, so kept: a longer encoding of a number than its shortest, and any non-zero
boolean byte (true).

Every varint is untrusted: a length is compared with the bytes left (``L <= end - pos``),
never added to a position before that, so no value near 2^63 can wrap a check or a total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from reconciler.pipeline.times import TIME_FROM_MICROS, TIME_UNTIL_MICROS

_PRIMITIVES = {"boolean", "int", "long", "float", "double", "string", "bytes"}
# logical type -> (its base type, microseconds per unit); date is days
_LOGICAL = {"timestamp-millis": ("long", 1_000), "timestamp-micros": ("long", 1), "date": ("int", 0)}
_DAYS = (-719_162, 2_932_896)  # 0001-01-01 and 9999-12-31, days from the epoch
_INT32 = (-(2**31), 2**31 - 1)
_PAD = 32  # zero bytes after the last body: reads past a body's end (a branch, then a value) stay in it


@dataclass(frozen=True)
class Step:
    """How one field is read: ``kind`` (a primitive, or a logical type), the union
    branch that holds a value (None: not a union) and how many branches the union has."""

    kind: str
    branch: int | None = None
    branches: int = 0


def steps_of(schema: dict) -> list[Step] | None:
    """The steps of a record schema, or None when it is not flat (the per-record path)."""
    out = []
    for f in schema["fields"]:
        t, branch, branches = f["type"], None, 0
        if isinstance(t, list):
            values = [i for i, b in enumerate(t) if b != "null"]
            if len(values) != 1 or len(t) > 2:
                return None
            branch, branches, t = values[0], len(t), t[values[0]]
        kind = _kind(t)
        if kind is None:
            return None
        out.append(Step(kind, branch, branches))
    return out


def _kind(t: Any) -> str | None:
    if isinstance(t, str):
        return t if t in _PRIMITIVES else None
    if not isinstance(t, dict):
        return None
    logical = t.get("logicalType")
    if logical is None:
        return _kind(t.get("type"))
    if logical in _LOGICAL and t.get("type") == _LOGICAL[logical][0]:
        return logical
    return None


def decode(bodies: pa.Array, steps: list[Step], struct: pa.StructType) -> tuple[pa.StructArray, np.ndarray]:
    """(the records of ``bodies`` as ``struct``, which of them are exactly their body's
    record). A row that is not ok holds anything: the caller replaces it."""
    bodies = bodies.cast(pa.binary())
    n = len(bodies)
    offsets = np.frombuffer(bodies.buffers()[1], np.int32, n + 1, 4 * bodies.offset).astype(np.int64)
    data = bodies.buffers()[2]
    raw = np.frombuffer(data, np.uint8, offsets[-1] - offsets[0], offsets[0]) if data is not None and n \
        else np.zeros(0, np.uint8)
    buf = np.concatenate([raw, np.zeros(_PAD, np.uint8)])
    pos = offsets[:-1] - offsets[0]
    end = offsets[1:] - offsets[0]
    ok = bodies.is_valid().to_numpy(zero_copy_only=False).copy()
    r = _Reader(buf, pos, end, ok)
    children = [r.field(step, struct.field(i).type) for i, step in enumerate(steps)]
    r.ok &= r.pos == end
    return pa.StructArray.from_arrays(children, fields=list(struct)), r.ok


class _Reader:
    """Read positions of every body, and which bodies are still readable. ``valid`` (a
    union's branch): which records hold a value; None: all of them."""

    def __init__(self, buf: np.ndarray, pos: np.ndarray, end: np.ndarray, ok: np.ndarray):
        self.buf, self.pos, self.end, self.ok = buf, pos.copy(), end, ok

    def field(self, step: Step, t: pa.DataType) -> pa.Array:
        valid = None
        if step.branch is not None:
            index = self._long(None)
            # an index naming no branch (1 in a union of one type) fails in fastavro: not ok;
            # any other branch than the value's is the union's null
            self.ok &= (index >= 0) & (index < step.branches)
            valid = index == step.branch
        values = self._value(step.kind, t, valid)
        past = self.pos > self.end
        if past.any():  # read past its end: not ok, and stopped there so later reads stay in the buffer
            self.ok &= ~past
            self.pos = np.minimum(self.pos, self.end)
        return values

    def _require(self, cond: np.ndarray, valid: np.ndarray | None) -> None:
        self.ok &= cond if valid is None else cond | ~valid

    def _value(self, kind: str, t: pa.DataType, valid: np.ndarray | None) -> pa.Array:
        if kind in ("string", "bytes"):
            return self._binary(t, valid)
        if kind in ("float", "double", "boolean"):
            width = {"float": 4, "double": 8, "boolean": 1}[kind]
            raw = np.ascontiguousarray(self.buf[self.pos[:, None] + np.arange(width)])
            self.pos = self.pos + (width if valid is None else np.where(valid, width, 0))
            if kind == "boolean":
                return _array(t, raw[:, 0].astype(bool), valid)
            if kind == "float":
                return _array(t, _quiet(raw.view("<u4").reshape(len(raw))).view("<f4"), valid)
            return _array(t, raw.view("<f8").reshape(len(raw)), valid)
        value = self._long(valid)
        if kind == "int" or kind == "date":
            low, high = _DAYS if kind == "date" else _INT32
            self._require((value >= low) & (value <= high), valid)
            return _array(t, value.astype(np.int32), valid)
        if kind in _LOGICAL:
            per = _LOGICAL[kind][1]
            inside = (value >= TIME_FROM_MICROS // per) & (value <= (TIME_UNTIL_MICROS - 1) // per)
            self._require(inside, valid)
            return _array(t, np.where(inside, value, 0) * per, valid)
        return _array(t, value, valid)

    def _long(self, valid: np.ndarray | None) -> np.ndarray:
        """The zigzag varint at each position (where ``valid``), positions moved past it.
        One of more than 64 bits is not ok (fastavro wraps it: the reference decides)."""
        buf, pos = self.buf, self.pos
        first = buf[pos]
        z = (first & 0x7F).astype(np.uint64)
        size = np.ones(len(pos), np.int64) if valid is None else valid.astype(np.int64)
        more = np.flatnonzero(first >= 0x80)
        if valid is not None:
            more = more[valid[more]]
        k = 1
        while more.size and k < 10:
            b = buf[pos[more] + k]
            z[more] |= (b & 0x7F).astype(np.uint64) << np.uint64(7 * k)
            size[more] += 1
            more = more[b >= 0x80]
            k += 1
        if k == 10:  # a tenth byte holds the 64th bit only; more, or an eleventh byte: too long
            ten = np.flatnonzero(size == 10)
            self.ok[ten[buf[pos[ten] + 9] > 1]] = False
        self.pos = pos + size
        return (z >> np.uint64(1)).view(np.int64) ^ -(z & np.uint64(1)).view(np.int64)

    def _binary(self, t: pa.DataType, valid: np.ndarray | None) -> pa.Array:
        length = self._long(valid)
        # end - pos is small (negative when the length's varint ran past the end), so the
        # comparison cannot wrap as pos + length does for a length near 2^63
        self._require((length >= 0) & (length <= self.end - self.pos), valid)
        # each kept length lies inside its own body: their total is at most the buffer's size
        length = np.where(self.ok if valid is None else self.ok & valid, length, 0)
        starts = self.pos
        self.pos = self.pos + length
        offsets = np.zeros(len(length) + 1, np.int64)
        np.cumsum(length, out=offsets[1:])
        if offsets[-1] >= 2**31:
            raise OverflowError("a column of more than 2 GiB of strings")  # the per-record path reads it
        index = np.repeat(starts - offsets[:-1], length) + np.arange(offsets[-1])
        out = pa.Array.from_buffers(pa.binary(), len(length), [_validity(valid), pa.py_buffer(offsets.astype(np.int32)),
                                                               pa.py_buffer(self.buf[index])])
        if t == pa.binary():
            return out
        try:
            return out.cast(t)
        except pa.ArrowInvalid:  # invalid UTF-8 somewhere: those records go to the per-record path
            bad = np.array([v is not None and not _utf8(v) for v in out.to_pylist()], bool)
            self.ok &= ~bad
            return pa.array([None if b else v for v, b in zip(out.to_pylist(), bad, strict=True)], pa.binary()).cast(t)


def _quiet(bits: np.ndarray) -> np.ndarray:
    """A float's bits as the reference gives them: fastavro makes a float a Python float
    (C float to double), which quiets a signalling NaN (sets the mantissa's top bit)."""
    nan = ((bits & 0x7F800000) == 0x7F800000) & ((bits & 0x007FFFFF) != 0)
    return np.where(nan, bits | np.uint32(0x00400000), bits).astype(np.uint32)


def _utf8(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def _validity(valid: np.ndarray | None) -> pa.Buffer | None:
    return None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))


def _array(t: pa.DataType, values: np.ndarray, valid: np.ndarray | None) -> pa.Array:
    storage = {pa.date32(): pa.int32(), pa.bool_(): pa.bool_()}.get(t)
    if storage is None and pa.types.is_timestamp(t):
        storage = pa.int64()
    arr = pa.array(values, storage or t, mask=None if valid is None else ~valid)
    return arr.view(t) if storage is not None and storage != t else arr
