"""The JSON rules, and the per-record Python parser that is their reference.

A record's value is read as follows (the bulk path, ``jsonfields.FieldParser``, reads a
record only where it gives exactly this; every other record is parsed here):

* The bytes are decoded as UTF-8; an invalid sequence becomes U+FFFD (Python's
  ``errors="replace"``, one per maximal invalid subpart), as Spark did.
* The text must be one JSON object (RFC 8259, Python's ``json.loads``), with optional
  JSON whitespace around it. Anything else is a dead letter "invalid JSON: not a JSON
  object": an array, a scalar, ``null``, empty text, a leading byte order mark, single
  quotes, leading zeros, unescaped control characters in strings, trailing text, two
  objects.
* ``NaN``, ``Infinity`` and ``-Infinity`` are accepted as numbers (``-NaN``, ``Inf`` are not).
* Limits (Spark's, kept): nesting deeper than 1,000 (the object itself is depth 1), a
  number longer than 1,000 characters or a key longer than 50,000 make it invalid.
* A key given twice: the last value wins (escaped spellings of a key are the same key).
  Keys match a field's name exactly (case-sensitive).
* A read field's value becomes text (``render``): a string is itself; an integer its
  decimal digits (any size: ``-0`` is ``0``); ``true``/``false``; a fraction or exponent
  number is the float64 it denotes, written as Python's ``repr`` (``1.5``, ``1000.0``,
  ``1e+16``); ``NaN``, ``Infinity`` and a number beyond a double are null (as Spark had
  them); an object or array its compact JSON (``{"k":[1,2.0]}``: no spaces, non-ASCII
  kept, numbers as above, ``NaN``/``Infinity`` inside written so, a nested duplicate key
  collapsed to its last value); ``null`` or an absent key is null.
* A lone surrogate escape (``"\\ud800"``) becomes ``?`` in the text, as Spark wrote it.

A field's text is what a dimension holds; timestamps and metrics are read from it
(``reconciler.pipeline.times``).
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

MAX_DEPTH = 1000
MAX_NUMBER = 1000
MAX_NAME = 50_000
# A value shorter than this cannot pass any limit: only longer ones are looked at.
LIMITS_FROM = min(MAX_DEPTH, MAX_NUMBER)
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


@dataclass(frozen=True)
class ParsedFields:
    """The fields of a run of values: ``ok`` (bool, the value is a JSON object; false for a
    null value) and one string array per field (``render``'s text, null when absent)."""

    ok: pa.Array
    texts: tuple[pa.Array, ...]


class _Invalid(ValueError):
    """A value outside the rules' limits: the record is not a JSON object by them."""


def _number(text: str, kind: type) -> Any:
    if len(text) > MAX_NUMBER:
        raise _Invalid("number too long")
    return kind(text)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    for key, _ in pairs:
        if len(key) > MAX_NAME:
            raise _Invalid("name too long")
    return dict(pairs)


def _too_deep(text: str) -> bool:
    depth = 0
    for m in _TOKEN.finditer(text):
        c = m.group()[0]
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif c in "]}":
            depth -= 1
    return False


def load(raw: bytes) -> dict[str, Any] | None:
    """The JSON object of a value, or ``None`` when it is not one (see the module's rules)."""
    text = raw.decode("utf-8", "replace")
    try:
        if len(text) < LIMITS_FROM:
            obj = json.loads(text)
        else:
            obj = _load_long(text)
    except (ValueError, RecursionError):  # JSONDecodeError and _Invalid are ValueErrors
        return None
    return obj if isinstance(obj, dict) else None


def _load_long(text: str) -> Any:
    """``json.loads`` with the limits checked (slower hooks: long values only)."""
    brackets = text.count("[") + text.count("{")
    if brackets > MAX_DEPTH and _too_deep(text):
        raise _Invalid("too deep")
    hooks: dict[str, Any] = {
        "parse_int": lambda s: _number(s, int),
        "parse_float": lambda s: _number(s, float),
    }
    if len(text) > MAX_NAME:
        hooks["object_pairs_hook"] = _object
    return json.loads(text, **hooks)


def _no_surrogates(text: str) -> str:
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode("utf-8")  # a lone surrogate -> "?"


def _float_text(x: float) -> str | None:
    # Spark's from_json gave null for NaN, Infinity and a number beyond a double: kept.
    return repr(x) if math.isfinite(x) else None


def render(value: Any) -> str | None:
    """The text of a JSON value under a read field (the module's rules)."""
    if value is None:
        return None
    if isinstance(value, str):
        return _no_surrogates(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float_text(value)
    return _no_surrogates(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def parse_values(values: Sequence[bytes | None], fields: Sequence[str]) -> ParsedFields:
    """Every value parsed on its own (``load``), its fields rendered (``render``)."""
    ok: list[bool] = []
    columns: list[list[str | None]] = [[] for _ in fields]
    limit = sys.getrecursionlimit()
    for raw in values:
        # json's C scanner and encoder count each level of nesting against the recursion
        # limit: a value deep enough to reach it (within MAX_DEPTH) gets room.
        deep = raw is not None and len(raw) > limit // 2 and raw.count(b"[") + raw.count(b"{") > limit // 2
        if deep:
            sys.setrecursionlimit(max(limit, 4 * MAX_DEPTH))
        try:
            obj = load(raw) if raw is not None else None
            ok.append(obj is not None)
            for name, column in zip(fields, columns, strict=True):
                column.append(render(obj.get(name)) if obj is not None else None)
        finally:
            if deep:
                sys.setrecursionlimit(limit)
    return ParsedFields(
        pa.array(ok, pa.bool_()), tuple(pa.array(c, pa.string()) for c in columns)
    )
