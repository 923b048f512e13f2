"""The JSON fields a datasource reads, parsed in the reader with pyarrow's JSON reader.

Spark's ``from_json`` was half of a warm batch's JVM time (a Jackson parser per
record). pyarrow parses a whole batch in C++ at about a third of that CPU, so the
range readers hand Spark the fields already parsed, as the text ``from_json`` would
give, plus a flag per record; the transform calls ``from_json`` only for records
without the flag.

The text must be exactly ``from_json``'s, so a batch takes this path only when every
one of its records is one Spark would read the same way, and otherwise goes to Spark
whole (``FieldParser.parse`` returns ``None``):

* every value is valid UTF-8 (Spark would read invalid bytes as U+FFFD), starts with
  ``{`` and ends with ``}`` (no BOM, array, scalar or surrounding space) and has no line
  break. Records are joined by ``\n`` for pyarrow, which reads that as whitespace: a
  record cut off after ``:`` could run into the next one, but not one that ends with
  ``}`` (after a ``}`` only ``,``, ``]`` or ``}`` may follow, never the next record's
  ``{``, and a string cannot span lines). So no record yields zero rows or swallows
  another, and "as many rows as records" means one row per record (a record holding
  two objects makes one row too many);
* pyarrow rejects the rest of what Jackson rejects or reads otherwise: lone surrogates
  (Spark gives ``?``), a read key given twice, even through an escape (Spark keeps the
  last), single quotes, leading zeros, unescaped control characters, trailing text;
* what pyarrow accepts and Jackson does not goes to Spark: ``-NaN``, ``Inf``, ``-Inf``
  (Spark's ``allowNonNumericNumbers`` takes ``NaN``, ``Infinity`` and ``-Infinity``),
  and anything past the limits Spark gives Jackson (nesting depth 1,000, numbers of
  1,000 characters, names of 50,000), even in fields the data schema does not read;
* every read field is a string, an integer that fits 64 bits, a boolean or null.
  Spark renders a number or boolean under a string field as Jackson writes it back
  (``copyCurrentStructure``): an integer's digits (``-0`` as ``0``), ``true``,
  ``false``; that is what Arrow's casts give. A float (Jackson re-renders it through a
  double), an object or an array goes to Spark, as does a string pyarrow reads as a
  timestamp;
* no record has the corrupt-record column's own name as a key.

Null values (tombstones) are never parsed here: their flag is false.

Once a record is parsed here, Spark needs its raw value only to write it as a dead
letter, and copying it into the JVM's rows was a tenth of a warm batch. So
``shed_values`` drops the value of a parsed record that cannot become a dead letter
(``VALUE_BYTES`` keeps its length for the batch's byte count): its timestamp is an
integer short enough that ``transform.parse_timestamp`` converts it in the data
schema's format without overflow (``SAFE_TIMESTAMP_DIGITS``), to a time inside the
years 1 to 9999 (``TIME_FROM_MILLIS``, ``TIME_UNTIL_MILLIS``). Any other record keeps
its value: a missing, textual, fractional or ISO timestamp is left to Spark's verdict.
``tests/pipeline/test_jsonfields.py`` runs a hostile corpus through both paths.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    import pyarrow.json as pj

# pyarrow.compute and pyarrow.json are imported where they are used: Spark's four
# planner workers (a fresh Python process each, one after another, in a cold batch)
# import this module only to unpickle the data source, and those two modules cost
# each of them 40 ms.

FAST = "__json_fast"  # bool column: the record's fields were parsed here
VALUE_BYTES = "__json_value_bytes"  # int32 column: the length of a value the reader shed
_FIELD_PREFIX = "__json_f"
# The most digits of an integer timestamp that ``transform.parse_timestamp`` turns into a
# time, never null, in each format: millis (and auto above 1e11) multiply the long by 1,000,
# seconds (and auto up to 1e11) by 1,000,000, and 10^15 * 1,000 and 10^12 * 1,000,000 are
# within a long. An ISO timestamp is never shed: its verdict is Spark's parser's.
SAFE_TIMESTAMP_DIGITS = {"millis": 15, "auto": 15, "seconds": 12}
# The times a record may have, [0001-01-01, 10000-01-01) in milliseconds: Spark's and
# Python's range of timestamps. A record outside is a dead letter (``transform``), so a
# value is shed only when its timestamp lies inside, in the format's unit.
TIME_FROM_MILLIS = -62_135_596_800_000
TIME_UNTIL_MILLIS = 253_402_300_800_000
AUTO_MILLIS_ABOVE = 100_000_000_000  # "auto": a magnitude above this is millis, else seconds

# Types whose Arrow cast to string is the text from_json gives for that JSON value.
_AS_TEXT = (pa.string(), pa.int64(), pa.bool_(), pa.null())
# After this many batches in a row that had to go to Spark, a reader stops trying:
# a source whose fields are floats or objects should not pay pyarrow's parse as well.
_GIVE_UP_AFTER = 3
# Spark's limits on Jackson (``JSONOptions.buildJsonFactory``) and Jackson's default name
# limit. A value shorter than the smallest cannot pass any of them, so only longer ones
# are looked at.
_JACKSON_DEPTH = 1000
_JACKSON_NUMBER = 1000
_JACKSON_NAME = 50_000
_LONG = min(_JACKSON_DEPTH, _JACKSON_NUMBER)
_LONG_NUMBER = re.compile(rb"[-+0-9.eE]{%d}" % _JACKSON_NUMBER)
# Non-numeric numbers pyarrow reads and Spark's Jackson rejects: -NaN, Inf and -Inf
# (it takes NaN, Infinity, -Infinity), as a value: after ":", "[" or ",", up to a
# delimiter (inside a string such text only costs the batch its fast path).
# pyarrow's error when a record contradicts a column's type, and the JSON kinds it names
# that a read field may have (a "number" that is not an integer fails the int64 parse).
_CHANGED = re.compile(r"Column\((/.*)\) changed from \w+ to (\w+) in row")
_KINDS = {"string": pa.string(), "number": pa.int64(), "boolean": pa.bool_()}
# Each learning step is one more parse (up to the contradicting record): past a few, the
# batch is cheaper in Spark.
_LEARN_READS = 5
_ODD_NON_NUMERIC = re.compile(rb"[:\[,][ \t]*(?:-NaN|-?Inf)[ \t,\]}]")


def field_column(index: int) -> str:
    """The name of the ``index``-th parsed field's column (positional: field names are
    the user's and could clash with the record columns)."""
    return f"{_FIELD_PREFIX}{index}"


