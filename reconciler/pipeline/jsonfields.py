"""The JSON fields a datasource reads, parsed in bulk with pyarrow's JSON reader.

The per-record Python parser (``reconciler.pipeline.jsonparse``) is the reference: a
record is read here only where pyarrow gives exactly its text, and ``FieldParser.parse``
marks every other record for the Python parser (``BulkFields.exact`` false). So:

* cheap checks pick the candidates: valid UTF-8, starts with ``{`` and ends with ``}``
  (no BOM, array, scalar or surrounding space), no line break, no ``-NaN``/``Inf``/
  ``-Inf`` value (pyarrow reads them, the rules do not), and surely within the rules'
  limits (brackets counted, number runs found). Records are joined by ``\\n`` for
  pyarrow, which reads that as whitespace: a record cut off after ``:`` could run into the
  next one, but not one that ends with ``}`` (after a ``}`` only ``,``, ``]`` or ``}`` may
  follow, never the next record's ``{``, and a string cannot span lines). So no record
  yields zero rows or swallows another, and "as many rows as records" means one row per
  record (a record holding two objects makes one row too many: found by halves);
* pyarrow rejects the rest of what the rules reject or read otherwise (a read key given
  twice, even through an escape, single quotes, leading zeros, unescaped control
  characters, trailing text, a lone surrogate, a read field of another type than the
  records before): its error names the row, which goes to Python, and the others are
  read again (``FieldParser._parse_rows``);
* a read field's column must be a string, an integer (int64), a boolean or null: their
  Arrow casts to string are the rules' text. A float column is taken only for a field
  read as a double alone (``numeric``: double metrics), where its text (Arrow's shortest
  round-trip digits, not the rules' text) is only read back as the same double; a float
  column holds the integers of its field as floats too, so a field read as a long or a
  text cannot take it. Elsewhere (and for an object or array) the records with a value
  there go to Python. A column pyarrow inferred as a timestamp is read again as a string;
* where pyarrow's error names no record (a value its explicit type cannot convert, a
  record of two objects), each half of the batch is read on its own.

It remembers the types the last batch had, so the next one is read with an explicit
schema (unknown keys ignored, not inferred); a batch that does not match them is inferred
once more, and where inference fails (a field of two types), the read fields' types are
found one error at a time (``_learn``). ``tests/pipeline/test_jsonfields.py`` runs a
hostile corpus through both paths.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from reconciler.pipeline.jsonparse import MAX_DEPTH, MAX_NAME, MAX_NUMBER

# Types whose Arrow cast to string is the rules' text for that JSON value.
_AS_TEXT = (pa.string(), pa.int64(), pa.bool_(), pa.null())
# After this many batches in a row with nothing read here, a parser stops trying: a source
# whose fields are objects should not pay pyarrow's parse as well.
_GIVE_UP_AFTER = 3
_READS = 64  # pyarrow parses per batch, retries included; past them the rest goes to Python
# A number longer than MAX_NUMBER: a run of that many number characters, found with
# bytes.translate and a substring search (memchr-fast, unlike a regex over the batch).
_NUMBER_CHARS = bytes(1 if c in b"-+0123456789.eE" else 0 for c in range(256))
_LONG_RUN = b"\x01" * (MAX_NUMBER + 1)
# pyarrow's error when a record contradicts a column's type, and the JSON kinds it names
# that a read field may have (a "number" that is not an integer fails the int64 parse).
_CHANGED = re.compile(r"Column\((/.*)\) changed from (?:\w+) to (\w+) in row")
_CHANGED_FROM = re.compile(r"Column\(/(.*)\) changed from (\w+) to \w+ in row")
_ROW = re.compile(r" in row (\d+)$")
_KINDS = {"string": pa.string(), "number": pa.int64(), "boolean": pa.bool_()}
_LEARN_READS = 5
# Non-numeric numbers pyarrow reads and the rules reject: -NaN, Inf and -Inf, as a value:
# after ":", "[" or ",", up to a delimiter (inside a string such text only costs the
# record the bulk path). RE2 syntax: pyarrow's match_substring_regex.
_ODD_NON_NUMERIC = r"[:\[,][ \t]*(?:-NaN|-?Inf)[ \t,\]}]"


@dataclass(frozen=True)
class BulkFields:
    """One string array per field (the rules' text; null where not ``exact``) and ``exact``
    (bool): the record was read here. A null value is never exact."""

    texts: tuple[pa.Array, ...]
    exact: pa.Array


class _Refused(Exception):
    """pyarrow could not read the candidates; ``row`` names the record when it knows."""

    def __init__(self, row: int | None):
        super().__init__(row)
        self.row = row


class _Again(Exception):
    """Read the same records again (the schema learnt from this read is better)."""


class FieldParser:
    """Parses the named top-level fields of batches of JSON values (one per Spark task).
    ``numeric``: the fields read only as doubles (a float column is fine there)."""

    def __init__(self, fields: Sequence[str], numeric: Sequence[str] = ()):
        self.fields = list(fields)
        self.numeric = set(numeric)
        self._schema: pa.Schema | None = None
        self._misses = 0
        self._reads = 0

    def none(self, n: int) -> BulkFields:
        return BulkFields(
            tuple(pa.nulls(n, pa.string()) for _ in self.fields), pa.repeat(pa.scalar(False), n)
        )

    def parse(self, values: pa.Array) -> BulkFields:
        """The fields of ``values`` (binary) that pyarrow reads exactly."""
        n = len(values)
        if values.null_count == n or self._misses >= _GIVE_UP_AFTER:
            return self.none(n)  # tombstones only teach nothing
        text, candidate = _candidates(values)
        self._reads = 0
        parts = self._parse_rows(text, pc.indices_nonzero(candidate))
        if not parts:
            self._misses += 1
            return self.none(n)
        index = pa.concat_arrays([p[0] for p in parts])
        texts = [pa.concat_arrays([p[1][i] for p in parts]) for i in range(len(self.fields))]
        out = _scatter(n, index, texts, pa.concat_arrays([p[2] for p in parts]))
        # A batch with nothing read here counts as a miss too (a field of objects under a
        # dimension): past a few in a row, stop paying for the parse.
        self._misses = 0 if out.exact.true_count else self._misses + 1
        return out

    def _parse_rows(self, text: pa.Array, index: pa.Array) -> list[tuple[pa.Array, list[pa.Array], pa.Array]]:
        """``(rows, texts, exact)`` parts for the records ``index`` of ``text``. pyarrow
        stops at the first record it cannot read and names it: that one is Python's, the
        records before it are read again on their own (they read fine) and those after it
        go on, so a batch costs about two parses whatever the number of odd records. Where
        an error names none, each half is read on its own. At most ``_READS`` parses."""
        parts: list[tuple[pa.Array, list[pa.Array], pa.Array]] = []
        while len(index) and self._reads < _READS:
            try:
                # ``index`` is sorted and distinct: as long as ``text``, it is all of it (the
                # clean batch), and a copy of every value would be for nothing
                texts, good = self._read_some(text if len(index) == len(text) else text.take(index))
            except _Again:
                continue
            except _Refused as refused:
                row = refused.row
                if row is not None and 0 <= row < len(index):
                    if row:
                        parts += self._parse_rows(text, index[:row])
                    index = index[row + 1:]
                    continue
                if len(index) == 1:
                    break
                half = len(index) // 2
                return parts + self._parse_rows(text, index[:half]) + self._parse_rows(text, index[half:])
            parts.append((index, texts, good))
            break
        return parts

    def _json(self, buf: pa.Buffer, read: pj.ReadOptions, schema: pa.Schema | None) -> pa.Table:
        """One pyarrow parse (counted against the batch's ``_READS``): with ``schema``
        (unknown keys ignored) or inferring every field."""
        self._reads += 1
        if schema is None:
            options = pj.ParseOptions(unexpected_field_behavior="infer")
        else:
            options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        return pj.read_json(pa.BufferReader(buf), read_options=read, parse_options=options)

    def _read_some(self, text: pa.Array) -> tuple[list[pa.Array], pa.Array]:
        """The fields of ``text`` (each a candidate), and which records they hold exactly."""
        n = len(text)
        joined = pc.binary_join(pa.ListArray.from_arrays(pa.array([0, n], pa.int32()), text), "\n")
        buf = joined[0].as_buffer()
        table = self._read(buf)
        if table.num_rows != n:
            raise _Refused(None)
        names = set(table.column_names)
        good = pa.repeat(pa.scalar(True), n)
        out: list[pa.Array] = []
        for name in self.fields:
            if name not in names:
                out.append(pa.nulls(n, pa.string()))
                continue
            col = table.column(name).combine_chunks()
            if col.type in _AS_TEXT:
                out.append(col.cast(pa.string()))
            elif pa.types.is_timestamp(col.type) and self._reads < _READS:
                raise _Again()  # the next read is explicit, with this field as a string
            elif col.type == pa.float64() and name in self.numeric:
                # NaN, Infinity (and beyond a double) are null under a field, as in Python.
                finite = pc.is_finite(col)
                text = pc.if_else(finite, col, pa.scalar(None, pa.float64())).cast(pa.string())
                # -0.0 here is the integer -0 (the rules' 0) or a fraction -0.0 (-0.0):
                # pyarrow's column cannot tell them apart, Python can.
                good = pc.and_(good, pc.invert(pc.equal(text, "-0").fill_null(False)))
                out.append(text)
            else:  # the records with a value here are the Python parser's
                good = pc.and_(good, col.is_null())
                out.append(pa.nulls(n, pa.string()))
        return out, good

    def _read(self, buf: pa.Buffer) -> pa.Table:
        read = pj.ReadOptions(use_threads=False, block_size=buf.size + 1)
        if self._schema is not None:
            try:
                return self._json(buf, read, self._schema)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                if not _CHANGED.search(str(exc)):
                    raise _Refused(_row_of(exc)) from None  # a record's own fault
        try:
            table = self._json(buf, read, None)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            changed = _CHANGED_FROM.search(str(exc))
            if changed is None or changed.group(1) in self.fields:
                # A record's own fault, or a read field of two types: the record named is
                # the first that contradicts the records before it, the odd one out.
                raise _Refused(_row_of(exc)) from None
            return self._learn(buf, read, changed)
        self._schema = _next_schema(table.schema, self.fields)
        return table

    def _learn(self, buf: pa.Buffer, read: pj.ReadOptions, hint: re.Match[str] | None) -> pa.Table:
        """Find the read fields' types with explicit schemas (unknown keys ignored) when
        inference failed, which it does when any field, read or not, has two types in the
        batch. pyarrow's error names the read field whose type a record contradicts; each
        field is given each type at most once, starting from the types remembered from the
        last batch (else strings; the field inference stopped at (``hint``) with the type
        of the records before), for at most ``_LEARN_READS`` parses. A parse that
        succeeds proves every read value has its declared type. A read field of two types
        refuses the first record that contradicted the type it started from (Python's)."""
        kind_of = {t: k for k, t in _KINDS.items()}
        known = {f.name: f.type for f in self._schema} if self._schema is not None else {}
        types = {n: known[n] if known.get(n) in kind_of else pa.string() for n in self.fields}
        if hint is not None and hint.group(1) in types and hint.group(2) in _KINDS:
            types[hint.group(1)] = _KINDS[hint.group(2)]
        tried = {(name, kind_of[t]) for name, t in types.items()}
        row: int | None = None
        first_row: dict[str, int | None] = {}  # the first record that contradicted a field
        for _ in range(_LEARN_READS):
            if self._reads >= _READS:
                break
            schema = pa.schema([pa.field(n, types[n]) for n in self.fields])
            try:
                table = self._json(buf, read, schema)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                row = _row_of(exc)
                changed = _CHANGED.search(str(exc))
                if changed is None or changed.group(2) not in _KINDS:
                    break
                name = changed.group(1)[1:]  # "/ts" -> "ts"
                if name not in types or (name, changed.group(2)) in tried:
                    # a read field of two types: the first record that broke the types it
                    # started from is the odd one out
                    row = first_row.get(name, row)
                    break
                first_row.setdefault(name, row)
                tried.add((name, changed.group(2)))
                types[name] = _KINDS[changed.group(2)]
                continue
            self._schema = schema
            return table
        raise _Refused(row)  # the types learnt last time stay: this batch proved none


def _row_of(exc: Exception) -> int | None:
    found = _ROW.search(str(exc))
    return int(found.group(1)) if found else None


def _candidates(values: pa.Array) -> tuple[pa.Array, pa.Array]:
    """``(text, candidate)``: the values as strings (invalid UTF-8 as empty) and which of
    them pyarrow may read exactly (the module's cheap checks)."""
    try:
        text = values.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # find the invalid ones (rare): Python
        text = pa.array([_utf8_or_empty(v) for v in values.to_pylist()], pa.string())
    ok = pc.and_(pc.starts_with(text, "{"), pc.ends_with(text, "}")).fill_null(False)
    # One search over all the bytes first (memchr-fast): the per-record searches are
    # ten times slower and needed only where the bytes hold something suspicious.
    raw = _data(text)
    for odd in (b"\n", b"\r"):
        if odd in raw:
            ok = pc.and_(ok, pc.invert(pc.match_substring(text, odd.decode())))
    # a one-byte search is memchr's (SIMD); a longer needle's scan cost 0.09 CPU-s per 1M
    # records of 100 bytes, so it runs only where the byte it needs is there at all
    if (b"I" in raw and b"Inf" in raw) or (b"N" in raw and b"-NaN" in raw):
        ok = pc.and_(ok, pc.invert(pc.match_substring_regex(text, _ODD_NON_NUMERIC)))
    ok = ok.fill_null(False)
    lengths = pc.binary_length(text)
    if (pc.max(lengths).as_py() or 0) > MAX_NUMBER:
        # Conservatively within the limits: brackets counted, not nesting measured (only
        # in a value long enough to open and close MAX_DEPTH of them); a key can be no
        # longer than its value; a run of number characters cannot span two records.
        ok = pc.and_(ok, pc.less_equal(lengths, MAX_NAME))
        deep = pc.greater_equal(lengths, 2 * MAX_DEPTH)
        if pc.any(deep).as_py():
            brackets = pc.add(pc.count_substring(text, "{"), pc.count_substring(text, "["))
            ok = pc.and_(ok, pc.invert(pc.and_(deep, pc.greater_equal(brackets, MAX_DEPTH))))
        if _LONG_RUN in raw.translate(_NUMBER_CHARS):
            ok = pc.and_(ok, pa.array([v is None or _LONG_RUN not in v.translate(_NUMBER_CHARS)
                                       for v in values.to_pylist()], pa.bool_()))
        ok = ok.fill_null(False)
    return text, ok


def _data(text: pa.Array) -> bytes:
    """The bytes of a string array's values (of a slice: of its whole buffer, which can
    only add suspicion)."""
    data = text.buffers()[2]
    return data.to_pybytes() if data is not None else b""


def _utf8_or_empty(v: bytes | None) -> str | None:
    if v is None:
        return None
    try:
        return v.decode("utf-8")
    except UnicodeDecodeError:
        return ""  # not a candidate: the Python parser replaces its invalid bytes


def _scatter(n: int, index: pa.Array, texts: list[pa.Array], good: pa.Array) -> BulkFields:
    """The candidates' results (rows ``index`` of ``n``) spread back over the records."""
    if len(index) == n:  # every record a candidate (the clean batch): nothing to spread
        if good.false_count == 0:
            return BulkFields(tuple(texts), good)
        none = pa.scalar(None, pa.string())
        return BulkFields(tuple(pc.if_else(good, t, none) for t in texts), good)
    idx = index.to_numpy()
    pos = np.zeros(n, dtype=np.int64)
    pos[idx] = np.arange(len(idx))
    hit = np.zeros(n, dtype=bool)
    hit[idx] = True
    positions = pa.array(pos, mask=~hit)
    exact = pc.fill_null(pc.take(good, positions), False)
    none = pa.scalar(None, pa.string())
    return BulkFields(tuple(pc.if_else(exact, pc.take(t, positions), none) for t in texts), exact)


def _next_schema(inferred: pa.Schema, fields: Sequence[str]) -> pa.Schema:
    """The explicit schema for the next batch: what this one had, a field pyarrow read as
    a timestamp as a string (so its text comes through next time), an absent one as null."""
    out = []
    for name in fields:
        idx = inferred.get_field_index(name)
        kind = inferred.field(idx).type if idx >= 0 else pa.null()
        if pa.types.is_timestamp(kind):
            kind = pa.string()
        out.append(pa.field(name, kind))
    return pa.schema(out)
