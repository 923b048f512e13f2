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
  ``{`` (no BOM, array, scalar or leading space) and has no line break (records are
  joined by ``\\n`` for pyarrow, and a record's own line break could split it);
* pyarrow reads one object per record; it rejects lone surrogates (Spark gives
  ``?``), duplicate keys of a read field (Spark keeps the last), single quotes,
  leading zeros, unescaped control characters and trailing garbage;
* every read field is a string, an integer that fits 64 bits, a boolean or null.
  Spark renders a number or boolean under a string field as Jackson writes it back:
  an integer's digits (``-0`` as ``0``), ``true``, ``false``; that is what Arrow's
  casts give. A float (Jackson re-renders it through a double), an object or an
  array goes to Spark, as does a string pyarrow reads as a timestamp;
* no record has the corrupt-record column's own name as a key.

Null values (tombstones) are never parsed here: their flag is false.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

FAST = "__json_fast"  # bool column: the record's fields were parsed here
_FIELD_PREFIX = "__json_f"

# Types whose Arrow cast to string is the text from_json gives for that JSON value.
_AS_TEXT = (pa.string(), pa.int64(), pa.bool_(), pa.null())
# After this many batches in a row that had to go to Spark, a reader stops trying:
# a source whose fields are floats or objects should not pay pyarrow's parse as well.
_GIVE_UP_AFTER = 3


def field_column(index: int) -> str:
    """The name of the ``index``-th parsed field's column (positional: field names are
    the user's and could clash with the record columns)."""
    return f"{_FIELD_PREFIX}{index}"


def column_names(field_count: int) -> list[str]:
    return [FAST, *(field_column(i) for i in range(field_count))]


def arrow_fields(field_count: int) -> list[pa.Field]:
    """The columns the readers add to every record batch."""
    return [pa.field(FAST, pa.bool_()), *(pa.field(field_column(i), pa.string()) for i in range(field_count))]


class FieldParser:
    """Parses the named top-level fields of a batch's JSON values (one per reader task).

    It remembers the types the last parsed batch had, so the next one is read with an
    explicit schema (unknown keys ignored, not inferred); a batch that does not match
    them is inferred once more.
    """

    def __init__(self, fields: Sequence[str], corrupt_column: str):
        self.fields = list(fields)
        self.corrupt_column = corrupt_column
        self._schema: pa.Schema | None = None
        self._misses = 0

    def columns(self, values: pa.Array) -> list[pa.Array]:
        """``[FAST, field 0, field 1, ...]`` for ``values`` (binary); all-false and
        all-null when the batch goes to Spark."""
        parsed = None if self._misses >= _GIVE_UP_AFTER else self.parse(values)
        if parsed is None:
            self._misses += 1
            n = len(values)
            return [pa.repeat(pa.scalar(False), n), *(pa.nulls(n, pa.string()) for _ in self.fields)]
        self._misses = 0
        return parsed

    def parse(self, values: pa.Array) -> list[pa.Array] | None:
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
        if not pc.all(pc.starts_with(text, "{")).as_py():
            return None
        joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), text), "\n")
        buf = joined[0].as_buffer()
        raw = buf.to_pybytes()
        if raw.count(b"\n") != n - 1 or b"\r" in raw:
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
        read = pj.ReadOptions(use_threads=False, block_size=buf.size + 1)
        if self._schema is not None:
            try:
                return pj.read_json(
                    pa.BufferReader(buf),
                    read_options=read,
                    parse_options=pj.ParseOptions(explicit_schema=self._schema, unexpected_field_behavior="ignore"),
                )
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass
        try:
            table = pj.read_json(
                pa.BufferReader(buf), read_options=read, parse_options=pj.ParseOptions(unexpected_field_behavior="infer")
            )
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return None
        self._schema = _next_schema(table.schema, [*self.fields, self.corrupt_column])
        return table


def _next_schema(inferred: pa.Schema, fields: Sequence[str]) -> pa.Schema:
    """The explicit schema for the next batch: what this one had, a field pyarrow read as
    a timestamp as a string (so its text comes through next time), an absent one as null."""
    out = []
    for name in fields:
        idx = inferred.get_field_index(name)
        kind = inferred.field(idx).type if idx >= 0 else pa.null()
        if pa.types.is_timestamp(kind) or kind not in _AS_TEXT:
            kind = pa.string()
        out.append(pa.field(name, kind))
    return pa.schema(out)