def arrow_fields(field_count: int) -> list[pa.Field]:
    """The columns the readers add to every record batch."""
    return [
        pa.field(FAST, pa.bool_()),
        *(pa.field(field_column(i), pa.string()) for i in range(field_count)),
        pa.field(VALUE_BYTES, pa.int32()),
    ]


def shed_values(
    values: pa.Array, fast: pa.Array, timestamp: pa.Array | None, timestamp_format: str | None
) -> tuple[pa.Array, pa.Array]:
    """``(values, VALUE_BYTES)``: each parsed record's value nulled where it cannot be a dead
    letter, and the shed values' lengths (null elsewhere).

    ``timestamp`` is the parsed timestamp field's text (``FieldParser.columns``), in
    ``timestamp_format``; without either, nothing is shed. A value is shed only when its
    record was parsed here (so its JSON is an object) and its timestamp is plain ASCII
    digits, optionally after one ``-``, no more than ``SAFE_TIMESTAMP_DIGITS`` of them:
    text ``try_cast`` reads as a long that converts without overflow, to a time inside
    ``[TIME_FROM_MILLIS, TIME_UNTIL_MILLIS)``.
    """
    n = len(values)
    digits = SAFE_TIMESTAMP_DIGITS.get(timestamp_format or "")
    if digits is None or timestamp is None or not fast.true_count:
        return values, pa.nulls(n, pa.int32())
    import pyarrow.compute as pc

    # ascii_is_decimal, not utf8_is_digit: Spark's string-to-long takes ASCII digits only.
    integer = pc.ascii_is_decimal(timestamp)
    length = pc.binary_length(timestamp)
    negative = pc.starts_with(timestamp, "-")
    if pc.any(negative).as_py():
        body = pc.utf8_slice_codeunits(timestamp, 1)
        integer = pc.or_(integer, pc.and_(negative, pc.ascii_is_decimal(body)))
        length = pc.subtract(length, negative.cast(pa.int32()))
    safe = pc.and_(pc.and_(fast, integer), pc.less_equal(length, digits)).fill_null(False)
    if safe.true_count:
        safe = pc.and_(safe, _in_time_range(pc.if_else(safe, timestamp, "0"), timestamp_format or ""))
    shed = safe.true_count
    if not shed:
        return values, pa.nulls(n, pa.int32())
    lengths = pc.if_else(safe, pc.binary_length(values).cast(pa.int32()), pa.scalar(None, pa.int32()))
    if shed == n:
        return pa.nulls(n, values.type), lengths
    return pc.if_else(safe, pa.scalar(None, values.type), values), lengths


def _in_time_range(text: pa.Array, timestamp_format: str) -> pa.Array:
    """Whether each integer text (at most 15 digits, so it parses) is a time inside
    ``[TIME_FROM_MILLIS, TIME_UNTIL_MILLIS)`` read in ``timestamp_format``."""
    import pyarrow.compute as pc

    number = text.cast(pa.int64())

    def within(low: int, high: int) -> pa.Array:
        return pc.and_(pc.greater_equal(number, low), pc.less(number, high))

    millis = within(TIME_FROM_MILLIS, TIME_UNTIL_MILLIS)
    seconds = within(TIME_FROM_MILLIS // 1000, TIME_UNTIL_MILLIS // 1000)
    if timestamp_format == "millis":
        return millis
    if timestamp_format == "seconds":
        return seconds
    big = pc.or_(pc.greater(number, AUTO_MILLIS_ABOVE), pc.less(number, -AUTO_MILLIS_ABOVE))
    return pc.if_else(big, millis, seconds)


class FieldParser:
    """Parses the named top-level fields of a batch's JSON values (one per reader task).

    It remembers the types the last parsed batch had, so the next one is read with an
    explicit schema (unknown keys ignored, not inferred); a batch that does not match
    them is inferred once more, and where inference fails (a field of two types), the
    read fields' types are found one error at a time (``_learn``).
    """

    def __init__(self, fields: Sequence[str], corrupt_column: str):
        self.fields = list(fields)
        self.corrupt_column = corrupt_column
        self._schema: pa.Schema | None = None
        self._misses = 0

    def columns(self, values: pa.Array) -> list[pa.Array]:
        """``[FAST, field 0, field 1, ...]`` for ``values`` (binary); all-false and
        all-null when the batch goes to Spark."""
        n = len(values)
        if values.null_count == n:  # tombstones only: nothing to parse, nothing learnt
            return self._unparsed(n)
        if self._misses >= _GIVE_UP_AFTER:
            return self._unparsed(n)
        parsed = self.parse(values)
        if parsed is None:
            self._misses += 1
            return self._unparsed(n)
        self._misses = 0
        return parsed

    def _unparsed(self, n: int) -> list[pa.Array]:
        return [pa.repeat(pa.scalar(False), n), *(pa.nulls(n, pa.string()) for _ in self.fields)]

    def parse(self, values: pa.Array) -> list[pa.Array] | None:
        import pyarrow.compute as pc
        n = len(values)
        if n == 0:
            return None
        try:
            text = values.cast(pa.string())  # validates UTF-8
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return None
        present = text.is_valid()
        if text.null_count:
            text = text.fill_null("{}")
        if not pc.all(pc.and_(pc.starts_with(text, "{"), pc.ends_with(text, "}"))).as_py():
            return None
        if pc.max(pc.binary_length(values)).as_py() >= _LONG and not _within_limits(values):
            return None
        joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), text), "\n")
        buf = joined[0].as_buffer()
        raw = buf.to_pybytes()
        if raw.count(b"\n") != n - 1 or b"\r" in raw:
            return None
        if (b"-NaN" in raw or b"Inf" in raw) and _ODD_NON_NUMERIC.search(raw):
            return None
        table = self._read(buf)
        if table is None or table.num_rows != n:
            return None
        names = set(table.column_names)
        if self.corrupt_column in names and table.column(self.corrupt_column).null_count != n:
            return None
        out: list[pa.Array] = [present]
        for name in self.fields:
            if name not in names:
                out.append(pa.nulls(n, pa.string()))
                continue
            col = table.column(name).combine_chunks()
            if col.type not in _AS_TEXT:
                return None
            out.append(col.cast(pa.string()))
        return out

    def _read(self, buf: pa.Buffer) -> pa.Table | None:
        import pyarrow.json as pj
        read = pj.ReadOptions(use_threads=False, block_size=buf.size + 1)
        if self._schema is not None:
            try:
                return pj.read_json(
                    pa.BufferReader(buf),
                    read_options=read,
                    parse_options=pj.ParseOptions(
                        explicit_schema=self._schema, unexpected_field_behavior="ignore"
                    ),
                )
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass  # this batch's types differ from the last one's: infer them again
        try:
            table = pj.read_json(
                pa.BufferReader(buf),
                read_options=read,
                parse_options=pj.ParseOptions(unexpected_field_behavior="infer"),
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return self._learn(buf, read)
        self._schema = _next_schema(table.schema, [*self.fields, self.corrupt_column])
        return table

    def _learn(self, buf: pa.Buffer, read: pj.ReadOptions) -> pa.Table | None:
        """Find the read fields' types with explicit schemas (unknown keys ignored) when
        inference failed, which it does when any field, read or not, has two types in the
        batch. pyarrow's error names the read field whose type a record contradicts; each
        field is given each type at most once, starting from the types remembered from the
        last batch (else strings), for at most ``_LEARN_READS`` parses. A parse that succeeds proves every read
        value has its declared type, so nothing here is a guess that could change text."""
        import pyarrow.json as pj
        kind_of = {t: k for k, t in _KINDS.items()}
        known = {f.name: f.type for f in self._schema} if self._schema is not None else {}
        # A field absent from the last batch (null) starts as a string like an unknown one.
        types = {n: known[n] if known.get(n) in kind_of else pa.string() for n in self.fields}
        tried = {(name, kind_of[t]) for name, t in types.items()}
        for _ in range(_LEARN_READS):
            schema = pa.schema(
                [
                    *(pa.field(n, types[n]) for n in self.fields),
                    pa.field(self.corrupt_column, pa.null()),
                ]
            )
            try:
                table = pj.read_json(
                    pa.BufferReader(buf),
                    read_options=read,
                    parse_options=pj.ParseOptions(
                        explicit_schema=schema, unexpected_field_behavior="ignore"
                    ),
                )
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                changed = _CHANGED.search(str(exc))
                if changed is None or changed.group(2) not in _KINDS:
                    return None
                name = changed.group(1)[1:]  # "/ts" -> "ts"
                if name not in types or (name, changed.group(2)) in tried:
                    return None  # the corrupt-record key, or a read field of two types
                tried.add((name, changed.group(2)))
                types[name] = _KINDS[changed.group(2)]
                continue
            self._schema = schema
            return table
        return None


def _next_schema(inferred: pa.Schema, fields: Sequence[str]) -> pa.Schema:
    """The explicit schema for the next batch: what this one had, a field pyarrow read as
    a timestamp as a string (so its text comes through next time), an absent one as null."""
    out = []
    for name in fields:
        idx = inferred.get_field_index(name)
        kind = inferred.field(idx).type if idx >= 0 else pa.null()
        if kind not in _AS_TEXT:  # a timestamp, a double, a struct, a list
            kind = pa.string()
        out.append(pa.field(name, kind))
    return pa.schema(out)


def _within_limits(values: pa.Array) -> bool:
    """Whether every value long enough to matter stays within Spark's limits on Jackson
    (conservatively: brackets counted, not nesting measured)."""
    import pyarrow.compute as pc
    long_ones = values.filter(pc.greater_equal(pc.binary_length(values), _LONG))
    for scalar in long_ones:
        v = scalar.as_py()
        if len(v) >= _JACKSON_NAME:
            return False
        if v.count(b"{") + v.count(b"[") >= _JACKSON_DEPTH or _LONG_NUMBER.search(v):
            return False
    return True
